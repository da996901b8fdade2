//! The sink's configuration: the manifest's `[config]` table, checked once in
//! `init` and kept for the instance's single `deliver` call.
//!
//! Every error names the offending key; none repeats the value of `secret`
//! or of `url` (URLs often carry tokens).

use std::time::Duration;

use outboxd_sink::config::Table;
use outboxd_sink::http::Url;

/// Requests in flight at once when `max-concurrency` is not set.
pub const DEFAULT_MAX_CONCURRENCY: u64 = 32;
/// Upper bound for `max-concurrency` (the SDK's, from the host's resource
/// table cap).
pub const MAX_MAX_CONCURRENCY: u64 = outboxd_sink::pending::MAX_IN_FLIGHT;
/// Connect, first-byte and between-bytes timeout when `timeout-ms` is not
/// set, in milliseconds: the vault dispatcher's own 5 s.
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
/// Upper bound for `timeout-ms` (the SDK's: 10 minutes, the WASI default).
pub const MAX_TIMEOUT_MS: u64 = outboxd_sink::pending::MAX_TIMEOUT_MS;

/// The path the service takes events on, appended to `url`.
pub const INGEST_PATH: &str = "/ingest";

const KNOWN_KEYS: [&str; 4] = ["url", "secret", "timeout-ms", "max-concurrency"];

/// The parsed `[config]` table.
#[derive(Clone, Debug)]
pub struct Config {
    /// `{url}/ingest`.
    pub ingest: Url,
    /// The `x-ingest-secret` header value.
    pub secret: String,
    /// Connect, first-byte and between-bytes timeout (`timeout-ms`).
    pub timeout: Duration,
    /// Most requests in flight at once (`max-concurrency`), at least 1.
    pub max_concurrency: usize,
}

impl Config {
    /// Parses the `[config]` table, name → value, as the host hands it over.
    pub fn parse(entries: &[(String, String)]) -> Result<Config, String> {
        let table = Table::new(entries, &KNOWN_KEYS)?;
        let url = table.required(
            "url",
            "the awareness service's base URL (http:// or https://); events go to {url}/ingest",
        )?;
        let secret = table.non_empty("secret").ok_or(
            "config key `secret` is required and must not be empty: the service's ingest secret, sent as x-ingest-secret",
        )?;
        if !secret
            .bytes()
            .all(|b| b.is_ascii_graphic() || b == b' ' || b == b'\t')
            || secret.trim() != secret
        {
            return Err("config key `secret` has a character an HTTP header value cannot carry (control, non-ASCII, or surrounding space)".into());
        }
        let timeout_ms = table.number("timeout-ms", 1, MAX_TIMEOUT_MS, DEFAULT_TIMEOUT_MS)?;
        let max_concurrency = table.number(
            "max-concurrency",
            1,
            MAX_MAX_CONCURRENCY,
            DEFAULT_MAX_CONCURRENCY,
        )?;
        Ok(Config {
            ingest: ingest_url(url)?,
            secret: secret.to_string(),
            timeout: Duration::from_millis(timeout_ms),
            max_concurrency: usize::try_from(max_concurrency).unwrap_or(usize::MAX),
        })
    }
}

/// `{url}/ingest`: the base's path kept (a service behind a path prefix),
/// one `/` between. The vault dispatcher resolves `new URL("/ingest", base)`,
/// which drops a base path; for a bare origin both are the same URL.
fn ingest_url(url: &str) -> Result<Url, String> {
    let mut parsed = Url::parse(url.trim()).map_err(|why| format!("config key `url` {why}"))?;
    if parsed.path_with_query.contains('?') {
        return Err(
            "config key `url` must not have a query: it is the base that /ingest is appended to"
                .into(),
        );
    }
    if !parsed.path_with_query.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("config key `url` has a space, control or non-ASCII character in its path: percent-encode it".into());
    }
    let base = parsed.path_with_query.trim_end_matches('/');
    parsed.path_with_query = format!("{base}{INGEST_PATH}");
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
        Config::parse(&outboxd_sink::config::entries(pairs))
    }

    #[test]
    fn ingest_is_appended_to_the_base() {
        for (base, path) in [
            ("http://127.0.0.1:4000", "/ingest"),
            ("http://127.0.0.1:4000/", "/ingest"),
            ("https://aaas.example/api/", "/api/ingest"),
        ] {
            let config = parse(&[("url", base), ("secret", "s3cret")]).unwrap();
            assert_eq!(config.ingest.path_with_query, path, "{base}");
        }
        let config = parse(&[("url", "http://h:1"), ("secret", "s")]).unwrap();
        assert_eq!(config.timeout, Duration::from_millis(5_000));
        assert_eq!(config.max_concurrency, 32);
        assert_eq!(config.ingest.authority, "h:1");
    }

    #[test]
    fn errors_name_the_key_and_hide_the_values() {
        let err = parse(&[("secret", "s")]).unwrap_err();
        assert!(err.contains("`url`"), "{err}");
        let err = parse(&[("url", "http://h/?token=x"), ("secret", "s")]).unwrap_err();
        assert!(err.contains("`url`") && !err.contains("token=x"), "{err}");
        let err = parse(&[("url", "ftp://h/"), ("secret", "s")]).unwrap_err();
        assert!(err.contains("`url`"), "{err}");
        let err = parse(&[("url", "http://h/"), ("secret", "")]).unwrap_err();
        assert!(err.contains("`secret`"), "{err}");
        let err = parse(&[("url", "http://h/"), ("secret", "top\nsecret")]).unwrap_err();
        assert!(err.contains("`secret`") && !err.contains("top"), "{err}");
        let err = parse(&[("url", "http://h/"), ("secret", "s"), ("timeout-ms", "0")]).unwrap_err();
        assert!(err.contains("`timeout-ms`"), "{err}");
        let err = parse(&[("url", "http://h/"), ("secret", "s"), ("colour", "red")]).unwrap_err();
        assert!(err.contains("`colour`"), "{err}");
    }
}
