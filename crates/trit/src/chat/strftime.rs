//! `strftime_now(format)` for chat templates (Llama 3.x and others print today's date in the
//! system prompt). Time is UTC: a library cannot know the user's zone without a time-zone
//! database, and a date in UTC is what servers usually want anyway.

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time split into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32, // 0 = Monday
    yday: u32,    // 1..=366
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap_shift = u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 3).rem_euclid(7) as u32,
        yday: cumulative[month as usize - 1] + day + leap_shift,
    }
}

/// Formats `unix` seconds (UTC) with C `strftime` directives: `%Y %y %m %d %e %H %I %M %S %p
/// %b %h %B %a %A %j %Z %z %F %T %D %%`, and glibc's `%-d`-style unpadded variants.
pub fn format_utc(unix: i64, fmt: &str) -> Result<String, String> {
    let t = civil(unix);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next().ok_or("format ends with a lone '%'")?;
        let unpadded = spec == '-';
        if unpadded {
            spec = chars.next().ok_or("format ends with '%-'")?;
        }
        let num = |v: i64, width: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let piece = match spec {
            'Y' => t.year.to_string(),
            'y' => num(t.year.rem_euclid(100), 2),
            'm' => num(t.month.into(), 2),
            'd' => num(t.day.into(), 2),
            'e' => format!("{:>2}", t.day),
            'H' => num(t.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'M' => num(t.minute.into(), 2),
            'S' => num(t.second.into(), 2),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_string(),
            'j' => num(t.yday.into(), 3),
            'B' => MONTHS[t.month as usize - 1].to_string(),
            'b' | 'h' => MONTHS[t.month as usize - 1][..3].to_string(),
            'A' => WEEKDAYS[t.weekday as usize].to_string(),
            'a' => WEEKDAYS[t.weekday as usize][..3].to_string(),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'D' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            '%' => "%".to_string(),
            other => return Err(format!("unsupported strftime directive '%{other}'")),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // Expected values: `date -u -d @SECONDS +FORMAT` (GNU date).
        assert_eq!(
            format_utc(0, "%Y-%m-%d %H:%M:%S %a %j").unwrap(),
            "1970-01-01 00:00:00 Thu 001"
        );
        // 2024-02-29 13:05:09 UTC, a leap day.
        assert_eq!(
            format_utc(1_709_211_909, "%d %b %Y, %A %B %-d %I:%M %p, day %j").unwrap(),
            "29 Feb 2024, Thursday February 29 01:05 PM, day 060"
        );
        // 2000-12-31 23:59:59 UTC: day 366 of a leap century year.
        assert_eq!(
            format_utc(978_307_199, "%F %T %j %y %e").unwrap(),
            "2000-12-31 23:59:59 366 00 31"
        );
        // Before the epoch: 1969-12-31 23:59:59 was a Wednesday.
        assert_eq!(format_utc(-1, "%D %a %%").unwrap(), "12/31/69 Wed %");
    }

    #[test]
    fn bad_directives_are_errors() {
        assert!(format_utc(0, "%Q").is_err());
        assert!(format_utc(0, "50%").is_err());
    }
}
