//! The destinations a running daemon routes by and serves.
//!
//! Owns: [`Live`], the [`Snapshot`] of every destination as last read
//! from the store — refreshed every `destinations.refresh-interval` and at
//! once after a change made through this process, so every replica routes
//! by the same set without a restart — and [`serve_sink`], which keeps one
//! delivery loop per delivery key of a sink (the sink itself, and each of
//! its destinations), each fed the [`Target`] built from the destination's
//! record: its merged configuration (its sealed secrets opened here, with
//! the keyring [`Live`] holds), hold (paused, disabled, or a secret that
//! cannot be opened), rate, cap, retry override and health tracker.
//!
//! Must never: stop a loop that may hold work except by its destination
//! being deleted (its deliveries then wait, parked, under its name), or
//! route by a record it could not read (it is logged and skipped). A
//! destination whose secret cannot be opened is still routed to: its
//! deliveries wait, held with the reason, and the supervisor tries again
//! every second (reloading the key file).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::{Quota, RateLimiter};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::health::{Health, Tracker};
use super::sealing::SealingError;
use super::{now_ms, Destination, RetryOverride, Snapshot, State};
use crate::delivery::{Shared, Target, TurnObserver};
use crate::plugin::manifest::RetryPolicy;
use crate::plugin::Plugin;
use crate::secrets::Secrets;
use crate::store::{Store, StoreError};

/// The live set of destinations of this process.
pub struct Live {
    store: Arc<dyn Store>,
    /// The keyring the destinations' sealed secrets are opened with.
    secrets: Arc<Secrets>,
    tx: watch::Sender<Arc<Snapshot>>,
    changed: Notify,
    /// Names whose stored record could not be read, with the error (logged
    /// once per change).
    unreadable: Mutex<BTreeMap<String, i64>>,
}

impl Live {
    /// Read the destinations once (start-up: the first ingest already
    /// routes by them); their secrets are opened with `secrets`.
    pub async fn load(
        store: Arc<dyn Store>,
        secrets: Arc<Secrets>,
    ) -> Result<Arc<Live>, StoreError> {
        let live = Arc::new(Live {
            store,
            secrets,
            tx: watch::channel(Arc::new(Snapshot::default())).0,
            changed: Notify::new(),
            unreadable: Mutex::default(),
        });
        live.refresh().await?;
        Ok(live)
    }

    /// The keyring the destinations' secrets are sealed and opened with.
    pub fn secrets(&self) -> &Arc<Secrets> {
        &self.secrets
    }

    /// The snapshot now.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// Follow the snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Refresh now (after a change made through this process).
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// Read every destination; publish a new snapshot when any revision
    /// differs from the current one.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let rows = self.store.destinations().await?;
        let revisions: BTreeMap<String, i64> =
            rows.iter().map(|r| (r.name.clone(), r.revision)).collect();
        if revisions == self.tx.borrow().revisions {
            return Ok(());
        }
        let mut by_name = BTreeMap::new();
        let mut unreadable = self.unreadable.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows {
            match serde_json::from_str::<Destination>(&row.record) {
                Ok(d) => {
                    unreadable.remove(&row.name);
                    by_name.insert(row.name, d);
                }
                Err(e) => {
                    if unreadable.insert(row.name.clone(), row.revision) != Some(row.revision) {
                        tracing::error!(destination = %row.name, "stored destination record is unreadable, skipped: {e}");
                    }
                }
            }
        }
        drop(unreadable);
        self.tx
            .send_replace(Arc::new(Snapshot::new(by_name, revisions)));
        Ok(())
    }

    /// Refresh every `every`, and at once when poked, until `shutdown`.
    pub fn run(
        self: Arc<Self>,
        every: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = self.changed.notified() => {}
                    _ = shutdown.changed() => return,
                }
                if let Err(e) = self.refresh().await {
                    tracing::warn!("reading destinations: {e}");
                }
            }
        })
    }
}

/// What [`serve_sink`] needs.
#[derive(Clone)]
pub struct ServeContext {
    /// What every delivery loop shares.
    pub shared: Shared,
    /// The destinations as loaded.
    pub live: Arc<Live>,
    /// `destinations.disable-after`.
    pub disable_after: Duration,
    /// `destinations.idle-poll-interval`.
    pub idle_poll: Duration,
    /// Where the loops' handles go (awaited at shutdown).
    pub spawned: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Turns true on shutdown.
    pub shutdown: watch::Receiver<bool>,
}

/// How often a sink's supervisor looks again without a change (a rotated
/// secret's grace period ends on this tick).
const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// What a loop's target was built from: the plugin's generation, the
/// record's revision, and whether the previous secret was in its grace
/// period. `None` while its plugin is not loaded.
type BuiltFrom = Option<(u64, i64, bool)>;

/// A `BuiltFrom` no target is built from: the next reconcile builds again
/// (after a secret could not be opened).
const REBUILD: BuiltFrom = Some((u64::MAX, 0, false));

/// One running loop of a sink, and what its target was built from.
struct Loop {
    tx: watch::Sender<Option<Target>>,
    built_from: BuiltFrom,
    tracker: Option<Arc<Tracker>>,
    /// The key id last reported missing (logged once, not every second).
    missing_key: Option<String>,
}

/// Keep the delivery loops of `sink` — the sink's own key and one per
/// destination of it — in step with its plugin (`current`, from the
/// registry) and the destinations snapshot, until shutdown.
pub fn serve_sink(ctx: ServeContext, sink: String, mut current: watch::Receiver<Option<Plugin>>) {
    let spawned = ctx.spawned.clone();
    let task = tokio::spawn(async move {
        let health: BTreeMap<String, Health> = match ctx.shared.store.destination_health().await {
            Ok(rows) => rows
                .into_iter()
                .filter_map(|(n, h)| serde_json::from_str(&h).ok().map(|h| (n, h)))
                .collect(),
            Err(e) => {
                tracing::warn!(sink = %sink, "reading destination health: {e}");
                BTreeMap::new()
            }
        };
        let mut health = health;
        let mut snapshots = ctx.live.subscribe();
        let mut shutdown = ctx.shutdown.clone();
        let mut loops: BTreeMap<String, Loop> = BTreeMap::new();
        let mut generation = 0u64;
        loop {
            let plugin = current.borrow_and_update().clone();
            let snapshot = snapshots.borrow_and_update().clone();
            reconcile(
                &ctx,
                &sink,
                plugin,
                generation,
                &snapshot,
                &mut loops,
                &mut health,
            );
            tokio::select! {
                changed = current.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    generation += 1;
                }
                _ = snapshots.changed() => {}
                _ = tokio::time::sleep(RECONCILE_EVERY) => {}
                _ = shutdown.changed() => break,
            }
        }
        drop(loops);
    });
    spawned.lock().unwrap_or_else(|e| e.into_inner()).push(task);
}

fn reconcile(
    ctx: &ServeContext,
    sink: &str,
    plugin: Option<Plugin>,
    generation: u64,
    snapshot: &Snapshot,
    loops: &mut BTreeMap<String, Loop>,
    health: &mut BTreeMap<String, Health>,
) {
    let now = now_ms();
    let mut wanted: Vec<(String, Option<&Destination>)> = vec![(sink.to_string(), None)];
    wanted.extend(snapshot.of_sink(sink).map(|d| (d.name.clone(), Some(d))));
    loops.retain(|key, _| wanted.iter().any(|(k, _)| k == key));
    for (key, destination) in wanted {
        let built_from = plugin.as_ref().map(|_| {
            let revision = snapshot.revisions.get(&key).copied().unwrap_or(0);
            let grace = destination.is_some_and(|d| d.in_grace(now));
            (generation, revision, grace)
        });
        let entry = loops.entry(key.clone()).or_insert_with(|| {
            let (tx, rx) = watch::channel(None);
            let handle = tokio::spawn(crate::delivery::run_sink(
                ctx.shared.clone(),
                key.clone(),
                rx,
                ctx.shutdown.clone(),
            ));
            ctx.spawned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
            Loop {
                tx,
                built_from: REBUILD,
                tracker: None,
                missing_key: None,
            }
        });
        if entry.built_from == built_from {
            continue;
        }
        entry.built_from = built_from;
        let target = plugin.as_ref().map(|plugin| match destination {
            None => Target::plain(plugin.clone()),
            Some(d) => {
                let tracker = entry
                    .tracker
                    .get_or_insert_with(|| {
                        Tracker::new(
                            &d.name,
                            ctx.shared.store.clone(),
                            health.remove(&d.name).unwrap_or_default(),
                            ctx.disable_after,
                            {
                                let live = ctx.live.clone();
                                Arc::new(move || live.poke())
                            },
                        )
                    })
                    .clone();
                let (target, unopened_secret) =
                    target_of(plugin, d, now, &tracker, ctx.idle_poll, ctx.live.secrets());
                match unopened_secret {
                    None => entry.missing_key = None,
                    Some(e) => {
                        unopened(&e, &tracker, &mut entry.missing_key, ctx.live.secrets());
                        entry.built_from = REBUILD;
                    }
                }
                target
            }
        });
        entry.tx.send_replace(target);
    }
}

/// Say once per missing key id, and in the destination's health each
/// time, that destination `e.destination`'s secret cannot be opened.
fn unopened(e: &SealingError, tracker: &Tracker, logged: &mut Option<String>, secrets: &Secrets) {
    let why = match e.missing_key() {
        Some(key_id) => format!(
            "{e}; add key {key_id:?} to the keyring ({}): its deliveries wait until then",
            secrets.source()
        ),
        None => format!("{e}: its deliveries wait"),
    };
    let key = e.missing_key().unwrap_or("").to_string();
    if logged.as_deref() != Some(key.as_str()) {
        tracing::error!(destination = %e.destination, "cannot open its secret: {why}");
        *logged = Some(key);
    }
    tracker.turn(0, 0, Some(&why));
}

/// The target serving destination `d` of `plugin`'s sink at Unix ms `now`,
/// its secrets opened with `secrets`. When one cannot be opened, the
/// target holds the destination's deliveries (nothing is claimed, nothing
/// lost) with the reason, and the error comes with it.
fn target_of(
    plugin: &Plugin,
    d: &Destination,
    now: i64,
    tracker: &Arc<Tracker>,
    idle_poll: Duration,
    secrets: &Secrets,
) -> (Target, Option<SealingError>) {
    let retry = d
        .retry
        .as_ref()
        .map(|r| retry_within(&plugin.manifest().retry, r));
    let hold = match d.state {
        State::Active => None,
        State::Paused => Some(
            d.state_reason
                .clone()
                .unwrap_or_else(|| "paused by an operator".into()),
        ),
        State::Disabled => Some(d.state_reason.clone().unwrap_or_else(|| "disabled".into())),
    };
    let (config, unopened) = match d.plugin_config(now, secrets) {
        Ok(config) => (config, None),
        // The manifest's own configuration, never run: the hold keeps
        // every batch from being claimed.
        Err(e) => (BTreeMap::new(), Some(e)),
    };
    let target = Target {
        plugin: plugin.for_destination(&config, retry),
        hold: match &unopened {
            Some(e) => Some(format!("secret cannot be opened: {e}")),
            None => hold,
        },
        rate: d
            .rate_per_second
            .and_then(NonZeroU32::new)
            .map(|r| Arc::new(RateLimiter::direct(Quota::per_second(r)))),
        max_in_flight: d.max_in_flight,
        observer: Some(tracker.clone() as Arc<dyn TurnObserver>),
        idle_poll: Some(idle_poll),
    };
    (target, unopened)
}

/// `manifest`'s retry policy with `over`'s durations, each kept within the
/// manifest's (validated at create; kept here too for a hand-edited row).
pub fn retry_within(manifest: &RetryPolicy, over: &RetryOverride) -> RetryPolicy {
    let mut policy = manifest.clone();
    if let Some(window) = over.window {
        policy.window = window.min(manifest.window);
    }
    if let Some(cap) = over.cap {
        policy.cap = cap.min(manifest.cap);
    }
    if let Some(base) = over.base {
        policy.base = base.min(policy.cap);
    }
    policy
}
