//! One delivery key's loop: takes the [`Target`] the key is served by,
//! runs a [`super::turn`] whenever work may be due (more than one batch at
//! once while claims come back full, `delivery.batches-in-flight`), and
//! decides how long to sleep between turns — at once after a full batch;
//! otherwise until the next due time, a wake-up from ingest, a swap of the
//! target, or the maximum poll interval; longer while paused, quarantined
//! or failing.
//!
//! Must never: hold a lease while sleeping (a rate-limited key takes its
//! permits before it claims), let a wake-up end a quarantine, or leave a
//! turn unpolled while the loop awaits something else (each turn is a
//! task of its own: a finish in a turn holds heads locked).

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use super::quarantine::TrapCounter;
use super::turn::{turn, TurnError, TurnReport};
use super::{stale_after, target, Shared, Target};
use crate::backoff::Backoff;
use crate::metrics::PluginLabel;

/// How long a paused sink's loop waits before looking again (and how
/// long the pause read is reused: [`super::paused`]).
pub(super) const PAUSE_RECHECK: Duration = Duration::from_secs(1);

/// The first backoff after a failed turn; doubled per failure in a row, up
/// to the poll interval (at least [`FAILURE_BACKOFF_CAP`]).
const FAILURE_BACKOFF: Duration = Duration::from_millis(100);

/// The least cap on the failure backoff, whatever the poll interval.
const FAILURE_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Run the delivery loop of one delivery key — a sink, or one destination
/// of a sink (`crate::destinations`) — until `shutdown` turns true or the
/// sender of `current` is dropped. An in-flight batch is finished before
/// the loop returns.
///
/// `current` holds the [`Target`] the key is served by (see
/// `plugin::registry` and `crate::destinations`): each batch runs on the
/// plugin version current when it starts. While it holds `None` the sink
/// was removed: nothing is claimed, its deliveries wait (no busy loop, no
/// dead letters), and the loop resumes when a version comes back. Metrics
/// are labelled by the plugin's sink name, never by the key.
pub async fn run_sink(
    shared: Shared,
    sink: String,
    mut current: watch::Receiver<Option<Target>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = &shared.config;
    let mut state = LoopState::new(sink.clone());
    let key_wake = shared.wake.subscribe(&sink);
    tracing::info!(sink = %sink, lease = ?config.lease, "delivery loop started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        state.refresh(&shared, &mut current);
        let Some(target) = state.serving.clone() else {
            // Removed: beat (the loop is alive and means to be idle) and
            // wait for the plugin to come back.
            shared.heartbeats.turn(&sink, true);
            tokio::select! {
                changed = current.changed() => {
                    if changed.is_err() {
                        break; // the registry is gone: no version will come
                    }
                    state.swapped = true;
                }
                _ = tokio::time::sleep(config.max_poll_interval) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        };
        if let Some(left) = state.quarantine_left() {
            // Beat at least every poll interval, so a quarantine longer
            // than the stale limit does not make /health fail.
            shared.heartbeats.turn(&sink, true);
            tokio::select! {
                _ = tokio::time::sleep(left.min(config.max_poll_interval)) => {}
                Ok(()) = current.changed() => state.swapped = true,
                _ = shutdown.changed() => {}
            }
            continue;
        }
        // Register for wake-ups before looking, so an ingest between the
        // look and the sleep is not missed.
        let notified = shared.wake.all().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let notified_key = key_wake.notified();
        tokio::pin!(notified_key);
        notified_key.as_mut().enable();

        // A sink paused by an operator holds every destination of it too.
        let paused = shared
            .paused
            .any(
                &*shared.store,
                config.db_timeout,
                &[&sink, target.plugin.name()],
            )
            .await;
        let held = paused || target.hold.is_some();
        let sleep = if held {
            shared.heartbeats.turn(&sink, true);
            PAUSE_RECHECK
        } else {
            state.run_turns(&shared, &target, &shutdown, &current).await
        };
        if sleep.is_zero() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = &mut notified, if !held => {}
            _ = &mut notified_key, if !held => {}
            Ok(()) = current.changed() => state.swapped = true,
            _ = shutdown.changed() => {}
        }
    }
    tracing::info!(sink = %sink, "delivery loop stopped");
}

/// What one key's loop keeps from turn to turn.
struct LoopState {
    key: String,
    /// Read at the first turn, and whenever the registry swaps it.
    serving: Option<Target>,
    traps: TrapCounter,
    /// While set and in the future the key is quarantined: nothing is
    /// claimed, ingest wake-ups do not end it, the loop still beats.
    quarantined_until: Option<Instant>,
    /// The next claim's size: halved after a batch that ran out of time or
    /// memory, grown back after batches that get their outcomes.
    batch_limit: u32,
    /// Set when a wait saw `current` change (which marks it seen).
    swapped: bool,
}

impl LoopState {
    fn new(key: String) -> LoopState {
        LoopState {
            key,
            serving: None,
            traps: TrapCounter::default(),
            quarantined_until: None,
            batch_limit: u32::MAX,
            swapped: true,
        }
    }

    /// Take the target `current` holds when it changed (and at the first
    /// turn): trap counts, quarantine and batch size start afresh.
    fn refresh(&mut self, shared: &Shared, current: &mut watch::Receiver<Option<Target>>) {
        if !(self.swapped || current.has_changed().unwrap_or(false)) {
            return;
        }
        self.swapped = false;
        self.serving = current.borrow_and_update().clone();
        self.traps.reset(&shared.quarantines, &self.key);
        self.quarantined_until = None;
        self.batch_limit = u32::MAX;
        if let Some(Target { plugin, .. }) = &self.serving {
            shared.metrics.sink_started(plugin.name());
            shared.heartbeats.register(
                &self.key,
                stale_after(&shared.config, plugin.manifest().limits.deadline),
            );
        }
    }

    /// The quarantine time left, when the key is quarantined.
    fn quarantine_left(&self) -> Option<Duration> {
        self.quarantined_until
            .and_then(|t| t.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }

    /// Run turns of `target` until a claim comes back short, with up to
    /// `delivery.batches-in-flight` batches going at once: after a claim
    /// that came back full, the next batch is claimed while the earlier
    /// ones are still being delivered. No turn starts once `shutdown` is
    /// set, the target is swapped or the key paused; those in flight are
    /// finished. Returns how long to sleep before the next turn (zero: go
    /// again at once), as the last turn to finish asked.
    async fn run_turns(
        &mut self,
        shared: &Shared,
        target: &Target,
        shutdown: &watch::Receiver<bool>,
        current: &watch::Receiver<Option<Target>>,
    ) -> Duration {
        // A destination's in-flight cap counts deliveries: one batch at a
        // time keeps it.
        let depth = match target.max_in_flight {
            Some(_) => 1,
            None => shared.config.batches_in_flight.max(1) as usize,
        };
        // Each turn is a task of its own: a turn inside a finish holds its
        // heads locked (and a pool connection), so it must make progress
        // whatever this loop awaits meanwhile (the pause read, a rate
        // permit, the next due time), or an ingest of those heads waits
        // on a turn nobody polls.
        let mut running = JoinSet::new();
        let mut claims = FuturesUnordered::new();
        let mut sleep = Duration::ZERO;
        let mut start = true;
        loop {
            if start
                && running.len() < depth
                && self
                    .may_start(shared, target, shutdown, current, running.is_empty())
                    .await
            {
                start = false;
                let (limit, batch_size) = self.claim_size(shared, target).await;
                let (full, claimed) = oneshot::channel();
                let (shared, target, key) = (shared.clone(), target.clone(), self.key.clone());
                running.spawn(async move {
                    let ran = bounded_turn(&shared, &target, &key, limit, full).await;
                    (ran, batch_size)
                });
                claims.push(claimed);
            }
            if running.is_empty() {
                return sleep;
            }
            tokio::select! {
                Some(full) = claims.next() => start = matches!(full, Ok(true)),
                Some(joined) = running.join_next() => {
                    let (ran, batch_size) =
                        joined.unwrap_or_else(|e| (Err(TurnError::Aborted(e)), 0));
                    sleep = self.settle(shared, target, batch_size, ran).await;
                    if !sleep.is_zero() || self.quarantine_left().is_some() {
                        start = false;
                    }
                }
            }
        }
    }

    /// Whether another turn may start now. The first of a round always may
    /// (the loop checked pause and shutdown just before); a further one
    /// only while nothing asks the loop to stop and look again.
    async fn may_start(
        &self,
        shared: &Shared,
        target: &Target,
        shutdown: &watch::Receiver<bool>,
        current: &watch::Receiver<Option<Target>>,
        first: bool,
    ) -> bool {
        if first {
            return true;
        }
        if *shutdown.borrow()
            || current.has_changed().unwrap_or(true)
            || self.quarantine_left().is_some()
        {
            return false;
        }
        let names = [self.key.as_str(), target.plugin.name()];
        !shared
            .paused
            .any(&*shared.store, shared.config.db_timeout, &names)
            .await
    }

    /// The next claim's size and the key's full batch size. A rate-limited
    /// key takes its permits here, before it claims, so it never holds a
    /// lease while it waits for one.
    async fn claim_size(&mut self, shared: &Shared, target: &Target) -> (u32, u32) {
        let limits = &target.plugin.manifest().limits;
        let batch_size = target
            .max_in_flight
            .map_or(limits.max_batch, |cap| cap.min(limits.max_batch));
        self.batch_limit = self.batch_limit.min(batch_size);
        let limit = match target.rate.as_deref() {
            None => self.batch_limit,
            Some(rate) => match target::take_permits(rate, self.batch_limit) {
                0 => {
                    shared.heartbeats.turn(&self.key, true);
                    rate.until_ready().await;
                    1
                }
                n => n,
            },
        };
        (limit, batch_size)
    }

    /// Learn from a finished turn; the sleep before the next.
    async fn settle(
        &mut self,
        shared: &Shared,
        target: &Target,
        batch_size: u32,
        ran: Ran,
    ) -> Duration {
        match ran {
            Ok(report) => self.after_turn(shared, target, batch_size, report).await,
            Err(e) => self.after_failure(shared, &e),
        }
    }

    /// Learn from a turn that ran: beat, resize the batch, count a batch
    /// that failed as a whole towards quarantine; the sleep before the next
    /// turn.
    async fn after_turn(
        &mut self,
        shared: &Shared,
        target: &Target,
        batch_size: u32,
        report: TurnReport,
    ) -> Duration {
        let config = &shared.config;
        let key = &self.key;
        shared.heartbeats.turn(key, true);
        if report.claimed > 0 {
            shared
                .heartbeats
                .outcome(key, report.delivered, report.last_error.as_deref());
        }
        // A batch that runs out of time or memory loses every outcome in
        // it, so the same batch from the same head would fail the same way
        // again: halve the batch after either (down to one event, which
        // then fails or succeeds on its own), grow it back after batches
        // that get their outcomes. A batch cut to fit
        // `limits.max-batch-bytes` sets the next claim's size.
        if report.shrink {
            self.batch_limit = (self.batch_limit / 2).max(1);
            tracing::warn!(sink = %key, batch_limit = self.batch_limit, "batch ran out of time or memory; batch size halved");
        } else if let Some(fitted) = report.fitted {
            self.batch_limit = fitted.max(1);
        } else if report.claimed > 0 && report.failure.is_none() {
            self.batch_limit = self.batch_limit.saturating_mul(2).min(batch_size);
        }
        // Counted per batch attempted: a turn that claimed nothing (the
        // usual turn after a failure, whose deliveries wait for their
        // retry) changes nothing.
        let quarantine = match (&report.failure, report.claimed) {
            (_, 0) => None,
            (Some(failure), _) => self.traps.failed(
                &shared.quarantines,
                key,
                &failure.to_string(),
                config.quarantine_after_traps,
                config.quarantine_backoff,
            ),
            (None, _) => {
                self.traps.answered(&shared.quarantines, key);
                None
            }
        };
        if let Some(backoff) = quarantine {
            let plugin = target.plugin.name().to_string();
            shared
                .metrics
                .plugin_quarantines
                .get_or_create(&PluginLabel { plugin })
                .inc();
            tracing::error!(
                sink = %key, pause = ?backoff,
                "plugin quarantined after {} batches in a row failed as a whole; deliveries wait",
                config.quarantine_after_traps.max(1)
            );
            self.quarantined_until = Some(Instant::now() + backoff);
            return Duration::ZERO;
        }
        if report.claimed > 0 {
            // More may be due at once: go again without sleeping.
            return Duration::ZERO;
        }
        let next = tokio::time::timeout(config.db_timeout, shared.store.next_due_in(key)).await;
        match next {
            Ok(Ok(Some(wait))) => wait.min(config.max_poll_interval),
            Ok(Ok(None)) => target.idle_poll.unwrap_or(config.max_poll_interval),
            Ok(Err(e)) => {
                tracing::warn!(sink = %key, "next due time: {e}");
                config.max_poll_interval
            }
            Err(_) => config.max_poll_interval,
        }
    }

    /// After a turn that failed (a database call, or its deadline): count
    /// it and back off, doubling per failure in a row.
    fn after_failure(&self, shared: &Shared, error: &TurnError) -> Duration {
        let failures = shared.heartbeats.turn(&self.key, false);
        let cap = shared.config.max_poll_interval.max(FAILURE_BACKOFF_CAP);
        let backoff = Backoff::doubling(FAILURE_BACKOFF, cap).delay(failures);
        tracing::warn!(sink = %self.key, consecutive_failures = failures, "delivery turn failed: {error}");
        backoff
    }
}

/// What a turn bounded by its deadline came to: its report, or why it
/// did not run to its end (a database call, the deadline it ran past).
type Ran = Result<TurnReport, TurnError>;

/// Claim, deliver and finish one batch of at most `limit` deliveries of
/// `target`, bounded by the turn deadline: the plugin's deadline plus its
/// database calls; past it the turn is abandoned (its leases then expire
/// and others take over).
async fn bounded_turn(
    shared: &Shared,
    target: &Target,
    key: &str,
    limit: u32,
    full: oneshot::Sender<bool>,
) -> Ran {
    let config = &shared.config;
    let deadline = target.plugin.manifest().limits.deadline + config.db_timeout * 3;
    tokio::time::timeout(
        deadline,
        turn(shared, target, key, limit, config.lease, Some(full)),
    )
    .await
    .unwrap_or(Err(TurnError::Deadline(deadline)))
}
