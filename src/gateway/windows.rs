//! The time windows agents and operators give (`from`, `to`, `since`): RFC 3339 or a date, checked
//! the same way everywhere.

use crate::clock::UnixSecs;
use crate::error::AgentError;
/// Longest summary window (`to - from`).
const SUMMARY_WINDOW_MAX_SECS: i64 = 366 * 86_400;

/// "2026-11-29T10:00:00Z" or "2026-11-29" (start of that UTC day; `end_of_day` gives its end).
pub(crate) fn parse_instant(field: &str, s: &str, end_of_day: bool) -> Result<UnixSecs, AgentError> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t.unix_timestamp());
    }
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    match time::Date::parse(s, &fmt) {
        Ok(d) => {
            let start = d.midnight().assume_utc().unix_timestamp();
            Ok(if end_of_day { start + 86_400 } else { start })
        }
        Err(_) => {
            Err(AgentError::invalid(format!("{field} must be RFC 3339 (2026-11-29T10:00:00Z) or a date (2026-11-29)")))
        }
    }
}

/// Every window an agent gives is checked the same way: `from` before `to`, at most
/// `SUMMARY_WINDOW_MAX_SECS` apart.
fn check_window(from: UnixSecs, to: UnixSecs) -> Result<(), AgentError> {
    if to <= from || to - from > SUMMARY_WINDOW_MAX_SECS {
        return Err(AgentError::invalid("from must be before to, at most 366 days apart"));
    }
    Ok(())
}

/// Optional `from` (inclusive) and `to` (exclusive) arguments: RFC 3339 or a date, a bare `to`
/// date meaning the end of that day. Both given: checked like every window.
pub(crate) fn parse_window(
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(Option<UnixSecs>, Option<UnixSecs>), AgentError> {
    let from = from.map(|s| parse_instant("from", s, false)).transpose()?;
    let to = to.map(|s| parse_instant("to", s, true)).transpose()?;
    if let (Some(f), Some(t)) = (from, to) {
        check_window(f, t)?;
    }
    Ok((from, to))
}

/// A window defaulting to today (UTC): a missing `from` is the start of today, a missing `to` now
/// (inclusive).
pub(crate) fn today_window(
    now: UnixSecs,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(UnixSecs, UnixSecs), AgentError> {
    let (f, t) = parse_window(from, to)?;
    let (from, to) = (f.unwrap_or(now - now.rem_euclid(86_400)), t.unwrap_or(now + 1));
    check_window(from, to)?;
    Ok((from, to))
}

/// `--since` of `paygate reconcile`: RFC 3339 or a date.
pub fn parse_instant_arg(s: &str) -> Result<UnixSecs, String> {
    parse_instant("since", s, false).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    #[test]
    fn a_window_runs_forward_and_spans_at_most_366_days() {
        let from = 1_800_000_000;
        assert!(check_window(from, from + 1).is_ok());
        assert!(check_window(from, from + 366 * DAY).is_ok());
        assert!(check_window(from, from + 366 * DAY + 1).is_err(), "a second past 366 days");
        assert!(check_window(from, from).is_err(), "an empty window");
        assert!(check_window(from, from - DAY).is_err(), "a window running backwards");
    }

    #[test]
    fn the_bound_holds_on_the_dates_agents_give() {
        // A bare `to` date is the end of its day: 2025-01-01 through 2026-01-01 is 366 days.
        let span = |from: &str, to: &str| match parse_window(Some(from), Some(to)) {
            Ok((Some(f), Some(t))) => Ok((t - f) / DAY),
            Ok(_) => Err("both ends given, both parsed".to_string()),
            Err(e) => Err(e.message),
        };
        assert_eq!(span("2025-01-01", "2026-01-01"), Ok(366));
        assert_eq!(span("2025-01-01", "2026-01-02"), Err("from must be before to, at most 366 days apart".into()));
        assert!(today_window(1_800_000_000, Some("2020-01-01"), None).is_err(), "years back to now");
    }
}
