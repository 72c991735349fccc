//! Durations on the command line: a whole number with `ms`, `s` or `m`.

use std::time::Duration;

/// The longest duration an option accepts.
pub const MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses `250ms`, `5s` or `2m`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "`{text}` is not a duration: write a whole number with ms, s or m, like 500ms"
        ));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is too large a duration"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(value),
        "s" => Duration::from_secs(value),
        "m" => Duration::from_secs(value.saturating_mul(60)),
        "" => {
            return Err(format!(
                "`{text}` has no unit: add ms, s or m, like {text}ms"
            ))
        }
        other => {
            return Err(format!(
                "`{text}` has an unknown unit `{other}`: use ms, s or m"
            ))
        }
    };
    if duration > MAX {
        return Err(format!("`{text}` is longer than the 24 h limit"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_three_units() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in [
            "",
            "5",
            "-5s",
            "5h",
            "1.5s",
            "s",
            "99999999999999999999ms",
            "25h",
            "1441m",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
