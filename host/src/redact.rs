//! Passwords out of URLs: the one rule every room uses before a URL that
//! may carry credentials (a database, a broker) reaches a log line, an
//! error message or an API answer.
//!
//! Owns: [`redact_url`]. Must never: import anything of ours (it is on the
//! ground floor), or return any byte of a password.

/// `url` with the password of its userinfo replaced by `***`:
/// `amqp://guest:secret@h:5672/%2f` → `amqp://guest:***@h:5672/%2f`,
/// `postgres://u:p@ss@h/db` → `postgres://u:***@h/db`. The authority ends
/// at the first `/`, `?` or `#` (RFC 3986 §3.2; a password holding one of
/// them must be percent-encoded) and the userinfo at its last `@`, so an
/// `@` in the password is hidden with the rest of it. A URL without a
/// password (no userinfo, or a user alone) is returned unchanged, as is
/// text that is not a URL.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_shown() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("amqps://u:p@ss@h/v?x=1"),
            "amqps://u:***@h/v?x=1"
        );
        assert_eq!(
            redact_url("postgres://app:hunter2@db:5432/outboxd?sslmode=require"),
            "postgres://app:***@db:5432/outboxd?sslmode=require"
        );
        assert_eq!(redact_url("amqp://h:5672"), "amqp://h:5672");
        assert_eq!(redact_url("amqp://user@h"), "amqp://user@h");
        assert_eq!(
            redact_url("sqlite://data/outboxd.db"),
            "sqlite://data/outboxd.db"
        );
        // An `@` after the authority is not userinfo.
        assert_eq!(
            redact_url("postgres://h/db?application_name=a:b@c"),
            "postgres://h/db?application_name=a:b@c"
        );
    }
}
