//! `minimum`/`maximum` (and their exclusive forms) and `multipleOf` of a number, checked byte
//! by byte and exactly. A bounded number is written without an exponent, with at most 17
//! integer and 18 fraction digits, so every value its text can still become lies on the grid
//! of multiples of 10^-18, and so do the bounds and the divisor (at most 18 decimals): values,
//! bounds and divisor compare as integers in units of 10^-18 (i128), with no rounding anywhere.

use super::int_range::multiple_within;

/// Units per 1 (fraction digits of the grid).
const ONE: i128 = 1_000_000_000_000_000_000;
pub(crate) const MAX_INT_DIGITS: u8 = 17;
pub(crate) const MAX_FRAC_DIGITS: u8 = 18;
/// The largest magnitude a bounded number's text can reach, in units: 17 nines and 18.
const REACH: i128 = 100_000_000_000_000_000 * ONE - 1;

/// The admitted values, inclusive, in units of 10^-18.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DecRange {
    lo: i128,
    hi: i128,
    /// `multipleOf` in units (1: any value of the grid).
    step: i128,
}

/// Where a bounded number's text is: sign, integer digits, and after a `.` the fraction
/// digits so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct DecPrefix {
    neg: bool,
    int: u64,
    int_digits: u8,
    dot: bool,
    frac: u64,
    frac_digits: u8,
}

/// A bound in units: `Ok(None)` for one beyond what any text reaches (it bounds nothing, or
/// everything away: the caller tells by its side), `Err` for more decimals than the grid has.
fn units(x: f64) -> Result<Option<i128>, String> {
    if !x.is_finite() {
        return Err(format!("the bound {x} is not a finite number"));
    }
    if x.abs() >= 1e17 {
        return Ok(None);
    }
    // Rust prints an f64 as the shortest decimal that reads back to it, without an exponent:
    // the number as the schema's author wrote it (0.1 stays 0.1).
    let text = format!("{}", x.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    if frac.len() > MAX_FRAC_DIGITS as usize {
        return Err(format!(
            "the bound {x} has more than {MAX_FRAC_DIGITS} decimals"
        ));
    }
    let digits = |s: &str| s.bytes().fold(0i128, |v, d| v * 10 + (d - b'0') as i128);
    let frac_units = digits(frac) * 10i128.pow(MAX_FRAC_DIGITS as u32 - frac.len() as u32);
    let v = digits(int) * ONE + frac_units;
    Ok(Some(if x < 0.0 { -v } else { v }))
}

impl DecRange {
    /// The range of `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (any may be
    /// absent); `Ok(None)` when no number satisfies them.
    pub(crate) fn new(
        min: Option<f64>,
        max: Option<f64>,
        ex_min: Option<f64>,
        ex_max: Option<f64>,
    ) -> Result<Option<DecRange>, String> {
        let (mut lo, mut hi) = (-REACH, REACH);
        // A bound beyond the reach: harmless on its far side, excludes everything on the near.
        let side = |x: f64, lower: bool| -> Result<i128, String> {
            Ok(match units(x)? {
                Some(u) => u,
                None if (x < 0.0) == lower => {
                    if lower {
                        -REACH - 1
                    } else {
                        REACH + 1
                    }
                }
                None => {
                    if lower {
                        REACH + 1
                    } else {
                        -REACH - 1
                    }
                }
            })
        };
        if let Some(m) = min {
            lo = lo.max(side(m, true)?);
        }
        if let Some(m) = ex_min {
            lo = lo.max(side(m, true)? + 1);
        }
        if let Some(m) = max {
            hi = hi.min(side(m, false)?);
        }
        if let Some(m) = ex_max {
            hi = hi.min(side(m, false)? - 1);
        }
        Ok((lo <= hi).then_some(DecRange { lo, hi, step: 1 }))
    }

    /// The range's multiples of `step` (`multipleOf`, positive): `Ok(None)` when it holds none,
    /// `Err` for a divisor with more decimals than the grid or beyond any text's reach.
    pub(crate) fn multiples_of(self, step: f64) -> Result<Option<DecRange>, String> {
        let step = match units(step)? {
            Some(u) if u > 0 => u,
            _ => {
                return Err(format!(
                    "`multipleOf` {step} is not a positive number below 1e17"
                ))
            }
        };
        let r = DecRange { step, ..self };
        Ok(r.meets(r.lo, r.hi, false).then_some(r))
    }

    /// Whether a multiple of `step` lies in `[a, b]` (negated first with `neg`) and in range.
    fn meets(&self, a: i128, b: i128, neg: bool) -> bool {
        let (a, b) = if neg { (-b, -a) } else { (a, b) };
        multiple_within(a.max(self.lo), b.min(self.hi), self.step)
    }

    /// Whether some completion of `p` (more digits, a fraction, or none) is in range.
    pub(crate) fn feasible(&self, p: DecPrefix) -> bool {
        if p.int_digits == 0 {
            // Only "-" so far: any magnitude.
            return self.meets(0, REACH, p.neg);
        }
        let v = p.int as i128;
        if p.dot {
            let width = 10i128.pow((MAX_FRAC_DIGITS - p.frac_digits) as u32);
            let base = v * ONE + p.frac as i128 * width;
            return self.meets(base, base + width - 1, p.neg);
        }
        if v == 0 {
            // "0": a fraction may follow, no more integer digits.
            return self.meets(0, ONE - 1, p.neg);
        }
        // v, then k more integer digits and any fraction: [v·10^k, (v+1)·10^k) for each k.
        let mut scale: i128 = 1;
        for _ in p.int_digits..=MAX_INT_DIGITS {
            if self.meets(v * scale * ONE, (v + 1) * scale * ONE - 1, p.neg) {
                return true;
            }
            scale *= 10;
        }
        false
    }

    /// Whether the number as it stands (a complete text) is in range.
    pub(crate) fn contains(&self, p: DecPrefix) -> bool {
        let width = 10i128.pow((MAX_FRAC_DIGITS - p.frac_digits) as u32);
        let v = p.int as i128 * ONE + p.frac as i128 * width;
        let v = if p.neg { -v } else { v };
        p.int_digits > 0 && self.lo <= v && v <= self.hi && v % self.step == 0
    }
}

impl DecPrefix {
    /// The prefix after byte `b` (a digit, `-` first, or `.`); `None` where a bounded number
    /// may not take it (an exponent, or more digits than the grid holds).
    pub(crate) fn push(self, b: u8) -> Option<DecPrefix> {
        let mut p = self;
        match b {
            b'-' if self == DecPrefix::default() => p.neg = true,
            b'.' if !self.dot && self.int_digits > 0 => p.dot = true,
            b'0'..=b'9' if self.dot => {
                if self.frac_digits >= MAX_FRAC_DIGITS {
                    return None;
                }
                p.frac = self.frac * 10 + (b - b'0') as u64;
                p.frac_digits += 1;
            }
            b'0'..=b'9' => {
                if self.int_digits >= MAX_INT_DIGITS {
                    return None;
                }
                p.int = self.int * 10 + (b - b'0') as u64;
                p.int_digits += 1;
            }
            _ => return None,
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(text: &str) -> DecPrefix {
        text.bytes()
            .try_fold(DecPrefix::default(), |p, b| p.push(b))
            .unwrap()
    }

    #[test]
    fn bounds_are_exact_on_the_decimal_grid() {
        let r = DecRange::new(Some(0.1), Some(0.3), None, None)
            .unwrap()
            .unwrap();
        assert!(r.contains(prefix("0.1")) && r.contains(prefix("0.3")));
        assert!(r.contains(prefix("0.29999")) && !r.contains(prefix("0.30001")));
        assert!(!r.contains(prefix("0.09999999999999999")));
        let ex = DecRange::new(None, None, Some(0.5), Some(1.0))
            .unwrap()
            .unwrap();
        assert!(!ex.contains(prefix("0.5")) && ex.contains(prefix("0.500000000000000001")));
        assert!(!ex.contains(prefix("1")) && !ex.contains(prefix("1.0")));
        assert!(ex.contains(prefix("0.999999999999999999")));
        // Nothing between: none.
        assert_eq!(DecRange::new(None, None, Some(1.0), Some(1.0)), Ok(None));
        assert!(DecRange::new(Some(1e-19), None, None, None).is_err());
        // Bounds beyond the reach: ignored on the far side, everything on the near.
        assert!(DecRange::new(Some(-1e30), Some(1e30), None, None)
            .unwrap()
            .is_some());
        assert_eq!(DecRange::new(Some(1e30), None, None, None), Ok(None));
    }

    #[test]
    fn a_prefix_is_feasible_exactly_when_a_completion_lands_in_range() {
        let r = DecRange::new(Some(-2.5), Some(12.25), None, None)
            .unwrap()
            .unwrap();
        for (text, want) in [
            ("-", true),
            ("-2", true),
            ("-2.", true),
            ("-2.5", true),
            ("-2.6", false),
            ("-3", false),
            ("-0", true),
            ("0", true),
            ("1", true), // 1, 1.x, 10, 11, 12.x
            ("12.2", true),
            ("12.3", false),
            ("13", false),
            ("2", true),
            ("9", true),
            ("99", false),
            ("100", false),
        ] {
            assert_eq!(r.feasible(prefix(text)), want, "{text}");
        }
        // Large only: "1" leads to 1000 and beyond.
        let big = DecRange::new(Some(1000.5), None, None, None)
            .unwrap()
            .unwrap();
        assert!(big.feasible(prefix("1")) && big.feasible(prefix("1000.")));
        assert!(!big.feasible(prefix("1000.4")) && big.feasible(prefix("1000.5")));
        assert!(!big.feasible(prefix("0")) && !big.feasible(prefix("-")));
    }

    #[test]
    fn bounded_numbers_take_no_exponent_and_at_most_the_grid_s_digits() {
        assert_eq!(prefix("1").push(b'e'), None);
        assert_eq!(prefix("1.").push(b'.'), None);
        assert_eq!(DecPrefix::default().push(b'.'), None);
        assert!(prefix("12345678901234567").push(b'1').is_none());
        assert!(prefix("0.123456789012345678").push(b'1').is_none());
    }
}
