//! Durations on the command line, written as humantime reads them: a number
//! and a unit, repeated: `500ms`, `5s`, `2m`, `1m30s`, `1h 15m`, `2d`.

use std::time::Duration;

/// The longest timeout or delay an option accepts.
pub const MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// A timeout or a delay (`--settle-timeout 1m30s`): at most [`MAX`].
pub fn parse(text: &str) -> Result<Duration, String> {
    let duration = parse_any(text)?;
    if duration > MAX {
        return Err(format!("`{}` is longer than the 24h limit", text.trim()));
    }
    Ok(duration)
}

/// A timeout that must be longer than nothing (`--lease-ttl 2s`): a zero one
/// would expire, or give up, at once.
pub fn parse_nonzero(text: &str) -> Result<Duration, String> {
    let duration = parse(text)?;
    if duration.is_zero() {
        return Err(format!(
            "`{}` is no time at all: give a positive duration, like 500ms or 5s",
            text.trim()
        ));
    }
    Ok(duration)
}

/// An age, as in `settle sessions --since 2h`: any length humantime reads.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    parse_any(text)
}

fn parse_any(text: &str) -> Result<Duration, String> {
    use humantime::DurationError as E;
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!(
            "`{text}` is negative: give a duration of zero or more, like 500ms or 5s"
        ));
    }
    humantime::parse_duration(text).map_err(|error| match error {
        E::Empty => {
            "an empty duration: write a number and a unit, like 500ms, 5s or 1m30s".to_owned()
        }
        E::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("`{text}` has no unit: add one, like {text}ms or {text}s")
        }
        E::UnknownUnit { unit, .. } => {
            format!("`{text}` has an unknown unit `{unit}`: use ms, s, m, h or d, like 1m30s")
        }
        E::NumberOverflow => format!("`{text}` is too large a duration"),
        E::InvalidCharacter(_) | E::NumberExpected(_) => format!(
            "`{text}` is not a duration: write a number and a unit, like 500ms, 5s or 1m30s"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_units_and_their_sums() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h 15m"), Ok(Duration::from_secs(75 * 60)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse(" 24h "), Ok(MAX));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in [
            "",
            "5",
            "-5s",
            "5x",
            "s",
            "1m30",
            "99999999999999999999ms",
            "25h",
            "1441m",
            "2d",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn says_what_is_wrong() {
        assert!(parse("5").unwrap_err().contains("no unit"));
        assert!(parse("5x").unwrap_err().contains("unknown unit `x`"));
        assert!(parse("25h").unwrap_err().contains("24h limit"));
        assert!(parse("-1s").unwrap_err().contains("is negative"));
        assert!(parse_age(" -2h").unwrap_err().contains("is negative"));
    }

    #[test]
    fn a_nonzero_duration_refuses_zero_and_what_parse_refuses() {
        assert_eq!(parse_nonzero("1ms"), Ok(Duration::from_millis(1)));
        assert!(parse_nonzero("0s").unwrap_err().contains("no time at all"));
        assert!(parse_nonzero("0ms").is_err());
        assert!(parse_nonzero("5").unwrap_err().contains("no unit"));
        assert!(parse_nonzero("25h").unwrap_err().contains("24h limit"));
    }

    #[test]
    fn ages_may_be_longer_than_a_day() {
        assert_eq!(parse_age("2d"), Ok(Duration::from_secs(2 * 86_400)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(90 * 60)));
        assert!(parse_age("yesterday").is_err());
    }
}
