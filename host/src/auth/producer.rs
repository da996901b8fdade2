//! The stored producer record and its scope.
//!
//! Owns: [`Producer`] (what the store keeps of a producer: the token's id
//! and digest, never the token; scope; rate limits; expiry; revocation),
//! [`Scope`] and its check of one event, and the name rule.
//!
//! Must never: hold a token, or decide anything about a request beyond
//! whether an event is inside the scope (the gate, [`super::gate`], does
//! the rest).

use serde::{Deserialize, Serialize};

use crate::event::{glob_match, NewEvent};

/// Longest producer name, bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Which events a producer may write. An empty list allows everything of
/// that attribute; every non-empty list must allow the event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scope {
    /// Prefixes of the CloudEvents `source` (`/billing/` allows
    /// `/billing/invoices`).
    pub sources: Vec<String>,
    /// Globs over the event's `type` (`*` any run of characters).
    pub types: Vec<String>,
    /// Globs over the event's stream (`partitionkey`, else `subject`, else
    /// `source`).
    pub streams: Vec<String>,
}

/// What a scope refused in one event: the attribute and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfScope {
    /// `source`, `type` or `stream` (the ordering key: `partitionkey`,
    /// else `subject`, else `source`).
    pub attribute: &'static str,
    /// The value the event carried.
    pub value: String,
    /// What the scope allows of that attribute.
    pub allowed: Vec<String>,
}

impl Scope {
    /// `Ok` when `event` is inside the scope; else the first attribute it
    /// is not allowed.
    pub fn check(&self, event: &NewEvent) -> Result<(), OutOfScope> {
        let refuse = |attribute, value: &str, allowed: &Vec<String>| OutOfScope {
            attribute,
            value: value.to_string(),
            allowed: allowed.clone(),
        };
        if !self.sources.is_empty() && !self.sources.iter().any(|p| event.source.starts_with(p)) {
            return Err(refuse("source", &event.source, &self.sources));
        }
        if !self.types.is_empty() && !self.types.iter().any(|g| glob_match(g, &event.ty)) {
            return Err(refuse("type", &event.ty, &self.types));
        }
        if !self.streams.is_empty() && !self.streams.iter().any(|g| glob_match(g, &event.stream)) {
            return Err(refuse("stream", &event.stream, &self.streams));
        }
        Ok(())
    }

    /// Whether it allows every event.
    pub fn is_open(&self) -> bool {
        self.sources.is_empty() && self.types.is_empty() && self.streams.is_empty()
    }
}

/// A token still accepted for a while after a rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousToken {
    /// Its id.
    pub token_id: String,
    /// Hex SHA-256 of it.
    pub token_sha256: String,
    /// Accepted until this Unix ms.
    pub until_ms: i64,
}

/// A producer as stored (the store keeps this JSON whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Producer {
    /// Unique; stored with every event it posts.
    pub name: String,
    /// The current token's id (`obx_<id>_…`).
    pub token_id: String,
    /// Hex SHA-256 of the current token.
    pub token_sha256: String,
    /// The token before the last rotation, while its grace lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousToken>,
    /// Which events it may write.
    #[serde(default)]
    pub scope: Scope,
    /// Events per second it may post, at most (unset: the
    /// `ingest.producer-rate-per-second` default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Request body bytes per second it may post, at most (unset: no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Its tokens are refused from this Unix ms on; unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// Revoked at this Unix ms: every token refused, the record kept so
    /// the events it posted still name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<i64>,
}

/// Whether a producer's token is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProducerState {
    /// Accepted.
    Active,
    /// Past its expiry.
    Expired,
    /// Revoked by an operator.
    Revoked,
}

/// A producer as lists and answers show it: no digest, the token as
/// `obx_<id>_…` so an operator can tell which one a client holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerView {
    /// Its name.
    pub name: String,
    /// Its token, shortened to `obx_<id>_…`.
    pub token: String,
    /// Until when its previous token is still accepted, Unix ms.
    pub previous_token_until_ms: Option<i64>,
    /// Active, expired or revoked.
    pub state: ProducerState,
    /// Which events it may write.
    pub scope: Scope,
    /// Events per second, at most.
    pub rate_per_second: Option<u32>,
    /// Body bytes per second, at most.
    pub bytes_per_second: Option<u64>,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms.
    pub expires_at_ms: Option<i64>,
    /// Unix ms.
    pub revoked_at_ms: Option<i64>,
}

impl Producer {
    /// The record as lists and answers show it ([`ProducerView`]), its
    /// state as of `now_ms`.
    pub fn view(&self, now_ms: i64) -> ProducerView {
        let state = if self.revoked_at_ms.is_some() {
            ProducerState::Revoked
        } else if self.expires_at_ms.is_some_and(|t| now_ms >= t) {
            ProducerState::Expired
        } else {
            ProducerState::Active
        };
        ProducerView {
            name: self.name.clone(),
            token: format!("{}{}_…", super::token::PREFIX, self.token_id),
            previous_token_until_ms: self.previous.as_ref().map(|p| p.until_ms),
            state,
            scope: self.scope.clone(),
            rate_per_second: self.rate_per_second,
            bytes_per_second: self.bytes_per_second,
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            revoked_at_ms: self.revoked_at_ms,
        }
    }
}

/// `Err` saying what is wrong with `name` as a producer name: 1 to
/// [`MAX_NAME_BYTES`] of `a-z`, `0-9`, `-`, `_`, `.`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!("must be 1 to {MAX_NAME_BYTES} bytes"));
    }
    if !name
        .bytes()
        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.'))
    {
        return Err("may hold only a-z, 0-9, '-', '_' and '.'".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(source: &str, ty: &str, stream: &str) -> NewEvent {
        let body = serde_json::json!({
            "specversion": "1.0", "id": "e", "source": source, "type": ty,
            "partitionkey": stream, "data": {}
        });
        crate::event::parse_one(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_scope_names_the_first_attribute_it_refuses() {
        let scope = Scope {
            sources: vec!["/billing/".into()],
            types: vec!["invoice.*".into()],
            streams: vec![],
        };
        assert!(scope
            .check(&event("/billing/eu", "invoice.paid", "x"))
            .is_ok());
        let e = scope
            .check(&event("/shop", "invoice.paid", "x"))
            .unwrap_err();
        assert_eq!((e.attribute, e.value.as_str()), ("source", "/shop"));
        let e = scope
            .check(&event("/billing/eu", "order.paid", "x"))
            .unwrap_err();
        assert_eq!((e.attribute, e.value.as_str()), ("type", "order.paid"));
        assert!(Scope::default().check(&event("/a", "b", "c")).is_ok());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("billing-eu.1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("Billing").is_err());
        assert!(check_name(&"a".repeat(65)).is_err());
    }
}
