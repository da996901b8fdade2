//! The relay loop: prepare (the password variable), connect, create the
//! indexes, then claim cycles — ingest each claimed batch through
//! [`crate::ingest::submit`], finish its nodes fenced, retry failed ones
//! with backoff — renewing the reachability check `/ready` shows.
//!
//! Must never: finish a node before its event is stored, or let a store
//! failure lose a claimed node (it is marked failed, to retry).

use super::*;

/// What one relay cycle did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CycleReport {
    /// Nodes claimed.
    pub claimed: usize,
    /// Stored (or found already stored) and marked delivered.
    pub relayed: u64,
    /// Marked failed, to retry.
    pub failed: u64,
    /// Marked dead.
    pub dead: u64,
    /// Finishes whose lease token no longer matched.
    pub lease_lost: u64,
}

/// Name of the readiness check renewed by every cycle that reached Neo4j.
pub const CHECK_REACHABLE: &str = "neo4j_reachable";

/// Run the relay of source `name` until `shutdown` turns true (`Ok`) or a
/// cycle fails (`Err`, for the supervisor to run it again after a backoff):
/// connect, create the indexes, then claim cycles. Every cycle that reaches
/// Neo4j renews the [`CHECK_REACHABLE`] check (stale after
/// [`stale_after`]); a failure that did not reach it turns the check off.
pub async fn run(
    name: &str,
    config: &Neo4jSourceConfig,
    ctx: &SourceContext,
    status: &StatusHandle,
    shutdown: watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let result = Relay::prepare(name, config.clone(), ctx.clone());
    let result = match result {
        Ok(relay) => relay.run(status, shutdown).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        if !e.connected() && !matches!(e, OutboxError::Config(_)) {
            status.check(CHECK_REACHABLE, false, Some(e.to_string()), None);
        }
    }
    result
}

/// A [`CHECK_REACHABLE`] check not renewed within this long turns not-ok:
/// a poll interval plus four query timeouts, at least 10 s.
pub fn stale_after(config: &Neo4jSourceConfig) -> Duration {
    (config.poll_interval + config.timeout * 4).max(Duration::from_secs(10))
}

/// A configured Neo4j relay.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<RelayInner>,
}

struct RelayInner {
    name: String,
    config: Neo4jSourceConfig,
    password: String,
    ctx: SourceContext,
}

impl Relay {
    /// Read what is only known at run time (the password variable).
    pub fn prepare(
        name: &str,
        config: Neo4jSourceConfig,
        ctx: SourceContext,
    ) -> Result<Relay, OutboxError> {
        let password = match &config.password_env {
            None => String::new(),
            Some(var) => std::env::var(var).map_err(|_| {
                OutboxError::Config(format!(
                    "key `sources.{name}.password-env`: environment variable {var} is not set (or not UTF-8)"
                ))
            })?,
        };
        Ok(Relay {
            inner: Arc::new(RelayInner {
                name: name.to_string(),
                config,
                password,
                ctx,
            }),
        })
    }

    /// Connect, create the indexes, then run cycles until `shutdown`.
    /// Returns an error for the supervisor to restart after a backoff.
    pub async fn run(
        &self,
        status: &StatusHandle,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), OutboxError> {
        let inner = &self.inner;
        let fresh = Some(stale_after(&inner.config));
        let label = crate::metrics::SourceLabel {
            source: inner.name.clone(),
        };
        let outbox = Outbox::connect(&inner.config, &inner.password)?;
        outbox.ensure_indexes().await?;
        status.check(CHECK_REACHABLE, true, None, fresh);
        tracing::info!(source = %inner.name, url = %inner.config.url, label = %inner.config.label, "neo4j outbox relay started");
        let metrics = &inner.ctx.metrics;
        let mut last_retention: Option<Instant> = None;
        let mut last_oldest: Option<Instant> = None;
        let mut last_missing: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let started = Instant::now();
            let report = self.cycle(&outbox).await?;
            let retention_every = RETENTION_EVERY.min(inner.config.retention);
            if last_retention.is_none_or(|t| t.elapsed() >= retention_every) {
                last_retention = Some(Instant::now());
                for _ in 0..RETENTION_ROUNDS {
                    let n = outbox
                        .purge_delivered(inner.config.retention, inner.config.retention_batch)
                        .await?;
                    if n < inner.config.retention_batch as u64 {
                        break;
                    }
                }
            }
            if last_missing.is_none_or(|t| t.elapsed() >= MISSING_ID_EVERY) {
                last_missing = Some(Instant::now());
                let n = outbox.mark_missing_ids(MISSING_ID_BATCH).await?;
                if n > 0 {
                    tracing::warn!(source = %inner.name, nodes = n, "outbox nodes without a usable event id marked dead");
                    metrics.source_entries(&inner.name, "dead", n);
                }
            }
            if last_oldest.is_none_or(|t| t.elapsed() >= OLDEST_EVERY) {
                last_oldest = Some(Instant::now());
                let age = outbox.oldest_pending_age().await?;
                metrics
                    .source_oldest_pending_age
                    .get_or_create(&label)
                    .set(age.map_or(0.0, |a| a.as_secs_f64()));
            }
            let took = started.elapsed();
            status.check(CHECK_REACHABLE, true, None, fresh);
            status.cycle();
            metrics
                .source_cycle_duration
                .get_or_create(&label)
                .observe(took.as_secs_f64());
            // Anything claimed: the streams it finished likely have their
            // next node due, so look again at once; only a cycle that found
            // nothing waits the poll interval.
            if report.claimed > 0 {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(inner.config.poll_interval) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
        }
    }
    /// One cycle: claim, build events, ingest them in one store
    /// transaction, finish each node fenced. A node that cannot become an
    /// event, or whose id is stored with other content, is marked dead; a
    /// store failure marks the batch failed (retried with backoff) and
    /// fails the cycle.
    pub async fn cycle(&self, outbox: &Outbox) -> Result<CycleReport, OutboxError> {
        let inner = &self.inner;
        let claimed = outbox.claim(inner.config.batch_size as usize).await?;
        let mut report = CycleReport {
            claimed: claimed.len(),
            ..Default::default()
        };
        let Some(token) = claimed.first().map(|n| n.lease_token.clone()) else {
            return Ok(report);
        };
        let streams: Vec<String> = claimed.iter().filter_map(|n| n.stream.clone()).collect();
        let mut dead: Vec<(String, String)> = Vec::new();
        let mut good: Vec<(ClaimedNode, NewEvent)> = Vec::new();
        for node in claimed {
            match to_event(&inner.config, &inner.name, &node) {
                Ok(ev) => good.push((node, ev)),
                Err(reason) => {
                    tracing::warn!(source = %inner.name, event_id = %node.event_id, %reason, "outbox node refused");
                    dead.push((node.event_id, reason));
                }
            }
        }
        let store_error = self.ingest(&mut good, &mut dead).await;
        let metrics = &inner.ctx.metrics;
        if !dead.is_empty() {
            let n = dead.len() as u64;
            let kept = outbox.finish_dead(&token, dead).await?;
            report.dead += kept;
            report.lease_lost += n - kept;
        }
        if let Some(error) = &store_error {
            let items: Vec<(String, Duration, String)> = good
                .iter()
                .map(|(node, _)| {
                    (
                        node.event_id.clone(),
                        self.retry_delay(node.attempts),
                        format!("outboxd store: {error}"),
                    )
                })
                .collect();
            let n = items.len() as u64;
            let kept = outbox.finish_failed(&token, items).await?;
            report.failed += kept;
            report.lease_lost += n - kept;
        } else {
            let ids: Vec<String> = good.iter().map(|(n, _)| n.event_id.clone()).collect();
            let n = ids.len() as u64;
            let kept = outbox.finish_delivered(&token, ids).await?;
            report.relayed += kept;
            report.lease_lost += n - kept;
            // Each claimed stream moved on (delivered or dead): its next
            // node is likely due.
            outbox.note_finished(streams);
        }
        metrics.source_entries(&inner.name, "relayed", report.relayed);
        metrics.source_entries(&inner.name, "failed", report.failed);
        metrics.source_entries(&inner.name, "dead", report.dead);
        metrics.source_entries(&inner.name, "lease_lost", report.lease_lost);
        if report.lease_lost > 0 {
            tracing::warn!(source = %inner.name, lost = report.lease_lost, "finishes with a lease token no longer in force changed nothing");
        }
        match store_error {
            Some(e) => Err(OutboxError::Ingest(e)),
            None => Ok(report),
        }
    }

    /// Ingest the events of `good` in one store transaction. An event the
    /// store refuses as a conflict moves its node to `dead` (with the
    /// reason) and the rest are tried again. Returns the store's failure,
    /// if any (`good` then holds the nodes to mark failed).
    async fn ingest(
        &self,
        good: &mut Vec<(ClaimedNode, NewEvent)>,
        dead: &mut Vec<(String, String)>,
    ) -> Option<String> {
        let inner = &self.inner;
        let mut store_error = None;
        while !good.is_empty() {
            let events: Vec<NewEvent> = good.iter().map(|(_, e)| e.clone()).collect();
            let ctx = &inner.ctx;
            let call =
                crate::ingest::submit(&*ctx.store, &ctx.routes, &ctx.wake, &ctx.metrics, events);
            let result = match tokio::time::timeout(ctx.db_timeout, call).await {
                Ok(result) => result,
                Err(_) => {
                    store_error = Some(format!("no answer within {:?}", ctx.db_timeout));
                    break;
                }
            };
            match result {
                Ok(_) => break,
                Err(
                    e @ (IngestError::Conflict { .. } | IngestError::SequenceNotIncreasing { .. }),
                ) => {
                    let index = match &e {
                        IngestError::Conflict { index, .. }
                        | IngestError::SequenceNotIncreasing { index, .. } => *index,
                        IngestError::Store(_) => unreachable!(),
                    };
                    let (node, _) = good.remove(index);
                    let reason = e
                        .to_string()
                        .replacen(&format!("event [{index}] "), "event ", 1);
                    tracing::warn!(source = %inner.name, event_id = %node.event_id, %reason, "outbox node refused by the store");
                    dead.push((node.event_id, reason));
                }
                Err(IngestError::Store(e)) => {
                    store_error = Some(e.to_string());
                    break;
                }
            }
        }
        store_error
    }

    /// Retry delay after `attempts` attempts: base × 2^(attempts−1), capped,
    /// with up to 20% jitter.
    fn retry_delay(&self, attempts: i64) -> Duration {
        let c = &self.inner.config;
        let step = attempts.clamp(1, i64::from(u32::MAX)) as u32 - 1;
        let d = Backoff::doubling(c.retry_base, c.retry_cap).delay(step);
        d.mul_f64(1.0 + rand::random::<f64>() * 0.2)
            .min(c.retry_cap)
    }
}
