//! Wake-ups of the delivery loops: "there may be work for you now".
//!
//! Owns: one [`tokio::sync::Notify`] for every loop (a change whose
//! delivery keys are unknown: a replay, routing of events enqueued by SQL)
//! and one per delivery key, so an ingest wakes only the loops of the keys
//! it queued deliveries for — with a thousand destinations, an event for
//! one of them costs one claim, not a thousand — and the text form of a
//! key list carried by PostgreSQL `NOTIFY` to the other processes
//! ([`payload`], [`parse_payload`]).
//!
//! Must never: be the only way a loop finds work — every loop still polls
//! (`delivery.max-poll-interval`), so a lost wake-up delays, never loses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// Longest `NOTIFY` payload [`payload`] writes (PostgreSQL's limit is
/// 8,000 bytes); a longer key list becomes "everyone".
pub const MAX_PAYLOAD_BYTES: usize = 7_000;

/// Prefix of a payload that names delivery keys.
const KEYS_PREFIX: &str = "keys:";

/// The wake-up channels of one process.
#[derive(Default)]
pub struct Wakeups {
    all: Notify,
    keys: Mutex<HashMap<String, Weak<Notify>>>,
}

impl Wakeups {
    /// A fresh set, shared by every part of the process.
    pub fn new() -> Arc<Wakeups> {
        Arc::new(Wakeups::default())
    }

    /// The channel every loop listens on.
    pub fn all(&self) -> &Notify {
        &self.all
    }

    /// Wake every loop.
    pub fn everyone(&self) {
        self.all.notify_waiters();
    }

    /// The channel of delivery key `key`; kept while a loop holds it.
    pub fn subscribe(&self, key: &str) -> Arc<Notify> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            return n;
        }
        keys.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Notify::new());
        keys.insert(key.to_string(), Arc::downgrade(&n));
        n
    }

    /// Wake the loops of `keys` (a key no loop of this process serves is
    /// skipped).
    pub fn keys<'k>(&self, keys: impl IntoIterator<Item = &'k str>) {
        let map = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            if let Some(n) = map.get(key).and_then(Weak::upgrade) {
                n.notify_waiters();
            }
        }
    }

    /// Act on a `NOTIFY` payload from another process: the keys it names,
    /// or everyone for any other payload.
    pub fn from_payload(&self, payload: &str) {
        match parse_payload(payload) {
            Some(keys) => self.keys(keys),
            None => self.everyone(),
        }
    }
}

/// The `NOTIFY` payload naming `keys` (sorted, without repeats); `*` (wake
/// everyone) when they do not fit in [`MAX_PAYLOAD_BYTES`].
pub fn payload<'k>(keys: impl IntoIterator<Item = &'k str>) -> String {
    let mut keys: Vec<&str> = keys.into_iter().collect();
    keys.sort_unstable();
    keys.dedup();
    let text = format!("{KEYS_PREFIX}{}", keys.join("\n"));
    if text.len() > MAX_PAYLOAD_BYTES || keys.iter().any(|k| k.contains('\n')) {
        "*".into()
    } else {
        text
    }
}

/// The keys a [`payload`] names; `None` for any other payload (wake
/// everyone).
pub fn parse_payload(payload: &str) -> Option<impl Iterator<Item = &str>> {
    payload
        .strip_prefix(KEYS_PREFIX)
        .map(|rest| rest.split('\n').filter(|k| !k.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_keys_and_a_long_one_wakes_everyone() {
        let p = payload(["b", "a", "b"]);
        assert_eq!(parse_payload(&p).unwrap().collect::<Vec<_>>(), ["a", "b"]);
        let many: Vec<String> = (0..2_000).map(|i| format!("destination-{i}")).collect();
        assert_eq!(payload(many.iter().map(String::as_str)), "*");
        assert!(parse_payload("*").is_none());
        assert!(parse_payload("ingest").is_none());
    }

    #[tokio::test]
    async fn only_the_named_key_is_woken() {
        let w = Wakeups::new();
        let (a, b) = (w.subscribe("a"), w.subscribe("b"));
        let (na, nb) = (a.notified(), b.notified());
        tokio::pin!(na, nb);
        na.as_mut().enable();
        nb.as_mut().enable();
        w.from_payload(&payload(["a"]));
        assert!(futures::poll!(na.as_mut()).is_ready());
        assert!(futures::poll!(nb.as_mut()).is_pending());
    }
}
