//! The relay loop: prepare (the password variable), connect, create the
//! indexes, then claim cycles — ingest each claimed batch through
//! [`crate::ingest::submit`], finish its nodes fenced (at once, or with
//! `delivered-when = "acknowledged"` once every destination acknowledged,
//! renewing their leases meanwhile), retry failed ones with backoff, report
//! the nodes it cannot read — renewing the reachability check `/ready`
//! shows.
//!
//! Must never: finish a node before its event is stored (or, when waiting
//! for acknowledgements, before they came), or let a store failure lose a
//! claimed node (it is marked failed, to retry).

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
    /// Nodes taken over from an expired (or unreadable, waited-out) lease.
    pub reclaimed: u64,
    /// Stored and now waiting for their destinations' acknowledgements
    /// (`delivered-when = "acknowledged"`).
    pub awaiting: u64,
}

/// A node stored in outboxd whose destinations have not all acknowledged
/// its event yet (`delivered-when = "acknowledged"`).
#[derive(Debug, Clone)]
struct Awaiting {
    token: String,
    stream: Option<String>,
    /// When its lease was last set (claim or renewal).
    leased_at: Instant,
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
    /// `event.type`, parsed once.
    type_template: Option<crate::sources::template::Template>,
    /// By event id: nodes waiting for acknowledgements, at most
    /// [`AWAITING_BATCHES`] × `batch-size`.
    awaiting: Mutex<BTreeMap<String, Awaiting>>,
}

/// With `delivered-when = "acknowledged"`, claims stop while this many
/// batches of nodes wait for their acknowledgements.
const AWAITING_BATCHES: usize = 20;
/// With nodes waiting for acknowledgements and nothing claimed, the pause
/// before the store is asked again.
const AWAITING_POLL: Duration = Duration::from_millis(50);

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
        let type_template =
            match &config.event.type_template {
                Some(text) => Some(crate::sources::template::Template::parse(text).map_err(
                    |e| OutboxError::Config(format!("key `sources.{name}.event.type`: {e}")),
                )?),
                None => None,
            };
        Ok(Relay {
            inner: Arc::new(RelayInner {
                type_template,
                name: name.to_string(),
                config,
                password,
                ctx,
                awaiting: Mutex::new(BTreeMap::new()),
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
                    tracing::warn!(source = %inner.name, nodes = n, "outbox nodes without a usable event id refused");
                    metrics.source_entries(&inner.name, "dead", n);
                }
                outbox.sweep_unknown_statuses(MISSING_ID_BATCH).await?;
            }
            for m in outbox.take_malformed() {
                tracing::warn!(source = %inner.name, event_id = %m.event_id, property = %m.property, consequence = m.consequence, "outbox node property not as configured");
                metrics.source_entries(&inner.name, "malformed", 1);
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
            let pause = if inner.awaiting.lock().unwrap().is_empty() {
                inner.config.poll_interval
            } else {
                AWAITING_POLL.min(inner.config.poll_interval)
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
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
        let mut report = CycleReport::default();
        let acknowledged = inner.config.delivered_when == DeliveredWhen::Acknowledged;
        if acknowledged {
            self.settle(outbox, &mut report).await?;
        }
        let batch = inner.config.batch_size as usize;
        let room = if acknowledged {
            (batch * AWAITING_BATCHES).saturating_sub(inner.awaiting.lock().unwrap().len())
        } else {
            batch
        };
        let claimed = if room == 0 {
            Vec::new()
        } else {
            outbox.claim(room.min(batch)).await?
        };
        report.claimed = claimed.len();
        report.reclaimed = claimed.iter().filter(|n| n.reclaimed).count() as u64;
        let Some(token) = claimed.first().map(|n| n.lease_token.clone()) else {
            self.count(&report);
            return Ok(report);
        };
        if report.reclaimed > 0 {
            tracing::info!(source = %inner.name, nodes = report.reclaimed, "took over in-flight nodes whose lease had run out (or could not be read and was waited out)");
        }
        let streams: Vec<String> = claimed.iter().filter_map(|n| n.stream.clone()).collect();
        let mut dead: Vec<(String, String)> = Vec::new();
        let mut good: Vec<(ClaimedNode, NewEvent)> = Vec::new();
        for node in claimed {
            match to_event(
                &inner.config,
                inner.type_template.as_ref(),
                &inner.name,
                &node,
            ) {
                Ok(ev) => good.push((node, ev)),
                Err(reason) => {
                    tracing::warn!(source = %inner.name, event_id = %node.event_id, %reason, "outbox node refused");
                    dead.push((node.event_id, reason));
                }
            }
        }
        let store_error = self.ingest(&mut good, &mut dead).await;
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
        } else if acknowledged {
            // Stored: the node stays in flight until its destinations have
            // it ([`Relay::settle`]).
            let mut awaiting = inner.awaiting.lock().unwrap();
            for (node, _) in &good {
                awaiting.insert(
                    node.event_id.clone(),
                    Awaiting {
                        token: token.clone(),
                        stream: node.stream.clone(),
                        leased_at: Instant::now(),
                    },
                );
            }
            report.awaiting += good.len() as u64;
            drop(awaiting);
            // The refused ones' streams moved on.
            outbox.note_finished(claimed_streams_of(
                &streams,
                &good.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            ));
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
        self.count(&report);
        match store_error {
            Some(e) => Err(OutboxError::Ingest(e)),
            None => Ok(report),
        }
    }

    /// Count `report` in the metrics and warn of lost leases.
    fn count(&self, report: &CycleReport) {
        let inner = &self.inner;
        let metrics = &inner.ctx.metrics;
        metrics.source_entries(&inner.name, "relayed", report.relayed);
        metrics.source_entries(&inner.name, "failed", report.failed);
        metrics.source_entries(&inner.name, "dead", report.dead);
        metrics.source_entries(&inner.name, "lease_lost", report.lease_lost);
        metrics.source_entries(&inner.name, "reclaimed", report.reclaimed);
        if report.lease_lost > 0 {
            tracing::warn!(source = %inner.name, lost = report.lease_lost, "finishes with a lease token no longer in force changed nothing");
        }
    }

    /// The nodes waiting for acknowledgements: those whose every delivery
    /// was acknowledged (or that have none) are marked delivered, those
    /// with a dead-lettered delivery and none open are marked refused, the
    /// rest have their leases renewed once a third of the lease has passed.
    /// A node whose lease was lost meanwhile is forgotten (its new holder
    /// finishes it).
    async fn settle(&self, outbox: &Outbox, report: &mut CycleReport) -> Result<(), OutboxError> {
        let inner = &self.inner;
        let waiting: Vec<(String, Awaiting)> = inner
            .awaiting
            .lock()
            .unwrap()
            .iter()
            .map(|(id, a)| (id.clone(), a.clone()))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = waiting.iter().map(|(id, _)| id.clone()).collect();
        let ctx = &inner.ctx;
        let progress =
            match tokio::time::timeout(ctx.db_timeout, ctx.store.delivery_progress(&ids)).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => return Err(OutboxError::Ingest(e.to_string())),
                Err(_) => {
                    return Err(OutboxError::Ingest(format!(
                        "no answer within {:?}",
                        ctx.db_timeout
                    )))
                }
            };
        // By lease token: (delivered ids, refused (id, reason), to renew).
        type Groups = BTreeMap<String, (Vec<String>, Vec<(String, String)>, Vec<String>)>;
        let mut groups: Groups = BTreeMap::new();
        let renew_after = inner.config.lease / 3;
        for (id, a) in &waiting {
            let group = groups.entry(a.token.clone()).or_default();
            match progress.get(id) {
                None => group.0.push(id.clone()),
                Some(p) if p.open == 0 && p.dead == 0 => group.0.push(id.clone()),
                Some(p) if p.open == 0 => group.1.push((
                    id.clone(),
                    format!(
                        "dead-lettered in outboxd: {}",
                        p.dead_reason.as_deref().unwrap_or("no reason recorded")
                    ),
                )),
                Some(_) if a.leased_at.elapsed() >= renew_after => group.2.push(id.clone()),
                Some(_) => {}
            }
        }
        let mut done: Vec<String> = Vec::new();
        let mut moved_on: Vec<String> = Vec::new();
        for (token, (delivered, refused, renew)) in groups {
            if !delivered.is_empty() {
                let n = delivered.len() as u64;
                let kept = outbox.finish_delivered(&token, delivered.clone()).await?;
                report.relayed += kept;
                report.lease_lost += n - kept;
                done.extend(delivered);
            }
            if !refused.is_empty() {
                let n = refused.len() as u64;
                for (id, reason) in &refused {
                    tracing::warn!(source = %inner.name, event_id = %id, %reason, "outbox node refused");
                }
                done.extend(refused.iter().map(|(id, _)| id.clone()));
                let kept = outbox.finish_dead(&token, refused).await?;
                report.dead += kept;
                report.lease_lost += n - kept;
            }
            if !renew.is_empty() {
                let kept = outbox.renew(&token, renew.clone()).await?;
                let mut awaiting = inner.awaiting.lock().unwrap();
                for id in &renew {
                    if kept.contains(id) {
                        if let Some(a) = awaiting.get_mut(id) {
                            a.leased_at = Instant::now();
                        }
                    } else {
                        report.lease_lost += 1;
                        awaiting.remove(id);
                    }
                }
            }
        }
        let mut awaiting = inner.awaiting.lock().unwrap();
        for id in done {
            if let Some(a) = awaiting.remove(&id) {
                moved_on.extend(a.stream);
            }
        }
        drop(awaiting);
        outbox.note_finished(moved_on);
        Ok(())
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

    /// Nodes waiting for their destinations' acknowledgements.
    pub fn awaiting(&self) -> usize {
        self.inner.awaiting.lock().unwrap().len()
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

/// The streams of `claimed` that are not among `kept` (their nodes were
/// refused, so the stream moved on).
fn claimed_streams_of(claimed: &[String], kept: &[&ClaimedNode]) -> Vec<String> {
    let kept: HashSet<&str> = kept.iter().filter_map(|n| n.stream.as_deref()).collect();
    claimed
        .iter()
        .filter(|s| !kept.contains(s.as_str()))
        .cloned()
        .collect()
}
