//! Console logins: the in-memory sessions, their cookie and their CSRF
//! tokens.
//!
//! Owns: the rule that a session exists only after the admin token was
//! given (compared in constant time), that its id is 256 random bits from
//! the OS-seeded generator (`rand`), that it ends at its expiry
//! (`console.session-ttl`) or at logout, and that every form it posts
//! carries its own CSRF token (256 random bits), compared in constant
//! time. The cookie is `HttpOnly; SameSite=Strict; Path=<prefix>`, with
//! `Secure` when the daemon serves TLS.
//!
//! Must never: keep or send the admin token (a session holds only its own
//! id, CSRF token and expiry), accept an expired session, or keep more than
//! [`MAX_SESSIONS`] (the oldest is dropped first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// Name of the console's cookie.
pub const COOKIE: &str = "outboxd_console";

/// Most live sessions kept; a login beyond it ends the oldest.
pub const MAX_SESSIONS: usize = 1024;

/// One login.
#[derive(Debug, Clone)]
pub struct Session {
    /// The CSRF token its forms carry (64 hex digits).
    pub csrf: String,
    /// When it ends.
    pub expires: Instant,
}

/// The live sessions, by id.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    by_id: Mutex<HashMap<String, Session>>,
}

/// 256 random bits as 64 hex digits.
fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Whether `given` equals `expected`, in time independent of where they
/// differ.
pub fn same(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

impl Sessions {
    /// No sessions; each new one lasts `ttl`.
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            by_id: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Log in with `given` against the configured admin token (`None`:
    /// none configured, nobody logs in). Returns the new session's id, or
    /// `None` when refused (no session is made).
    pub fn login(&self, given: &str, token: Option<&str>) -> Option<String> {
        let token = token.filter(|t| !t.is_empty())?;
        if !same(given, token) {
            return None;
        }
        let id = random_hex();
        let now = Instant::now();
        let mut by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        by_id.retain(|_, s| s.expires > now);
        while by_id.len() >= MAX_SESSIONS {
            let oldest = by_id
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => by_id.remove(&k),
                None => break,
            };
        }
        by_id.insert(
            id.clone(),
            Session {
                csrf: random_hex(),
                expires: now + self.ttl,
            },
        );
        Some(id)
    }

    /// The live session `id` names; an expired one is removed and `None`.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut by_id = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        match by_id.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                by_id.remove(id);
                None
            }
            None => None,
        }
    }

    /// End session `id`.
    pub fn logout(&self, id: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

/// The console's session id in a request's `Cookie` headers.
pub fn cookie_value(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The `Set-Cookie` value carrying session `id` (empty `id` with
/// `max_age` 0: the cookie is removed).
pub fn set_cookie(id: &str, prefix: &str, max_age: Duration, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path={prefix}; Max-Age={}{}",
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_or_missing_token_makes_no_session() {
        let s = Sessions::new(Duration::from_secs(60));
        assert!(s.login("nope", Some("right")).is_none());
        assert!(s.login("", None).is_none());
        assert!(s.login("", Some("")).is_none());
        let id = s.login("right", Some("right")).unwrap();
        assert_eq!(id.len(), 64);
        assert!(s.get(&id).is_some());
        s.logout(&id);
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn the_cookie_is_http_only_strict_on_the_prefix_and_secure_over_tls() {
        let plain = set_cookie("abc", "/console", Duration::from_secs(60), false);
        assert_eq!(
            plain,
            "outboxd_console=abc; HttpOnly; SameSite=Strict; Path=/console; Max-Age=60"
        );
        let tls = set_cookie("abc", "/console", Duration::from_secs(60), true);
        assert!(tls.ends_with("; Secure"), "{tls}");
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            "other=1; outboxd_console=abc".parse().unwrap(),
        );
        assert_eq!(cookie_value(&headers).as_deref(), Some("abc"));
    }

    #[test]
    fn a_session_ends_at_its_expiry() {
        let s = Sessions::new(Duration::from_millis(20));
        let id = s.login("t", Some("t")).unwrap();
        assert!(s.get(&id).is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(s.get(&id).is_none());
    }
}
