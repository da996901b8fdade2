//! The sink's configuration: the manifest's `[config]` table, checked once in
//! `init` and kept for the instance's single `deliver` call.
//!
//! Every error names the offending key and says what a valid value looks
//! like. None ever repeats the value of `secret` or `previous-secret`, and
//! none repeats `url` either, since URLs often carry tokens in their query.

use std::time::Duration;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use outboxd_sink::config::Table;
use outboxd_sink::http::Url;

/// The Standard Webhooks signing key: the secret's decoded bytes, which
/// the host's HMAC-SHA-256 takes (`outboxd_sink::sign`).
pub type SigningKey = Vec<u8>;

/// Requests in flight at once when `max-concurrency` is not set.
pub const DEFAULT_MAX_CONCURRENCY: u64 = 32;
/// Upper bound for `max-concurrency` (the SDK's, from the host's resource
/// table cap).
pub const MAX_MAX_CONCURRENCY: u64 = outboxd_sink::pending::MAX_IN_FLIGHT;
/// Connect, first-byte and between-bytes timeout when `timeout-ms` is not set,
/// in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Upper bound for `timeout-ms` (the SDK's: 10 minutes, the WASI default).
pub const MAX_TIMEOUT_MS: u64 = outboxd_sink::pending::MAX_TIMEOUT_MS;

/// Prefix of a Standard Webhooks secret (`whsec_<base64>`).
const SECRET_PREFIX: &str = "whsec_";

/// Base64 with the standard alphabet, padding optional: secrets are pasted
/// by hand and often lose their trailing `=`.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

const KNOWN_KEYS: [&str; 6] = [
    "url",
    "secret",
    "previous-secret",
    "payload",
    "max-concurrency",
    "timeout-ms",
];

/// The parsed `[config]` table.
#[derive(Clone)]
pub struct Config {
    /// Where every event is POSTed (`url`).
    pub target: Url,
    /// What is sent and how it is signed (`payload`, `secret`,
    /// `previous-secret`).
    pub payload: Payload,
    /// Most requests in flight at once (`max-concurrency`), at least 1.
    pub max_concurrency: usize,
    /// Connect, first-byte and between-bytes timeout (`timeout-ms`).
    pub timeout: Duration,
}

/// The request format, `payload = "cloudevents"` (the default) or
/// `"awareness"`.
#[derive(Clone)]
pub enum Payload {
    /// The event's data in the CloudEvents HTTP binary binding, signed per
    /// Standard Webhooks with `key`, and also with `previous` while a
    /// rotation keeps the old secret valid.
    CloudEvents {
        key: SigningKey,
        previous: Option<SigningKey>,
    },
    /// The awareness service's subscription body and headers; signed
    /// (`x-aaas-signature`) with the secret's own bytes when one is set, as
    /// the service does.
    Awareness { secret: Option<Vec<u8>> },
}

impl Config {
    /// Parses the `[config]` table, name → value, as the host hands it over.
    pub fn parse(entries: &[(String, String)]) -> Result<Config, String> {
        let table = Table::new(entries, &KNOWN_KEYS)?;
        let url = table.required("url", "the http:// or https:// URL to POST events to")?;
        let payload = match table.get("payload").map(str::trim) {
            None | Some("cloudevents") => {
                let secret = table.required(
                    "secret",
                    "the endpoint's signing secret, `whsec_<base64>`",
                )?;
                Payload::CloudEvents {
                    key: parse_secret("secret", secret)?,
                    previous: table
                        .non_empty("previous-secret")
                        .map(|previous| parse_secret("previous-secret", previous))
                        .transpose()?,
                }
            }
            Some("awareness") => {
                // `x-aaas-signature` carries one signature, made with the
                // current secret: a `previous-secret` the host passes during
                // a rotation has no place in it and is not used. The service
                // signs when the secret is truthy in JavaScript: set and not
                // the empty string.
                Payload::Awareness {
                    secret: table
                        .get("secret")
                        .filter(|s| !s.is_empty())
                        .map(|s| s.as_bytes().to_vec()),
                }
            }
            Some(other) => {
                return Err(format!(
                    "config key `payload` must be `cloudevents` (the default) or `awareness`, got `{other}`"
                ))
            }
        };
        let max_concurrency = table.number(
            "max-concurrency",
            1,
            MAX_MAX_CONCURRENCY,
            DEFAULT_MAX_CONCURRENCY,
        )?;
        let timeout_ms = table.number("timeout-ms", 1, MAX_TIMEOUT_MS, DEFAULT_TIMEOUT_MS)?;

        Ok(Config {
            target: parse_url(url)?,
            payload,
            max_concurrency: usize::try_from(max_concurrency).unwrap_or(usize::MAX),
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

/// Decodes a Standard Webhooks secret given as config key `key`: `whsec_`
/// and base64, or bare base64.
fn parse_secret(key: &str, value: &str) -> Result<SigningKey, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err(format!("config key `{key}` is empty: set it to the endpoint's signing secret, `whsec_<base64>`"));
    }
    let encoded = value.strip_prefix(SECRET_PREFIX).unwrap_or(value);
    // The decoder's own error names the offending character and its offset;
    // that would leak part of the secret, so it is not passed on.
    let decoded = SECRET_BASE64.decode(encoded).map_err(|_| {
        format!("config key `{key}` is not valid: expected `whsec_` followed by standard base64")
    })?;
    if decoded.is_empty() {
        return Err(format!("config key `{key}` decodes to an empty key"));
    }
    Ok(decoded)
}

/// Splits an absolute `http://` or `https://` URL into scheme, authority and
/// path-with-query (RFC 3986 §3), refusing what a request could not carry.
fn parse_url(value: &str) -> Result<Url, String> {
    let value = value.trim();
    let (https, rest) = if let Some(rest) = strip_prefix_ignore_case(value, "https://") {
        (true, rest)
    } else if let Some(rest) = strip_prefix_ignore_case(value, "http://") {
        (false, rest)
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
    Ok(Url {
        https,
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

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
        Config::parse(&outboxd_sink::config::entries(pairs))
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn defaults_apply() {
        let config =
            parse(&[("url", "http://127.0.0.1:9090/webhook"), ("secret", SECRET)]).unwrap();
        assert_eq!(config.max_concurrency, 32);
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(
            config.target,
            Url {
                https: false,
                authority: "127.0.0.1:9090".into(),
                path_with_query: "/webhook".into(),
            }
        );
        assert!(matches!(
            config.payload,
            Payload::CloudEvents { previous: None, .. }
        ));
    }

    #[test]
    fn rotation_keeps_a_previous_secret() {
        let config = parse(&[
            ("url", "http://h/"),
            ("secret", SECRET),
            ("previous-secret", "whsec_c2VjcmV0"),
        ])
        .unwrap();
        assert!(matches!(
            config.payload,
            Payload::CloudEvents {
                previous: Some(_),
                ..
            }
        ));
        // `${VAR:-}` of an unset variable: no rotation under way.
        let config = parse(&[
            ("url", "http://h/"),
            ("secret", SECRET),
            ("previous-secret", ""),
        ])
        .unwrap();
        assert!(matches!(
            config.payload,
            Payload::CloudEvents { previous: None, .. }
        ));
        let err = parse(&[
            ("url", "http://h/"),
            ("secret", SECRET),
            ("previous-secret", "whsec_***"),
        ])
        .err()
        .unwrap();
        assert!(
            err.contains("`previous-secret`") && !err.contains("***"),
            "{err}"
        );
    }

    #[test]
    fn awareness_payload_takes_the_raw_secret_or_none() {
        let config = parse(&[
            ("url", "http://h/"),
            ("payload", "awareness"),
            ("secret", "whsec_not base64 here"),
        ])
        .unwrap();
        match config.payload {
            Payload::Awareness { secret } => {
                assert_eq!(secret.as_deref(), Some(&b"whsec_not base64 here"[..]))
            }
            _ => panic!("awareness payload expected"),
        }
        for entries in [
            &[("url", "http://h/"), ("payload", "awareness")][..],
            &[
                ("url", "http://h/"),
                ("payload", "awareness"),
                ("secret", ""),
            ][..],
        ] {
            match parse(entries).unwrap().payload {
                Payload::Awareness { secret } => assert_eq!(secret, None),
                _ => panic!("awareness payload expected"),
            }
        }
        // During a rotation the host passes the old secret too; the
        // awareness signature is made with the current one alone.
        let config = parse(&[
            ("url", "http://h/"),
            ("payload", "awareness"),
            ("secret", "s"),
            ("previous-secret", SECRET),
        ])
        .unwrap();
        match config.payload {
            Payload::Awareness { secret } => assert_eq!(secret.as_deref(), Some(&b"s"[..])),
            _ => panic!("awareness payload expected"),
        }
        let err = parse(&[("url", "http://h/"), ("payload", "xml"), ("secret", SECRET)])
            .err()
            .unwrap();
        assert!(err.contains("`payload`"), "{err}");
    }

    #[test]
    fn url_forms() {
        let target = |url: &str| parse_url(url).map(|t| (t.https, t.authority, t.path_with_query));
        assert_eq!(
            target("HTTPS://Example.com"),
            Ok((true, "example.com".into(), "/".into()))
        );
        assert_eq!(
            target("http://h?x=1#frag"),
            Ok((false, "h".into(), "/?x=1".into()))
        );
        assert_eq!(
            target("http://[::1]:8080/a/b?c"),
            Ok((false, "[::1]:8080".into(), "/a/b?c".into()))
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
        assert!(parse_secret("secret", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(parse_secret("secret", "whsec_c2VjcmV0").is_ok());
        assert!(parse_secret("secret", "whsec_c2VjcmV0IQ").is_ok());
        assert!(parse_secret("secret", "whsec_").is_err());
    }
}
