//! The dead-letter actions: list, replay, purge (`/v1/admin/dead…`,
//! `outboxd dead list|replay|purge`).
//!
//! Owns: the one selection rule ([`DeadSelection`]: `limit` defaults to
//! [`DEAD_LIST_DEFAULT`] for a listing and to [`DEAD_PAGE_MAX`] for a
//! replay or purge, and is refused above [`DEAD_PAGE_MAX`]) and the
//! answers ([`DeadLetters`], [`Replayed`], [`PurgedDead`]).
//!
//! Must never: touch a delivery that is not dead, or more than the limit.
//! Waking the delivery loops after a change is the caller's (the daemon
//! wakes its own; other replicas find the work at their next poll).

use serde::{Deserialize, Serialize};

use super::{AdminError, DEAD_LIST_DEFAULT, DEAD_PAGE_MAX};
use crate::store::{DeadFilter, DeadLetter, Store};

/// Which dead letters an action applies to, and at most how many.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadSelection {
    /// Every given field must match; none given matches all.
    #[serde(flatten)]
    pub filter: DeadFilter,
    /// `None`: [`DEAD_LIST_DEFAULT`] for a listing, [`DEAD_PAGE_MAX`] for a
    /// replay or purge. Refused when 0 or above [`DEAD_PAGE_MAX`].
    pub limit: Option<u32>,
}

impl DeadSelection {
    fn limit(&self, default: u32) -> Result<u32, AdminError> {
        match self.limit.unwrap_or(default) {
            n @ 1..=DEAD_PAGE_MAX => Ok(n),
            n => Err(super::invalid(
                "limit",
                format!(
                    "must be 1 to {DEAD_PAGE_MAX} (the most one request takes; repeat it for more), got {n}"
                ),
            )),
        }
    }
}

/// The answer of a listing: `{"dead": [DeadLetter…]}`, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetters {
    /// The matching dead letters.
    pub dead: Vec<DeadLetter>,
}

/// The answer of a replay: `{"replayed": n}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Replayed {
    /// Dead letters made pending again.
    pub replayed: u64,
}

/// The answer of a purge: `{"purged": n}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct PurgedDead {
    /// Dead letters deleted.
    pub purged: u64,
}

/// The matching dead letters, newest first.
pub async fn list_dead(store: &dyn Store, sel: &DeadSelection) -> Result<DeadLetters, AdminError> {
    let dead = store
        .list_dead(&sel.filter, sel.limit(DEAD_LIST_DEFAULT)?)
        .await?;
    Ok(DeadLetters { dead })
}

/// Make the matching dead letters pending again (attempts and retry window
/// start afresh). The caller wakes the delivery loops it can reach.
pub async fn replay_dead(store: &dyn Store, sel: &DeadSelection) -> Result<Replayed, AdminError> {
    let replayed = store
        .replay_dead(&sel.filter, sel.limit(DEAD_PAGE_MAX)?)
        .await?;
    Ok(Replayed { replayed })
}

/// Delete the matching dead letters. A purged dead letter may unblock its
/// stream (`on-dead = block`): the caller wakes the loops it can reach.
pub async fn purge_dead(store: &dyn Store, sel: &DeadSelection) -> Result<PurgedDead, AdminError> {
    let purged = store
        .purge_dead(&sel.filter, sel.limit(DEAD_PAGE_MAX)?)
        .await?;
    Ok(PurgedDead { purged })
}
