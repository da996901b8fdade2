//! The gate every HTTP ingest request passes before anything of it is
//! read into the store: who is posting ([`Gate::authenticate`]), and
//! whether what they post is theirs to post, at a rate they may
//! ([`Gate::admit`]).
//!
//! Owns: the producers this process checks tokens against (read from the
//! store at start, after every change made through this process, and
//! every `destinations.refresh-interval` for changes made through another
//! replica); one pair of token buckets per producer (events and bytes,
//! the `governor` crate); the refusals and their stable codes.
//!
//! Must never: let a request through on an error reading producers (the
//! last table read stays in force), say in an answer which part of a
//! token was wrong (every authentication refusal reads the same), log a
//! token, or compare a digest other than in constant time.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::HeaderMap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::producer::{OutOfScope, Producer, Scope};
use super::settings::{ProducerAuth, ProducersConfig};
use super::token;
use crate::event::NewEvent;
use crate::store::{Store, StoreError};

/// Why authentication failed. Every one is answered alike (401
/// `unauthorized`); only the metric's reason tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthenticated {
    /// No `Authorization` header where one is required.
    Missing,
    /// An `Authorization` header that is not `Bearer obx_<id>_<secret>`.
    Malformed,
    /// A well-formed token no producer holds (wrong, or replaced by a
    /// rotation whose grace is over).
    Unknown,
    /// The token of a revoked producer.
    Revoked,
    /// The token of a producer past its expiry.
    Expired,
}

impl Unauthenticated {
    /// The metric's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "missing-token",
            Unauthenticated::Malformed => "malformed-token",
            Unauthenticated::Unknown => "unknown-token",
            Unauthenticated::Revoked => "revoked-token",
            Unauthenticated::Expired => "expired-token",
        }
    }
}

/// A request the gate refused; nothing of it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401 `unauthorized`.
    Unauthenticated(Unauthenticated),
    /// 403 `out-of-scope`: event `index` of the request (`None` for a
    /// single event) carries an attribute the producer may not write.
    OutOfScope {
        /// The event's place in a batch.
        index: Option<usize>,
        /// What was refused.
        refused: OutOfScope,
    },
    /// 429 `rate-limited`: over the producer's events or bytes per second;
    /// the whole request may be sent again after `retry_after`.
    RateLimited {
        /// `events` or `bytes`.
        limit: &'static str,
        /// When the request would fit.
        retry_after: Duration,
    },
}

impl Refusal {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Unauthenticated(_) => 401,
            Refusal::OutOfScope { .. } => 403,
            Refusal::RateLimited { .. } => 429,
        }
    }

    /// The stable error code of the answer (`code`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthorized",
            Refusal::OutOfScope { .. } => "out-of-scope",
            Refusal::RateLimited { .. } => "rate-limited",
        }
    }

    /// The metric's reason: finer than [`Refusal::code`] for
    /// authentication.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(why) => why.reason(),
            Refusal::OutOfScope { .. } => "out-of-scope",
            Refusal::RateLimited { limit: "bytes", .. } => "rate-limited-bytes",
            Refusal::RateLimited { .. } => "rate-limited",
        }
    }

    /// The field at fault, as the ingest answers name fields (`[3].type`).
    pub fn field(&self) -> Option<String> {
        match self {
            Refusal::Unauthenticated(_) => Some("authorization".into()),
            Refusal::OutOfScope { index, refused } => Some(match index {
                Some(i) => format!("[{i}].{}", refused.attribute),
                None => refused.attribute.to_string(),
            }),
            Refusal::RateLimited { .. } => None,
        }
    }

    /// What the answer says.
    pub fn message(&self, producer: Option<&str>) -> String {
        let who = producer.unwrap_or("this producer");
        match self {
            Refusal::Unauthenticated(_) => "missing or invalid producer token: send \
                `Authorization: Bearer <token>` with a token from `outboxd producers create`"
                .to_string(),
            Refusal::OutOfScope { index, refused } => format!(
                "producer {who:?} may not write {}{} {:?} (its scope allows {}: {}); nothing of the \
                 request was stored",
                index.map(|i| format!("event [{i}]'s ")).unwrap_or_default(),
                refused.attribute,
                refused.value,
                refused.attribute,
                refused.allowed.join(", ")
            ),
            Refusal::RateLimited { limit, retry_after } => format!(
                "producer {who:?} is over its {limit} per second; nothing of the request was \
                 stored; retry after {} s",
                retry_after_secs(*retry_after)
            ),
        }
    }
}

/// Whole seconds for `Retry-After` (RFC 9110 §10.2.3): rounded up, at
/// least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_nanos().div_ceil(1_000_000_000) as u64).max(1)
}

/// Unix milliseconds now, by this process's clock: the time tokens'
/// expiry and rotation grace are compared with.
pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The producer's name (stored with its events).
    pub name: String,
    scope: Scope,
}

/// The token buckets of one producer, with the limits they were built for.
struct Buckets {
    limits: (u32, Option<u64>),
    events: DefaultDirectRateLimiter,
    bytes: Option<DefaultDirectRateLimiter>,
}

/// What the gate knows of the producers, by token id.
#[derive(Default)]
struct Table {
    by_token: HashMap<String, Holder>,
    by_name: BTreeMap<String, Producer>,
}

/// A token id's holder: the producer and the digest (and, for a rotated
/// token, until when it is accepted).
struct Holder {
    name: String,
    sha256: String,
    until_ms: Option<i64>,
}

/// The ingest gate. One per process; shared by every ingest route.
pub struct Gate {
    store: Arc<dyn Store>,
    mode: ProducerAuth,
    settings: ProducersConfig,
    /// Largest body and batch a request may carry: a producer's bursts
    /// are at least these, so every request ingest accepts can pass.
    max_body_bytes: usize,
    max_batch_items: usize,
    table: RwLock<Table>,
    buckets: Mutex<HashMap<String, Arc<Buckets>>>,
}

impl Gate {
    /// A gate in `mode` over the producers stored in `store`, read now;
    /// `max_body_bytes` and `max_batch_items` are ingest's limits
    /// (`ingest.max-body-bytes`, `ingest.max-batch-items`).
    /// Errors: the store cannot be read.
    pub async fn load(
        store: Arc<dyn Store>,
        mode: ProducerAuth,
        settings: ProducersConfig,
        (max_body_bytes, max_batch_items): (usize, usize),
    ) -> Result<Arc<Gate>, StoreError> {
        let gate = Arc::new(Gate {
            store,
            mode,
            settings,
            max_body_bytes,
            max_batch_items,
            table: RwLock::default(),
            buckets: Mutex::default(),
        });
        gate.refresh().await?;
        Ok(gate)
    }

    /// Whether anonymous posts are accepted (`producers.auth = optional`).
    pub fn mode(&self) -> ProducerAuth {
        self.mode
    }

    /// Read the producers again. A record that does not parse is logged
    /// and left out (its tokens are refused). Errors: the store cannot be
    /// read (the last table stays in force).
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let rows = self.store.producers().await?;
        let mut table = Table::default();
        for row in rows {
            let producer: Producer = match serde_json::from_str(&row.record) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(producer = %row.name, "stored producer record is unreadable, its tokens are refused: {e}");
                    continue;
                }
            };
            table.by_token.insert(
                producer.token_id.clone(),
                Holder {
                    name: producer.name.clone(),
                    sha256: producer.token_sha256.clone(),
                    until_ms: None,
                },
            );
            if let Some(previous) = &producer.previous {
                table.by_token.insert(
                    previous.token_id.clone(),
                    Holder {
                        name: producer.name.clone(),
                        sha256: previous.token_sha256.clone(),
                        until_ms: Some(previous.until_ms),
                    },
                );
            }
            table.by_name.insert(producer.name.clone(), producer);
        }
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        Ok(())
    }

    /// Refresh every `every` until `shutdown`; a failed read is logged and
    /// the last table stays in force.
    pub fn run(
        self: Arc<Self>,
        every: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                if let Err(e) = self.refresh().await {
                    tracing::warn!(
                        "could not read the producers again (the last read stays in force): {e}"
                    );
                }
            }
        })
    }

    /// Who sent a request with `headers`, at Unix ms `now_ms`: `Ok(None)`
    /// for an anonymous request where anonymous posts are accepted.
    ///
    /// Errors: [`Refusal::Unauthenticated`] — no token where one is
    /// required, or a token that is malformed, unknown, revoked or expired.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        now_ms: i64,
    ) -> Result<Option<Principal>, Refusal> {
        let refuse = |why| Err(Refusal::Unauthenticated(why));
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return match self.mode {
                ProducerAuth::Required => refuse(Unauthenticated::Missing),
                ProducerAuth::Optional => Ok(None),
            };
        };
        let Some(given) = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            // `"Bearer" 1*SP b64token` (RFC 6750 §2.1): one space or more.
            .map(|(_, token)| token.trim_start_matches(' '))
        else {
            return refuse(Unauthenticated::Malformed);
        };
        let Some(id) = token::id_of(given) else {
            return refuse(Unauthenticated::Malformed);
        };
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let Some(holder) = table.by_token.get(id) else {
            return refuse(Unauthenticated::Unknown);
        };
        if !token::matches(given, &holder.sha256) || holder.until_ms.is_some_and(|t| now_ms >= t) {
            return refuse(Unauthenticated::Unknown);
        }
        let Some(producer) = table.by_name.get(&holder.name) else {
            return refuse(Unauthenticated::Unknown);
        };
        if producer.revoked_at_ms.is_some() {
            return refuse(Unauthenticated::Revoked);
        }
        if producer.expires_at_ms.is_some_and(|t| now_ms >= t) {
            return refuse(Unauthenticated::Expired);
        }
        Ok(Some(Principal {
            name: producer.name.clone(),
            scope: producer.scope.clone(),
        }))
    }

    /// Whether `principal` may post `events` (a request of `body_bytes`
    /// bytes; `batch` says whether it was a batch): every event inside its
    /// scope, then the events and bytes within its rates (taken from its
    /// buckets only when the whole request is admitted).
    ///
    /// Errors: [`Refusal::OutOfScope`] naming the first event refused,
    /// [`Refusal::RateLimited`] with when to retry.
    pub fn admit(
        &self,
        principal: &Principal,
        events: &[NewEvent],
        body_bytes: usize,
        batch: bool,
    ) -> Result<(), Refusal> {
        for (i, event) in events.iter().enumerate() {
            if let Err(refused) = principal.scope.check(event) {
                return Err(Refusal::OutOfScope {
                    index: batch.then_some(i),
                    refused,
                });
            }
        }
        let buckets = self.buckets_of(&principal.name);
        let clock = DefaultClock::default();
        let wait = |limiter: &DefaultDirectRateLimiter, n: usize| -> Option<Duration> {
            let n = NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX))?;
            match limiter.check_n(n) {
                Ok(Ok(())) => None,
                Ok(Err(not_until)) => Some(not_until.wait_time_from(clock.now())),
                // Bursts are at least the largest request ingest accepts.
                Err(_) => Some(Duration::from_secs(1)),
            }
        };
        if let Some(retry_after) = wait(&buckets.events, events.len()) {
            return Err(Refusal::RateLimited {
                limit: "events",
                retry_after,
            });
        }
        if let Some(retry_after) = buckets.bytes.as_ref().and_then(|b| wait(b, body_bytes)) {
            return Err(Refusal::RateLimited {
                limit: "bytes",
                retry_after,
            });
        }
        Ok(())
    }

    /// The buckets of producer `name`, built again when its limits changed.
    fn buckets_of(&self, name: &str) -> Arc<Buckets> {
        let (rate, bytes) = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            let producer = table.by_name.get(name);
            (
                producer
                    .and_then(|p| p.rate_per_second)
                    .unwrap_or(self.settings.rate_per_second),
                producer.and_then(|p| p.bytes_per_second),
            )
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = buckets.get(name).filter(|b| b.limits == (rate, bytes)) {
            return b.clone();
        }
        let nz = |n: u64| {
            NonZeroU32::new(u32::try_from(n.max(1)).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN)
        };
        let events_burst = u64::from(rate).max(self.max_batch_items as u64);
        let made = Arc::new(Buckets {
            limits: (rate, bytes),
            events: RateLimiter::direct(
                Quota::per_second(nz(u64::from(rate))).allow_burst(nz(events_burst)),
            ),
            bytes: bytes.map(|b| {
                let burst = b.max(self.max_body_bytes as u64);
                RateLimiter::direct(Quota::per_second(nz(b)).allow_burst(nz(burst)))
            }),
        });
        buckets.insert(name.to_string(), made.clone());
        made
    }

    /// Every producer as the admin views show it (no digests), by name.
    pub fn views(&self, now_ms: i64) -> Vec<crate::auth::producer::ProducerView> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.by_name.values().map(|p| p.view(now_ms)).collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        use super::retry_after_secs;
        use std::time::Duration;
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
