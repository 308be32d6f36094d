//! Duration parameters as docs/api.md spells them (`250ms`, `10s`, `5m`, `2h`, `7d`, a bare integer = seconds).
//! Shared by the HTTP edge, the config file and the command line so all three accept the same text.

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(pub String);

/// Largest duration any parameter may carry before range checks (100 years); keeps arithmetic far from overflow.
const MAX_DURATION_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Parses a duration into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, DurationError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() || digits.len() > 15 {
        return Err(DurationError(format!("'{text}' is not a duration")));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| DurationError(format!("'{text}' is not a duration")))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(DurationError(format!("'{text}' has an unknown unit"))),
    };
    match value.checked_mul(unit_ms) {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        _ => Err(DurationError(format!("'{text}' is out of range"))),
    }
}

/// Parses and checks that the value lies in `[min_ms, max_ms]`.
pub fn parse_duration_in(text: &str, min_ms: u64, max_ms: u64) -> Result<u64, DurationError> {
    let ms = parse_duration_ms(text)?;
    if ms < min_ms || ms > max_ms {
        return Err(DurationError(format!(
            "'{text}' is out of range ({} to {})",
            format_ms(min_ms),
            format_ms(max_ms)
        )));
    }
    Ok(ms)
}

/// Formats milliseconds in the largest unit that divides them exactly.
pub fn format_ms(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms != 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_of_the_api_parses() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("12"), Ok(12_000));
        assert_eq!(parse_duration_ms("0"), Ok(0));
    }

    #[test]
    fn malformed_negative_and_huge_durations_are_refused() {
        for bad in [
            "",
            "-1",
            "1.5s",
            "s",
            "10x",
            "10 s",
            "99999999999999999999",
            "1000000000000d",
            "+5",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn range_is_checked() {
        assert!(parse_duration_in("61s", 0, 60_000).is_err());
        assert_eq!(parse_duration_in("60s", 0, 60_000), Ok(60_000));
        assert!(parse_duration_in("500ms", 1000, 60_000).is_err());
    }

    #[test]
    fn formatting_picks_the_exact_unit() {
        assert_eq!(format_ms(30_000), "30s");
        assert_eq!(format_ms(604_800_000), "7d");
        assert_eq!(format_ms(1500), "1500ms");
        assert_eq!(format_ms(0), "0ms");
    }
}
