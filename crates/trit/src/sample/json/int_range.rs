//! `minimum`/`maximum` (and their exclusive forms) and `multipleOf` of an integer, checked
//! digit by digit: a digit is accepted only while some continuation of the number (up to the
//! 18 digits an integer may have) still lands on a multiple inside the range, and the number
//! may end only on one.

/// Largest magnitude an integer may have (18 digits).
const LIMIT: i128 = 999_999_999_999_999_999;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IntRange {
    pub(crate) lo: i128,
    pub(crate) hi: i128,
    /// `multipleOf` (1: any integer).
    pub(crate) step: i128,
}

/// Where an integer's text is: its sign and the value and count of the digits so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct IntPrefix {
    pub(crate) neg: bool,
    pub(crate) value: u64,
    pub(crate) digits: u8,
}

/// Whether a multiple of `step` (≥ 1) lies in `[a, b]` (integers and the decimal grid's units
/// alike).
pub(crate) fn multiple_within(a: i128, b: i128, step: i128) -> bool {
    a <= b && b.div_euclid(step) * step >= a
}

impl IntRange {
    /// The range of `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (any may be
    /// absent or fractional), or `None` when no integer satisfies them.
    pub(crate) fn new(
        min: Option<f64>,
        max: Option<f64>,
        ex_min: Option<f64>,
        ex_max: Option<f64>,
    ) -> Option<IntRange> {
        // The least/greatest integer each bound admits (beyond ±1e19 is beyond any integer).
        let int = |x: f64| x.clamp(-1e19, 1e19) as i128;
        let lo = [
            min.map(|m| int(m.ceil())),
            ex_min.map(|m| int(m.floor()) + 1),
        ];
        let hi = [
            max.map(|m| int(m.floor())),
            ex_max.map(|m| int(m.ceil()) - 1),
        ];
        let lo = lo.into_iter().flatten().fold(-LIMIT, i128::max);
        let hi = hi.into_iter().flatten().fold(LIMIT, i128::min);
        (lo <= hi).then_some(IntRange { lo, hi, step: 1 })
    }

    /// The range's integers that are multiples of `step` (≥ 1), or `None` when it has none.
    pub(crate) fn multiples_of(self, step: i128) -> Option<IntRange> {
        let r = IntRange { step, ..self };
        r.meets(r.lo, r.hi).then_some(r)
    }

    /// Whether a multiple of `step` lies in `[a, b]` and in range.
    fn meets(&self, a: i128, b: i128) -> bool {
        multiple_within(a.max(self.lo), b.min(self.hi), self.step)
    }

    /// Whether some completion of `p` (more digits, or none if it has some) is in range. An
    /// integer takes 18 bytes at most, its sign included (the recognizer's limit).
    pub(crate) fn feasible(&self, p: IntPrefix) -> bool {
        let sign = |a: i128, b: i128| if p.neg { (-b, -a) } else { (a, b) };
        let max_digits = 18 - p.neg as u8;
        if p.digits == 0 {
            // Only "-" so far: any negative integer of up to 17 digits ("-0" is not written).
            let (a, b) = sign(1, LIMIT / 10);
            return self.meets(a, b);
        }
        if p.value == 0 {
            // "0": JSON allows no digit after a leading zero.
            return self.meets(0, 0);
        }
        let v = p.value as i128;
        let mut scale: i128 = 1;
        for _ in p.digits..=max_digits {
            let (a, b) = sign(v * scale, v * scale + scale - 1);
            if self.meets(a, b) {
                return true;
            }
            scale *= 10;
        }
        false
    }

    /// Whether the integer as it stands is in range.
    pub(crate) fn contains(&self, p: IntPrefix) -> bool {
        let v = if p.neg {
            -(p.value as i128)
        } else {
            p.value as i128
        };
        p.digits > 0 && self.lo <= v && v <= self.hi && v % self.step == 0
    }
}

impl IntPrefix {
    pub(crate) fn start(first: u8) -> IntPrefix {
        match first {
            b'-' => IntPrefix {
                neg: true,
                value: 0,
                digits: 0,
            },
            d => IntPrefix {
                neg: false,
                value: (d - b'0') as u64,
                digits: 1,
            },
        }
    }

    pub(crate) fn push(self, d: u8) -> IntPrefix {
        IntPrefix {
            value: self.value * 10 + (d - b'0') as u64,
            digits: self.digits + 1,
            ..self
        }
    }
}
