//! The failed-attempt history: what each failed attempt of a delivery
//! was — when, how long the plugin call took, what became of it, the
//! receiver's status and the reason (`GET /v1/admin/attempts`, `outboxd
//! attempts list`, the console's attempts page).
//!
//! Owns: the listing's input rules ([`AttemptQuery`]: times in RFC 3339,
//! empty fields not given, the page bounded by [`ATTEMPTS_PAGE_MAX`]) and
//! its answer ([`Attempts`]).
//!
//! Must never: change anything. The history holds failures only (a
//! delivered attempt is not recorded), at most
//! [`crate::limits::ATTEMPTS_KEPT`] per delivery, for
//! `delivery.retention`.

use serde::{Deserialize, Serialize};

use super::AdminError;
pub use crate::limits::{ATTEMPTS_LIST_DEFAULT, ATTEMPTS_PAGE_MAX};
use crate::store::{Attempt, AttemptFilter, Store};

/// A listing as the admin API's query string, the CLI's flags and the
/// console's form give it (`GET /v1/admin/attempts?sink=…&event_id=…`):
/// every given field must match; empty fields count as not given.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttemptQuery {
    /// One delivery key's attempts: a destination, or a sink.
    pub sink: Option<String>,
    /// One event's attempts.
    pub event_id: Option<String>,
    /// Recorded at or after, RFC 3339.
    pub since: Option<String>,
    /// Recorded before, RFC 3339.
    pub until: Option<String>,
    /// At most this many, 1 to [`ATTEMPTS_PAGE_MAX`]; default
    /// [`ATTEMPTS_LIST_DEFAULT`].
    pub limit: Option<u32>,
}

/// `text` as a filter value: `None` when absent or blank.
fn given(text: &Option<String>) -> Option<String> {
    text.as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

impl AttemptQuery {
    /// The store's filter and the limit.
    ///
    /// Errors: [`AdminError::Invalid`] naming `since`, `until` or `limit`.
    pub fn filter(&self) -> Result<(AttemptFilter, u32), AdminError> {
        let time = |field: &str, text: &Option<String>| {
            given(text)
                .map(|t| super::parse_time(field, &t))
                .transpose()
        };
        let limit = match self.limit.unwrap_or(ATTEMPTS_LIST_DEFAULT) {
            n @ 1..=ATTEMPTS_PAGE_MAX => n,
            n => {
                return Err(super::invalid(
                    "limit",
                    format!(
                        "must be 1 to {ATTEMPTS_PAGE_MAX} (the most one request lists; narrow the \
                         time range for more), got {n}"
                    ),
                ))
            }
        };
        Ok((
            AttemptFilter {
                sink: given(&self.sink),
                event_id: given(&self.event_id),
                since_ms: time("since", &self.since)?,
                until_ms: time("until", &self.until)?,
            },
            limit,
        ))
    }

    /// The given fields as a query string (`sink=…&event_id=…`, values
    /// percent-encoded; empty when none), for links and the CLI's request.
    pub fn query_string(&self) -> String {
        let limit = self.limit.map(|n| n.to_string());
        [
            ("sink", given(&self.sink)),
            ("event_id", given(&self.event_id)),
            ("since", given(&self.since)),
            ("until", given(&self.until)),
            ("limit", limit),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|v| format!("{key}={}", encode(&v))))
        .collect::<Vec<_>>()
        .join("&")
    }
}

/// `text` percent-encoded for a query value (RFC 3986 unreserved
/// characters kept).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The answer of a listing: `{"attempts": [Attempt…], "limit": n}`,
/// newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempts {
    /// The matching failed attempts, at most the limit.
    pub attempts: Vec<Attempt>,
    /// The limit applied: as many attempts as this means there may be
    /// more.
    pub limit: u32,
}

/// The failed attempts matching `query`, newest first.
///
/// Errors: [`AdminError::Invalid`] naming the field at fault.
pub async fn list(store: &dyn Store, query: &AttemptQuery) -> Result<Attempts, AdminError> {
    let (filter, limit) = query.filter()?;
    let attempts = store.list_attempts(&filter, limit).await?;
    Ok(Attempts { attempts, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_past_the_page_is_refused_naming_it() {
        let q = AttemptQuery {
            limit: Some(ATTEMPTS_PAGE_MAX + 1),
            ..Default::default()
        };
        let e = q.filter().unwrap_err();
        assert_eq!(e.field(), Some("limit"));
        let q = AttemptQuery {
            since: Some("yesterday".into()),
            ..Default::default()
        };
        assert_eq!(q.filter().unwrap_err().field(), Some("since"));
    }

    #[test]
    fn a_query_goes_into_a_link_encoded() {
        let q = AttemptQuery {
            sink: Some("east hook".into()),
            event_id: Some(" ".into()),
            limit: Some(5),
            ..Default::default()
        };
        assert_eq!(q.query_string(), "sink=east%20hook&limit=5");
    }
}
