//! The producer actions (`/v1/admin/producers…`, `outboxd producers
//! create|list|revoke|rotate`).
//!
//! Owns: creating a producer with a fresh token (answered once, stored as
//! its digest), listing them, revoking one (its record is kept so the
//! events it posted still name it), rotating its token (the old one
//! accepted for a grace period, 0 by default), and refreshing this
//! process's gate after each change so it takes effect at once here (other
//! replicas read it within `destinations.refresh-interval`).
//!
//! Must never: store, log or answer a token except in the one answer that
//! creates or rotates it; show a digest.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{invalid, AdminError};
use crate::auth::gate::now_ms;
use crate::auth::producer::{check_name, PreviousToken, ProducerView};
use crate::auth::{token, Gate, Producer, Scope};
use crate::store::{PutMode, Store};

/// How many times a read-modify-write is tried when another change lands
/// between the read and the write.
const WRITE_TRIES: usize = 5;

/// What `create` is given (`POST /v1/admin/producers`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerSpec {
    /// Its name: 1 to 64 of `a-z 0-9 - _ .`.
    pub name: String,
    /// Which events it may write; default all.
    #[serde(default)]
    pub scope: Scope,
    /// Events per second, at most; default `producers.rate-per-second`.
    #[serde(default)]
    pub rate_per_second: Option<u32>,
    /// Body bytes per second, at most; default no cap.
    #[serde(default)]
    pub bytes_per_second: Option<u64>,
    /// Its token is refused this long after creation (`"90d"`); default
    /// never.
    #[serde(default, with = "humantime_serde")]
    pub expires_in: Option<Duration>,
}

/// A producer with the token just made for it, shown this once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WithToken {
    /// The producer, as lists show it.
    pub producer: ProducerView,
    /// `obx_…`: give it to the producer; it is not stored and cannot be
    /// shown again.
    pub token: String,
}

/// Create a producer from `spec` with a fresh token.
///
/// Errors: a bad name or limit ([`AdminError::Invalid`]), the name is taken
/// ([`AdminError::Conflict`]), the store failed.
pub async fn create(
    store: &dyn Store,
    gate: &Gate,
    spec: ProducerSpec,
) -> Result<WithToken, AdminError> {
    check_name(&spec.name).map_err(|m| invalid("name", m))?;
    if spec.rate_per_second == Some(0) {
        return Err(invalid("rate_per_second", "must be greater than 0"));
    }
    if spec.bytes_per_second == Some(0) {
        return Err(invalid("bytes_per_second", "must be greater than 0"));
    }
    if spec.expires_in.is_some_and(|d| d.is_zero()) {
        return Err(invalid(
            "expires_in",
            "must be greater than 0s (leave it out for no expiry)",
        ));
    }
    let now = now_ms();
    let made = token::generate();
    let producer = Producer {
        name: spec.name.clone(),
        token_id: made.id,
        token_sha256: made.sha256,
        previous: None,
        scope: spec.scope,
        rate_per_second: spec.rate_per_second,
        bytes_per_second: spec.bytes_per_second,
        created_at_ms: now,
        expires_at_ms: spec.expires_in.map(|d| now + d.as_millis() as i64),
        revoked_at_ms: None,
    };
    let record = serde_json::to_string(&producer).expect("a producer serialises");
    if store
        .put_producer(&spec.name, &record, PutMode::Create)
        .await?
        .is_none()
    {
        return Err(AdminError::Conflict(format!(
            "a producer named {:?} exists (rotate its token with `outboxd producers rotate`)",
            spec.name
        )));
    }
    gate.refresh().await?;
    Ok(WithToken {
        producer: producer.view(now),
        token: made.token,
    })
}

/// One entry of a listing: a producer, or a stored record that does not
/// parse (named, never admitted).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProducerEntry {
    /// A producer.
    Producer(ProducerView),
    /// A record that does not parse.
    Unreadable {
        /// Its name.
        name: String,
        /// Why its record could not be read.
        error: String,
    },
}

/// The answer of `GET /v1/admin/producers`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Producers {
    /// By name.
    pub producers: Vec<ProducerEntry>,
}

/// The answer of a revoke: `{"producer": …}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Revoked {
    /// The producer, revoked.
    pub producer: ProducerView,
}

/// Every producer as lists show it (no digests), by name.
pub async fn list(store: &dyn Store) -> Result<Producers, AdminError> {
    let now = now_ms();
    let producers = store
        .producers()
        .await?
        .into_iter()
        .map(|row| match serde_json::from_str::<Producer>(&row.record) {
            Ok(p) => ProducerEntry::Producer(p.view(now)),
            Err(e) => ProducerEntry::Unreadable {
                name: row.name,
                error: format!("unreadable record: {e}"),
            },
        })
        .collect();
    Ok(Producers { producers })
}

/// Apply `change` to producer `name`'s record, revision-checked (tried
/// again when another change landed meanwhile), and refresh the gate.
async fn change<T>(
    store: &dyn Store,
    gate: &Gate,
    name: &str,
    mut change: impl FnMut(&mut Producer) -> Result<T, AdminError>,
) -> Result<(Producer, T), AdminError> {
    for _ in 0..WRITE_TRIES {
        let Some(row) = store
            .producers()
            .await?
            .into_iter()
            .find(|r| r.name == name)
        else {
            return Err(AdminError::NotFound(format!("no producer named {name:?}")));
        };
        let mut producer: Producer = serde_json::from_str(&row.record).map_err(|e| {
            AdminError::Conflict(format!("producer {name:?}: unreadable record: {e}"))
        })?;
        let out = change(&mut producer)?;
        let record = serde_json::to_string(&producer).expect("a producer serialises");
        if store
            .put_producer(name, &record, PutMode::Revision(row.revision))
            .await?
            .is_some()
        {
            gate.refresh().await?;
            return Ok((producer, out));
        }
    }
    Err(AdminError::Conflict(format!(
        "producer {name:?} kept changing while this ran; try again"
    )))
}

/// Revoke producer `name`: every token of it refused from now on (in this
/// process at once). Revoking twice keeps the first time.
///
/// Errors: no such producer, the store failed.
pub async fn revoke(store: &dyn Store, gate: &Gate, name: &str) -> Result<Revoked, AdminError> {
    let now = now_ms();
    let (producer, ()) = change(store, gate, name, |p| {
        p.revoked_at_ms.get_or_insert(now);
        p.previous = None;
        Ok(())
    })
    .await?;
    Ok(Revoked {
        producer: producer.view(now),
    })
}

/// Give producer `name` a new token; the current one stays accepted for
/// `grace` (zero: refused at once). One previous token is kept: a second
/// rotation ends the grace of the token before the first.
///
/// Errors: no such producer, a revoked or expired one
/// ([`AdminError::Conflict`]: make a new producer; a rotation keeps the
/// expiry), the store failed.
pub async fn rotate(
    store: &dyn Store,
    gate: &Gate,
    name: &str,
    grace: Duration,
) -> Result<WithToken, AdminError> {
    let now = now_ms();
    let (producer, token) = change(store, gate, name, |p| {
        if p.revoked_at_ms.is_some() {
            return Err(AdminError::Conflict(format!(
                "producer {name:?} is revoked; create a new producer instead"
            )));
        }
        if p.expires_at_ms.is_some_and(|t| now >= t) {
            return Err(AdminError::Conflict(format!(
                "producer {name:?} has expired (a rotation keeps the expiry); create a new producer instead"
            )));
        }
        let made = token::generate();
        p.previous = (!grace.is_zero()).then(|| PreviousToken {
            token_id: p.token_id.clone(),
            token_sha256: p.token_sha256.clone(),
            until_ms: now + grace.as_millis() as i64,
        });
        p.token_id = made.id;
        p.token_sha256 = made.sha256;
        Ok(made.token)
    })
    .await?;
    Ok(WithToken {
        producer: producer.view(now),
        token,
    })
}
