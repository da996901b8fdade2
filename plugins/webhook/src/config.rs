//! The sink's configuration: the manifest's `[config]` table, checked once in
//! `init` and kept for the instance's single `deliver` call.
//!
//! Every error names the offending key and says what a valid value looks
//! like. None ever repeats the value of `secret`, and none repeats `url`
//! either, since URLs often carry tokens in their query.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, KeyInit};
use sha2::Sha256;

/// The Standard Webhooks signing key, ready to sign (cloned per message).
pub type SigningKey = Hmac<Sha256>;

/// Requests in flight at once when `max-concurrency` is not set.
pub const DEFAULT_MAX_CONCURRENCY: u64 = 32;
/// Upper bound for `max-concurrency`: each request in flight holds about five
/// host resources, and the host caps the resource table.
pub const MAX_MAX_CONCURRENCY: u64 = 1024;
/// Connect, first-byte and between-bytes timeout when `timeout-ms` is not set,
/// in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Upper bound for `timeout-ms` (10 minutes, the WASI default when unset).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// Prefix of a Standard Webhooks secret (`whsec_<base64>`).
const SECRET_PREFIX: &str = "whsec_";

/// Base64 with the standard alphabet, padding optional: secrets are pasted
/// by hand and often lose their trailing `=`.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

const KNOWN_KEYS: &str = "url, secret, max-concurrency, timeout-ms";

/// The parsed `[config]` table.
#[derive(Clone)]
pub struct Config {
    /// Where every event is POSTed.
    pub target: Target,
    /// HMAC-SHA256 keyed with the decoded secret.
    pub key: SigningKey,
    /// Most requests in flight at once (`max-concurrency`), at least 1.
    pub max_concurrency: usize,
    /// Connect, first-byte and between-bytes timeout (`timeout-ms`), in
    /// nanoseconds as `wasi:http` wants it.
    pub timeout_ns: u64,
}

/// `http` or `https`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// The parts of `url` that an outgoing request is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    /// `host[:port]`, no userinfo.
    pub authority: String,
    /// Path and query, at least `/`; any `#fragment` dropped.
    pub path_with_query: String,
}

impl Config {
    /// Parses the `[config]` table, name → value, as the host hands it over.
    pub fn parse(entries: &[(String, String)]) -> Result<Config, String> {
        let mut url = None;
        let mut secret = None;
        let mut max_concurrency = None;
        let mut timeout_ms = None;
        for (key, value) in entries {
            let slot = match key.as_str() {
                "url" => &mut url,
                "secret" => &mut secret,
                "max-concurrency" => &mut max_concurrency,
                "timeout-ms" => &mut timeout_ms,
                other => {
                    return Err(format!(
                        "unknown config key `{other}` (known: {KNOWN_KEYS})"
                    ))
                }
            };
            if slot.replace(value.as_str()).is_some() {
                return Err(format!("config key `{key}` is given more than once"));
            }
        }

        let url = url
            .ok_or("config key `url` is required: the http:// or https:// URL to POST events to")?;
        let secret = secret.ok_or(
            "config key `secret` is required: the endpoint's signing secret, `whsec_<base64>`",
        )?;
        let max_concurrency = match max_concurrency {
            Some(value) => number("max-concurrency", value, 1, MAX_MAX_CONCURRENCY)?,
            None => DEFAULT_MAX_CONCURRENCY,
        };
        let timeout_ms = match timeout_ms {
            Some(value) => number("timeout-ms", value, 1, MAX_TIMEOUT_MS)?,
            None => DEFAULT_TIMEOUT_MS,
        };

        Ok(Config {
            target: parse_url(url)?,
            key: parse_secret(secret)?,
            max_concurrency: usize::try_from(max_concurrency).unwrap_or(usize::MAX),
            timeout_ns: timeout_ms.saturating_mul(1_000_000),
        })
    }
}

/// A whole number within `min..=max`.
fn number(key: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "config key `{key}` must be a whole number from {min} to {max}, got `{value}`"
        )),
    }
}

/// Decodes a Standard Webhooks secret: `whsec_` and base64, or bare base64.
fn parse_secret(value: &str) -> Result<SigningKey, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("config key `secret` is empty: set it to the endpoint's signing secret, `whsec_<base64>`".into());
    }
    let encoded = value.strip_prefix(SECRET_PREFIX).unwrap_or(value);
    // The decoder's own error names the offending character and its offset;
    // that would leak part of the secret, so it is not passed on.
    let key = SECRET_BASE64.decode(encoded).map_err(|_| {
        "config key `secret` is not valid: expected `whsec_` followed by standard base64"
            .to_string()
    })?;
    if key.is_empty() {
        return Err("config key `secret` decodes to an empty key".into());
    }
    SigningKey::new_from_slice(&key)
        .map_err(|_| "config key `secret` is not usable as an HMAC-SHA256 key".to_string())
}

/// Splits an absolute `http://` or `https://` URL into scheme, authority and
/// path-with-query (RFC 3986 §3), refusing what a request could not carry.
fn parse_url(value: &str) -> Result<Target, String> {
    let value = value.trim();
    let (scheme, rest) = if let Some(rest) = strip_prefix_ignore_case(value, "https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = strip_prefix_ignore_case(value, "http://") {
        (Scheme::Http, rest)
    } else {
        return Err("config key `url` must start with http:// or https://".into());
    };
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    check_authority(authority)?;
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("config key `url` has a space, control or non-ASCII character in its path or query: percent-encode it".into());
    }
    let path_with_query = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok(Target {
        scheme,
        authority: authority.to_ascii_lowercase(),
        path_with_query,
    })
}

/// `host[:port]` with a registered name, IPv4 address or bracketed IPv6
/// address, and an optional port from 1 to 65535.
fn check_authority(authority: &str) -> Result<(), String> {
    if authority.is_empty() {
        return Err("config key `url` has no host".into());
    }
    if authority.contains('@') {
        return Err("config key `url` must not carry credentials (`user:password@`)".into());
    }
    let (host, port) = if authority.starts_with('[') {
        match authority.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, rest)) => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(
                    "config key `url` has an IPv6 host followed by something other than `:port`"
                        .into(),
                ),
            },
            None => return Err("config key `url` has an unclosed `[` in its host".into()),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host_ok = host.len() > usize::from(host.starts_with('['))
        && host.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_alphanumeric()
                || b"-._~%!$&'()*+,;=".contains(&b)
                || (host.starts_with('[') && (b == b':' || (i == 0 && b == b'[')))
        });
    if !host_ok {
        return Err(
            "config key `url` has an empty or malformed host (an IPv6 address needs brackets)"
                .into(),
        );
    }
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|p| p != 0);
        if !valid {
            return Err("config key `url` has a port that is not a number from 1 to 65535".into());
        }
    }
    Ok(())
}

fn strip_prefix_ignore_case<'a>(value: &'a str, prefix: &str) -> Option<&'a str> {
    let head = value.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &value[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[(&str, &str)]) -> Result<Config, String> {
        let entries: Vec<(String, String)> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(&entries)
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn defaults_apply() {
        let config =
            parse(&[("url", "http://127.0.0.1:9090/webhook"), ("secret", SECRET)]).unwrap();
        assert_eq!(config.max_concurrency, 32);
        assert_eq!(config.timeout_ns, 10_000_000_000);
        assert_eq!(
            config.target,
            Target {
                scheme: Scheme::Http,
                authority: "127.0.0.1:9090".into(),
                path_with_query: "/webhook".into(),
            }
        );
    }

    #[test]
    fn url_forms() {
        let target = |url: &str| parse_url(url).map(|t| (t.scheme, t.authority, t.path_with_query));
        assert_eq!(
            target("HTTPS://Example.com"),
            Ok((Scheme::Https, "example.com".into(), "/".into()))
        );
        assert_eq!(
            target("http://h?x=1#frag"),
            Ok((Scheme::Http, "h".into(), "/?x=1".into()))
        );
        assert_eq!(
            target("http://[::1]:8080/a/b?c"),
            Ok((Scheme::Http, "[::1]:8080".into(), "/a/b?c".into()))
        );
        for bad in [
            "ftp://h/",
            "http://",
            "http://u:p@h/",
            "http://h:0/",
            "http://h:x/",
            "http://::1/",
            "http://h/a b",
            "http://[::1/",
            "http://h:/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn errors_name_the_key_and_hide_the_secret() {
        let err = parse(&[("url", "http://h/"), ("secret", "whsec_not*base64")])
            .err()
            .unwrap();
        assert!(
            err.contains("`secret`") && !err.contains("not*base64"),
            "{err}"
        );
        let err = parse(&[("url", "http://h/"), ("secret", SECRET), ("colour", "red")])
            .err()
            .unwrap();
        assert!(err.contains("`colour`"), "{err}");
        let err = parse(&[("secret", SECRET)]).err().unwrap();
        assert!(err.contains("`url`"), "{err}");
        let err = parse(&[
            ("url", "http://h/"),
            ("secret", SECRET),
            ("max-concurrency", "0"),
        ])
        .err()
        .unwrap();
        assert!(err.contains("`max-concurrency`"), "{err}");
        let err = parse(&[
            ("url", "http://h/"),
            ("secret", SECRET),
            ("timeout-ms", "soon"),
        ])
        .err()
        .unwrap();
        assert!(err.contains("`timeout-ms`"), "{err}");
        let err = parse(&[("url", "http://h/"), ("secret", "")])
            .err()
            .unwrap();
        assert!(err.contains("`secret`"), "{err}");
    }

    #[test]
    fn secret_without_prefix_or_padding() {
        assert!(parse_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(parse_secret("whsec_c2VjcmV0").is_ok());
        assert!(parse_secret("whsec_c2VjcmV0IQ").is_ok());
        assert!(parse_secret("whsec_").is_err());
    }
}
