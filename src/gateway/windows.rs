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
