//! The sink's configuration: the manifest's `[config]` table, checked once
//! in `init`.
//!
//! Every error names the key at fault; none repeats `password`.

/// Conflicting writes (409) in a row on one document before the event is
/// answered `retry` when `max-conflicts` is not set.
pub const DEFAULT_MAX_CONFLICTS: u32 = 10;
/// Connect, first-byte and between-bytes timeout when `timeout-ms` is not
/// set, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

const KNOWN_KEYS: &str = "url, database, username, password, entries, event-id, status, \
                          published, published-at, max-conflicts, timeout-ms";

/// The parsed `[config]` table.
#[derive(Clone, Debug)]
pub struct Config {
    /// `http` or `https`.
    pub https: bool,
    /// `host[:port]`.
    pub authority: String,
    /// Path prefix of the server (empty, or `/couch` behind a proxy), no
    /// trailing slash.
    pub prefix: String,
    /// The database, as a percent-encoded path segment.
    pub database: String,
    /// `Authorization` header value (`Basic …`), when credentials are set.
    pub authorization: Option<String>,
    /// Dotted path of the entry list in a document.
    pub entries: Vec<String>,
    pub event_id: String,
    pub status: String,
    /// The status value written, e.g. `published`.
    pub published: String,
    pub published_at: String,
    pub max_conflicts: u32,
    pub timeout_ns: u64,
}

impl Config {
    /// Parses the `[config]` table.
    pub fn parse(entries: &[(String, String)]) -> Result<Config, String> {
        let mut url = None;
        let mut database = None;
        let mut username = String::new();
        let mut password = String::new();
        let mut path = "extensions._server_outbox".to_string();
        let mut event_id = "event_id".to_string();
        let mut status = "status".to_string();
        let mut published = "published".to_string();
        let mut published_at = "published_at".to_string();
        let mut max_conflicts = DEFAULT_MAX_CONFLICTS;
        let mut timeout_ms = DEFAULT_TIMEOUT_MS;
        for (key, value) in entries {
            match key.as_str() {
                "url" => url = Some(value.clone()),
                "database" => database = Some(value.clone()),
                "username" => username = value.clone(),
                "password" => password = value.clone(),
                "entries" => path = value.clone(),
                "event-id" => event_id = value.clone(),
                "status" => status = value.clone(),
                "published" => published = value.clone(),
                "published-at" => published_at = value.clone(),
                "max-conflicts" => {
                    max_conflicts = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or("max-conflicts: must be a whole number from 1 to 1000")?
                }
                "timeout-ms" => {
                    timeout_ms = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=600_000).contains(n))
                        .ok_or(
                            "timeout-ms: must be a whole number of milliseconds from 1 to 600000",
                        )?
                }
                other => return Err(format!("unknown key `{other}` (known: {KNOWN_KEYS})")),
            }
        }
        let url = url.ok_or("url: required, e.g. http://127.0.0.1:5984")?;
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("url: must start with http:// or https://".into());
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(
                "url: needs a host and no user:password@ (use username and password)".into(),
            );
        }
        if prefix.contains(['?', '#']) {
            return Err("url: must not carry a query or fragment".into());
        }
        let database = database
            .filter(|d| !d.is_empty())
            .ok_or("database: required")?;
        if username.is_empty() != password.is_empty() {
            return Err("username and password: give both or neither".into());
        }
        let authorization = (!username.is_empty()).then(|| {
            format!(
                "Basic {}",
                base64(format!("{username}:{password}").as_bytes())
            )
        });
        let entries: Vec<String> = path.split('.').map(str::to_string).collect();
        if entries.iter().any(String::is_empty) {
            return Err(format!("entries: {path:?} is not a dotted field path"));
        }
        for (key, v) in [
            ("event-id", &event_id),
            ("status", &status),
            ("published", &published),
            ("published-at", &published_at),
        ] {
            if v.is_empty() {
                return Err(format!("{key}: must not be empty"));
            }
        }
        Ok(Config {
            https,
            authority: authority.to_string(),
            prefix: prefix.to_string(),
            database: segment(&database),
            authorization,
            entries,
            event_id,
            status,
            published,
            published_at,
            max_conflicts,
            timeout_ns: timeout_ms * 1_000_000,
        })
    }
}

/// `id` as one percent-encoded URL path segment.
pub fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648 §4), for the basic-auth header.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(&owned)
    }

    #[test]
    fn parses_and_refuses_naming_the_key() {
        let c = parse(&[
            ("url", "http://127.0.0.1:5984/"),
            ("database", "docs/a"),
            ("username", "Aladdin"),
            ("password", "open sesame"),
        ])
        .unwrap();
        assert_eq!(c.authority, "127.0.0.1:5984");
        assert_eq!(c.prefix, "");
        assert_eq!(c.database, "docs%2Fa");
        assert_eq!(
            c.authorization.as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
        assert!(
            parse(&[("url", "http://h"), ("database", "d"), ("colour", "x")])
                .unwrap_err()
                .contains("`colour`")
        );
        assert!(parse(&[("database", "d")]).unwrap_err().starts_with("url"));
        assert!(parse(&[("url", "http://u:p@h"), ("database", "d")])
            .unwrap_err()
            .starts_with("url"));
    }
}
