//! The store's decisions, written once for every backend: pure functions
//! over plain data that say what an ingest inserts, which runs a claim
//! takes, what a batch of finishes changes, whether a stream's head may
//! move, and how a delivery's state is shown. A backend reads a planner's
//! inputs with its own SQL and writes its outputs; it decides nothing.
//!
//! Owns: [`DeliveryStatus`], the one SQL expression that classifies a
//! delivery row and the per-state condition that agrees with it
//! ([`row_state_sql`], [`state_sql`], [`TRIED_SQL`]), [`plan_ingest`], [`take_runs`] and [`cut_runs`],
//! [`FinishPlan`], [`keep_head`], [`pending_migrations`].
//!
//! Must never: touch a database, read a clock, or call the network.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Claimed, Finish, IngestError, IngestItem, Ingested, StoreError, StoredEvent};
use crate::event::NewEvent;

/// A delivery's state as the read API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Waiting for its first attempt.
    Pending,
    /// Under a live lease: being delivered now.
    Leased,
    /// Waiting to be tried again (a failed attempt, or a lease that ran
    /// out unfinished).
    Retrying,
    /// The sink acknowledged it.
    Delivered,
    /// Dead-lettered.
    Dead,
}

impl DeliveryStatus {
    /// The lowercase name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Leased => "leased",
            DeliveryStatus::Retrying => "retrying",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Dead => "dead",
        }
    }
}

impl std::fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for DeliveryStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What [`row_state_sql`] finds a delivery row in: [`DeliveryStatus`] with
/// the run-out lease apart, as the queue figures count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowState {
    /// Waiting for its first attempt.
    Pending,
    /// Waiting to be tried again.
    Retrying,
    /// Under a live lease.
    Leased,
    /// Leased, but the lease ran out unfinished (a worker died).
    Expired,
    /// Acknowledged.
    Delivered,
    /// Dead-lettered.
    Dead,
}

impl RowState {
    /// The state named by [`row_state_sql`]'s value; `None` for another.
    pub fn parse(s: &str) -> Option<RowState> {
        Some(match s {
            "pending" => RowState::Pending,
            "retrying" => RowState::Retrying,
            "leased" => RowState::Leased,
            "expired" => RowState::Expired,
            "delivered" => RowState::Delivered,
            "dead" => RowState::Dead,
            _ => return None,
        })
    }

    /// As the read API shows it: a run-out lease is waiting to retry.
    pub fn shown(self) -> DeliveryStatus {
        match self {
            RowState::Pending => DeliveryStatus::Pending,
            RowState::Retrying | RowState::Expired => DeliveryStatus::Retrying,
            RowState::Leased => DeliveryStatus::Leased,
            RowState::Delivered => DeliveryStatus::Delivered,
            RowState::Dead => DeliveryStatus::Dead,
        }
    }
}

/// The SQL expression that classifies a `deliveries` row as a
/// [`RowState`] name, given the database's now (`now`, in the type of
/// `lease_expires_at`). Every backend's read and figures use it: the one
/// place that says what `pending` with a lease or with attempts means.
pub fn row_state_sql(now: &str) -> String {
    format!(
        "CASE WHEN status = 'dead' THEN 'dead' WHEN status = 'delivered' THEN 'delivered' \
              WHEN lease_expires_at > {now} THEN 'leased' \
              WHEN lease_expires_at IS NOT NULL THEN 'expired' \
              WHEN attempts > 0 THEN 'retrying' ELSE 'pending' END"
    )
}

/// The predicate of the partial index `deliveries_tried` (migration
/// `0012_search_states`): a live delivery that a claim has taken at least
/// once and that is not back to never tried — every row [`row_state_sql`]
/// names `leased`, `expired` or `retrying`, and no other: the batches in
/// flight and the deliveries waiting to retry, few next to a backlog.
pub const TRIED_SQL: &str = "status = 'pending' AND (lease_expires_at IS NOT NULL OR attempts > 0)";

/// The SQL condition on a `deliveries` row that holds exactly when
/// [`row_state_sql`] (with the same `now`) names a state shown as `state`
/// ([`RowState::shown`]: a run-out lease counts as retrying). Written on
/// the plain columns, so the planner can estimate it from the columns'
/// statistics and serve it by the partial indexes:
/// `deliveries_dead` (`status = 'dead'`), `deliveries_finished`
/// (`status = 'delivered'`), `deliveries_live` (`status = 'pending'`) of
/// `migrations/*/0001_initial.sql`, and `deliveries_tried` ([`TRIED_SQL`])
/// of `0012_search_states` for leased and retrying.
///
/// `status = 'pending'` stands for the CASE's "neither dead nor
/// delivered": the table's CHECK allows no other status. Leased and
/// retrying start with [`TRIED_SQL`] word for word, which their own test
/// implies (a lease that runs out later or ran out is not NULL; the last
/// branch tests `attempts > 0`), so it changes no row's answer: it is
/// there so that PostgreSQL and SQLite both see that `deliveries_tried`
/// serves the condition (SQLite uses a partial index only when the query
/// repeats its predicate), and so that the planner's estimate stays as
/// small as those states are.
pub fn state_sql(state: DeliveryStatus, now: &str) -> String {
    match state {
        DeliveryStatus::Pending => {
            "status = 'pending' AND lease_expires_at IS NULL AND attempts <= 0".to_string()
        }
        DeliveryStatus::Leased => format!("{TRIED_SQL} AND lease_expires_at > {now}"),
        DeliveryStatus::Retrying => format!(
            "{TRIED_SQL} AND (lease_expires_at <= {now} \
             OR (lease_expires_at IS NULL AND attempts > 0))"
        ),
        DeliveryStatus::Delivered => "status = 'delivered'".to_string(),
        DeliveryStatus::Dead => "status = 'dead'".to_string(),
    }
}

/// Whether the deliveries in `state` are bounded by what the delivery
/// loops hold rather than by the size of the store, so that a search
/// names them first (`id IN (…)`, read through `deliveries_tried`) rather
/// than testing each event newest first (`EXISTS`): true for leased and
/// retrying, which only a claim makes (the batches in flight, and what
/// waits to retry). Pending, delivered and dead can each be most of the
/// table, where the walk stops after a page. PostgreSQL plans both
/// spellings alike; SQLite follows the spelling.
pub fn state_is_few(state: DeliveryStatus) -> bool {
    matches!(state, DeliveryStatus::Leased | DeliveryStatus::Retrying)
}

/// The sequence `ev` (item `index` of its request) takes on a stream whose
/// last sequence is `last`: the producer's own, which must advance the
/// stream, or the next one.
pub fn next_sequence(index: usize, ev: &NewEvent, last: u64) -> Result<u64, IngestError> {
    match ev.sequence {
        Some(given) if given <= last => Err(IngestError::SequenceNotIncreasing {
            index,
            id: ev.id.clone(),
            stream: ev.stream.clone(),
            given,
            last,
        }),
        Some(given) => Ok(given),
        None => Ok(last + 1),
    }
}

/// Whether `stored` and `new` (same id) are the same event: equal content
/// hashes, or — when the stored row has no hash (enqueued by SQL) — no
/// differing attribute. `Err` lists the attributes that differ.
pub fn same_event(
    stored_hash: Option<&str>,
    stored: &NewEvent,
    new: &NewEvent,
    new_hash: &str,
) -> Result<(), Vec<String>> {
    if stored_hash == Some(new_hash) {
        return Ok(());
    }
    let diff = new.differences(stored);
    if diff.is_empty() && stored_hash.is_none() {
        return Ok(());
    }
    if diff.is_empty() {
        return Err(vec!["content".to_string()]);
    }
    Err(diff)
}

/// What an ingest request already finds stored, read by the backend in
/// its transaction (under its stream locks, where it has them).
#[derive(Debug, Default)]
pub struct IngestInputs {
    /// Events of the request's ids already stored: content hash (`None`
    /// when enqueued by SQL) and the event.
    pub stored: HashMap<String, (Option<String>, StoredEvent)>,
    /// Last sequence of each stream the request touches (absent: 0).
    pub last: BTreeMap<String, u64>,
    /// Streams with events enqueued by SQL and not yet routed: new events
    /// of them wait for the router too, so deliveries keep stream order.
    pub unrouted: BTreeSet<String>,
}

/// A new event to insert: item `index` of the request, at `sequence`.
#[derive(Debug, Clone)]
pub struct NewRow {
    /// Which item of the request it is.
    pub index: usize,
    /// Its position in its stream.
    pub sequence: u64,
    /// Hex SHA-256 of its canonical content (duplicates compare it).
    pub content_hash: String,
    /// False when the router creates its deliveries later.
    pub routed: bool,
}

/// What an ingest request writes, in one transaction.
#[derive(Debug, Default)]
pub struct IngestPlan {
    /// The answer, one per item, in order.
    pub answers: Vec<Ingested>,
    /// New events, in request order.
    pub events: Vec<NewRow>,
    /// New deliveries: (item index, delivery key). The first live delivery
    /// of each (key, stream) becomes its head; later ones wait behind it.
    pub deliveries: Vec<(usize, String)>,
    /// Streams whose last sequence advanced, with the new value.
    pub last_sequences: Vec<(String, u64)>,
    /// Some event waits for the router (wake every loop, not only the keys
    /// of [`IngestPlan::deliveries`]).
    pub route_later: bool,
}

impl IngestPlan {
    /// True when the request queued work for some delivery loop.
    pub fn queued(&self) -> bool {
        self.route_later || !self.deliveries.is_empty()
    }
}

/// Plan an ingest request: duplicates (stored before or earlier in this
/// request) answered with their original sequence, conflicts refused
/// naming the attributes, sequences assigned or checked per stream.
///
/// Errors: [`IngestError::Conflict`], [`IngestError::SequenceNotIncreasing`]
/// — the backend then stores nothing.
pub fn plan_ingest(items: &[IngestItem], inputs: &IngestInputs) -> Result<IngestPlan, IngestError> {
    let mut plan = IngestPlan::default();
    let mut last = inputs.last.clone();
    // New events of this request, by id: (hash, item index, sequence).
    let mut fresh: HashMap<&str, (String, usize, u64)> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let ev = &item.event;
        let hash = ev.content_hash();
        let earlier = match (inputs.stored.get(&ev.id), fresh.get(ev.id.as_str())) {
            (Some((stored_hash, s)), _) => Some((stored_hash.as_deref(), &s.event, s.sequence)),
            (None, Some((h, i, seq))) => Some((Some(h.as_str()), &items[*i].event, *seq)),
            (None, None) => None,
        };
        if let Some((earlier_hash, earlier_event, sequence)) = earlier {
            match same_event(earlier_hash, earlier_event, ev, &hash) {
                Ok(()) => {
                    plan.answers.push(Ingested {
                        id: ev.id.clone(),
                        stream: earlier_event.stream.clone(),
                        sequence,
                        duplicate: true,
                        deliveries_queued: 0,
                    });
                    continue;
                }
                Err(attributes) => {
                    return Err(IngestError::Conflict {
                        index,
                        id: ev.id.clone(),
                        attributes,
                    })
                }
            }
        }
        let prev = last.get(&ev.stream).copied().unwrap_or(0);
        let sequence = next_sequence(index, ev, prev)?;
        last.insert(ev.stream.clone(), sequence);
        let routed = !inputs.unrouted.contains(&ev.stream);
        if routed {
            plan.deliveries
                .extend(item.sinks.iter().map(|sink| (index, sink.clone())));
        } else {
            plan.route_later = true;
        }
        plan.events.push(NewRow {
            index,
            sequence,
            content_hash: hash.clone(),
            routed,
        });
        fresh.insert(ev.id.as_str(), (hash, index, sequence));
        plan.answers.push(Ingested {
            id: ev.id.clone(),
            stream: ev.stream.clone(),
            sequence,
            duplicate: false,
            deliveries_queued: if routed { item.sinks.len() as u64 } else { 0 },
        });
    }
    plan.last_sequences = last
        .into_iter()
        .filter(|(s, n)| inputs.last.get(s) != Some(n))
        .collect();
    Ok(plan)
}

/// Fill a claim: the `heads` taken (stream, delivery id), then the
/// deliveries behind them (`followers`: id, stream, whether it may be
/// taken now — due and not leased — in stream then sequence order). Each
/// stream's run stops at its first follower that may not be taken; the
/// batch stops at `limit`. Returns (stream, id) in claim order: heads
/// first, then each stream's run in sequence order.
pub fn take_runs(
    heads: &[(String, i64)],
    followers: impl IntoIterator<Item = (i64, String, bool)>,
    limit: usize,
) -> Vec<(String, i64)> {
    let mut order: Vec<(String, i64)> = heads.to_vec();
    let mut stopped: BTreeSet<String> = BTreeSet::new();
    for (id, stream, eligible) in followers {
        if order.len() >= limit {
            break;
        }
        if stopped.contains(&stream) {
            continue;
        }
        if !eligible {
            stopped.insert(stream);
            continue;
        }
        order.push((stream, id));
    }
    order
}

/// Cut claim runs for a chained sink. `order` lists (stream, delivery id)
/// as claimed: heads first, then each stream's run in sequence order.
/// Each stream keeps its ids up to the first `blocked` one (its `after`
/// sink has not delivered that event yet). Returns the kept ids, the
/// streams that kept their head, and the streams whose head is held back.
pub fn cut_runs(
    order: &[(String, i64)],
    heads: &[(String, i64)],
    blocked: &HashSet<i64>,
) -> (Vec<i64>, Vec<String>, Vec<String>) {
    let mut stopped = HashSet::new();
    let mut kept = Vec::new();
    for (stream, id) in order {
        if stopped.contains(stream) {
            continue;
        }
        if blocked.contains(id) {
            stopped.insert(stream.clone());
            continue;
        }
        kept.push(*id);
    }
    let (held, claimed): (Vec<_>, Vec<_>) = heads.iter().partition(|(_, id)| blocked.contains(id));
    (
        kept,
        claimed.into_iter().map(|(s, _)| s.clone()).collect(),
        held.into_iter().map(|(s, _)| s.clone()).collect(),
    )
}

/// How long a chained sink's held-back head waits before it is looked at
/// again, ms.
pub const AFTER_RECHECK_MS: i64 = 1_000;

/// A delivery row as a claim's update returned it.
pub struct LeasedRow {
    /// The delivery's row id.
    pub delivery_id: i64,
    /// Its event's id.
    pub event_id: String,
    /// Attempts including this one.
    pub attempts: u32,
    /// When its first attempt was claimed, Unix ms (database clock).
    pub first_attempt_at_ms: i64,
    /// Database time of this claim, Unix ms.
    pub claimed_at_ms: i64,
}

/// Join leased rows with their events into the batch, in the order the
/// sink contract wants: by stream, then sequence.
///
/// Errors: [`StoreError::Corrupt`] when a delivery's event is missing.
pub fn assemble_claims(
    rows: Vec<LeasedRow>,
    events: &BTreeMap<String, StoredEvent>,
    token: &str,
) -> Result<Vec<Claimed>, StoreError> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let event = events.get(&row.event_id).cloned().ok_or_else(|| {
            StoreError::Corrupt(format!(
                "delivery refers to missing event {:?}",
                row.event_id
            ))
        })?;
        claimed.push(Claimed {
            delivery_id: row.delivery_id,
            lease_token: token.to_string(),
            attempts: row.attempts,
            first_attempt_at_ms: row.first_attempt_at_ms,
            claimed_at_ms: row.claimed_at_ms,
            event,
        });
    }
    claimed.sort_by(|a, b| {
        (a.event.event.stream.as_str(), a.event.sequence)
            .cmp(&(b.event.event.stream.as_str(), b.event.sequence))
    });
    Ok(claimed)
}

/// A fenced change: (delivery id, lease token).
pub type Fenced<'a> = (i64, &'a str);

/// What a batch of finishes writes, by kind, in the order a backend must
/// apply them (see [`FinishPlan::new`]).
#[derive(Debug, Default)]
pub struct FinishPlan<'a> {
    /// Acknowledged.
    pub delivered: Vec<Fenced<'a>>,
    /// With the delay in ms and the reason.
    pub retry: Vec<(Fenced<'a>, i64, &'a str)>,
    /// With the reason and whether it blocks its stream.
    pub dead: Vec<(Fenced<'a>, &'a str, bool)>,
    /// Given back untried, the attempt not charged.
    pub release: Vec<Fenced<'a>>,
    /// Blocking dead letters: the backend asks which of them sit behind an
    /// undelivered earlier delivery *after* applying `delivered` and
    /// `retry`, and passes them to [`FinishPlan::settle`].
    pub blocking: Vec<i64>,
}

impl<'a> FinishPlan<'a> {
    /// Sort `items` (delivery id, lease token, outcome) by kind. Dead
    /// letters are settled later by [`FinishPlan::settle`].
    ///
    /// The order a backend applies the plan in is part of the protocol
    /// (model/README.md): delivered, retry, then the blocking check, then
    /// dead, then release; heads last.
    pub fn new(items: &'a [(i64, &'a str, &'a Finish)]) -> FinishPlan<'a> {
        let mut plan = FinishPlan::default();
        for (id, token, finish) in items {
            let fenced = (*id, *token);
            match finish {
                Finish::Delivered => plan.delivered.push(fenced),
                Finish::Retry { delay, reason } => {
                    plan.retry
                        .push((fenced, delay.as_millis() as i64, reason.as_str()))
                }
                Finish::Dead { blocks_stream, .. } => {
                    if *blocks_stream {
                        plan.blocking.push(*id);
                    }
                }
                Finish::Release => plan.release.push(fenced),
            }
        }
        plan
    }

    /// Place the dead letters of `items`: a blocking one that sits behind
    /// an undelivered earlier delivery (`behind`: its lease was taken over
    /// after this batch was claimed, model/README.md
    /// `NO_BLOCK_HEAD_CHECK`) is released to wait behind it instead.
    pub fn settle(&mut self, items: &'a [(i64, &'a str, &'a Finish)], behind: &HashSet<i64>) {
        for (id, token, finish) in items {
            if let Finish::Dead {
                reason,
                blocks_stream,
            } = finish
            {
                if behind.contains(id) {
                    self.release.push((*id, *token));
                } else {
                    self.dead
                        .push(((*id, *token), reason.as_str(), *blocks_stream));
                }
            }
        }
    }
}

/// A finish a backend kept (the fence held): (delivery, sink, stream).
pub type KeptRow = (i64, String, String);

/// What a batch's kept finishes do to heads.
#[derive(Debug, Default)]
pub struct HeadChanges {
    /// Delivered or moved-on dead: a head on it moves to its stream's first
    /// live delivery, or goes when there is none.
    pub moved: Vec<KeptRow>,
    /// Blocking dead letters: each becomes its stream's head, due never.
    pub blocked: Vec<KeptRow>,
    /// Retried or released: a head on it takes its next attempt time.
    pub waiting: Vec<KeptRow>,
}

impl HeadChanges {
    /// File the kept dead letters of `plan`: a blocking one becomes its
    /// stream's head, due never; any other moves its stream on.
    pub fn add_dead(&mut self, kept: Vec<KeptRow>, plan: &FinishPlan<'_>) {
        let blocking: HashSet<i64> = plan
            .dead
            .iter()
            .filter(|(_, _, blocks)| *blocks)
            .map(|((id, _), _, _)| *id)
            .collect();
        for row in kept {
            if blocking.contains(&row.0) {
                self.blocked.push(row);
            } else {
                self.moved.push(row);
            }
        }
    }

    /// Per item of the batch, whether its lease was still held.
    pub fn kept(&self, items: &[(i64, &str, &Finish)]) -> Vec<bool> {
        let held: HashSet<i64> = self
            .moved
            .iter()
            .chain(&self.blocked)
            .chain(&self.waiting)
            .map(|row| row.0)
            .collect();
        items.iter().map(|(id, _, _)| held.contains(id)).collect()
    }
}

/// A backfill page as read (`seq_id` and the event, in `seq_id` order, at
/// most `page` of them) and what to do with it: the events whose routes
/// include `key` ([`RouteFn`](super::RouteFn)), and the page's figures
/// once `created` deliveries were made — the next cursor is the last
/// `seq_id` of a full page, none after a short one.
pub struct BackfillRead {
    /// The events of the page whose routes include the key.
    pub routed: Vec<StoredEvent>,
    /// Events looked at.
    pub scanned: u64,
    next_after: Option<i64>,
}

impl BackfillRead {
    /// Sort a page read from the store.
    pub fn new(
        rows: Vec<(i64, StoredEvent)>,
        page: u32,
        key: &str,
        route: &super::RouteFn<'_>,
    ) -> BackfillRead {
        let scanned = rows.len() as u64;
        let full = rows.len() == page as usize;
        let next_after = rows.last().map(|(seq, _)| *seq).filter(|_| full);
        let routed = rows
            .into_iter()
            .map(|(_, event)| event)
            .filter(|stored| route(&stored.event).iter().any(|s| s == key))
            .collect();
        BackfillRead {
            routed,
            scanned,
            next_after,
        }
    }

    /// The page's figures.
    pub fn done(&self, created: u64) -> super::BackfillPage {
        super::BackfillPage {
            scanned: self.scanned,
            created,
            next_after: self.next_after,
        }
    }
}

/// Whether a reset (after a replay, a backfill or a purge) leaves the head
/// of a (key, stream) where it is: a head blocked by a dead letter stays
/// unless that letter is among `unblocking` (being replayed). What a
/// backfill or the replay of other letters adds waits behind the block.
/// `current`: the head's delivery and whether it is blocked; `None` when
/// the stream has no head.
pub fn keep_head(current: Option<(i64, bool)>, unblocking: &[i64]) -> bool {
    matches!(current, Some((id, true)) if !unblocking.contains(&id))
}

/// Names (`VERSION_description`) of `migrator`'s migrations not among
/// `applied` (versions).
pub fn pending_migrations(migrator: &sqlx::migrate::Migrator, applied: &[i64]) -> Vec<String> {
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|m| format!("{}_{}", m.version, m.description.replace(' ', "_")))
        .collect()
}
