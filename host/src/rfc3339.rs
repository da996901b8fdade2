//! Points in time as RFC 3339 text (RFC 3339 §5.6, UTC, `Z`) and back, in
//! Unix milliseconds — the one place the daemon formats or parses a time
//! it shows or is given outside the CloudEvents `time` attribute (which
//! `crate::event` checks by its own rules).
//!
//! Owns: [`format_ms`], [`parse_ms`]. Must never: read a clock, or import
//! anything of ours (ground floor).

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `ms` (Unix milliseconds) as RFC 3339 UTC, e.g.
/// `2026-12-02T07:10:00.123Z`. A value outside the representable range
/// (about ±9999 years) is written as its number.
pub fn format_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// `text` (RFC 3339, any offset) as Unix milliseconds.
///
/// Errors: text that is not an RFC 3339 date-time; the message quotes it
/// and gives an example.
pub fn parse_ms(text: &str) -> Result<i64, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|e| {
            format!("expected an RFC 3339 time (e.g. 2026-01-31T12:00:00Z), got {text:?}: {e}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_goes_there_and_back() {
        let ms = parse_ms("2026-12-02T07:10:00.123+01:00").unwrap();
        assert_eq!(format_ms(ms), "2026-12-02T06:10:00.123Z");
        assert!(parse_ms("2026-12-02 07:10")
            .unwrap_err()
            .contains("RFC 3339"));
    }
}
