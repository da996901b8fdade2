//! The fleet: which sinks exist across every replica on one database, and
//! which replica serves each.
//!
//! Owns: registering every sink this replica loads in the store's sink
//! registry (its name, version, and the SHA-256 of its `.wasm` file and of
//! its manifest, as `sha256sum` prints them; the first load
//! registers it, from then on every replica's ingest routes to it); this
//! replica's heartbeat of the sinks it serves (every [`BEAT_EVERY`]); the
//! routing table's view of the registry (a sink registered by any replica
//! is routed to by every replica; a retired one by none); and the fleet
//! status the admin API, `/ready` and `outboxd_sink_serving_replicas` show:
//! per sink, the replicas serving it (heard from within
//! `delivery.replica-timeout`), the
//! versions they run (more than one (component, manifest) pair of hashes is
//! a **version skew**, logged once per change: two replicas serving one
//! `.wasm` under different manifests configure it differently), and whether it is served by no replica (its deliveries wait).
//!
//! Must never: unregister a sink because a replica lacks its plugin file
//! (only `outboxd sinks retire` removes one from routing), or dead-letter
//! anything for a sink no replica serves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::{Metrics, SinkLabel};
use crate::plugin::registry::Registry;
use crate::routing::Router;
use crate::store::{SinkReplica, Store, StoreError};

/// How often a replica registers its sinks, beats and re-reads the
/// registry: a sink loaded on one replica is routed to by the others
/// within this (plus their next ingest).
pub const BEAT_EVERY: Duration = Duration::from_secs(2);

/// One sink as the fleet sees it.
#[derive(Debug, Clone, Serialize)]
pub struct FleetSink {
    /// The sink's name.
    pub name: String,
    /// In the store's registry.
    pub registered: bool,
    /// Retired: no longer routed to.
    pub retired: bool,
    /// This replica has it loaded.
    pub served_here: bool,
    /// Replicas heard from within `delivery.replica-timeout` that serve it.
    pub replicas: Vec<SinkReplica>,
    /// Distinct `<component_sha>+<manifest_sha>` among them; more than
    /// one is a skew.
    pub versions: Vec<String>,
    /// Registered and not retired, and no replica serves it: its
    /// deliveries wait until one does.
    pub unserved: bool,
}

/// The fleet as last read.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetStatus {
    /// This replica's id.
    pub replica: String,
    /// Every sink known to the fleet, by name.
    pub sinks: Vec<FleetSink>,
    /// The last read failed with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// This replica's part in the fleet.
pub struct Fleet {
    replica: String,
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    routes: Arc<Router>,
    metrics: Arc<Metrics>,
    fresh: Duration,
    status: Mutex<FleetStatus>,
    /// The skews last logged, by sink.
    skews: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Fleet {
    /// Join the fleet: register this replica's sinks and read the registry
    /// once (so the first ingest already routes by it).
    pub async fn join(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        routes: Arc<Router>,
        metrics: Arc<Metrics>,
        fresh: Duration,
    ) -> Result<Arc<Fleet>, StoreError> {
        let replica = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "outboxd".into()),
            std::process::id(),
            hex::encode(rand::random::<[u8; 3]>())
        );
        let fleet = Arc::new(Fleet {
            replica: replica.clone(),
            store,
            registry,
            routes,
            metrics,
            fresh,
            status: Mutex::new(FleetStatus {
                replica,
                ..Default::default()
            }),
            skews: Mutex::default(),
        });
        fleet.cycle().await?;
        Ok(fleet)
    }

    /// The fleet as last read.
    pub fn status(&self) -> FleetStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Register, beat, read, publish.
    pub async fn cycle(&self) -> Result<(), StoreError> {
        let mine = self.registry.identities();
        for name in self.store.register_sinks(&mine).await? {
            tracing::info!(sink = %name, "sink registered: every replica routes to it from now on");
        }
        self.store.beat_replica(&self.replica, &mine).await?;
        let registered = self.store.registered_sinks().await?;
        let replicas = self.store.sink_replicas().await?;
        let retired: Vec<String> = registered
            .iter()
            .filter(|s| s.retired_at_ms.is_some())
            .map(|s| s.name.clone())
            .collect();
        let routable: Vec<String> = registered
            .iter()
            .filter(|s| s.retired_at_ms.is_none())
            .map(|s| s.name.clone())
            .collect();
        self.routes.set_registered(routable, retired);

        let fresh_ms = self.fresh.as_millis() as i64;
        let mut names: BTreeSet<String> = registered.iter().map(|s| s.name.clone()).collect();
        names.extend(mine.iter().map(|s| s.name.clone()));
        let mut sinks = Vec::new();
        for name in names {
            let reg = registered.iter().find(|s| s.name == name);
            let serving: Vec<SinkReplica> = replicas
                .iter()
                .filter(|r| r.sink == name && r.age_ms <= fresh_ms)
                .cloned()
                .collect();
            let versions: Vec<String> = serving
                .iter()
                .map(|r| format!("{}+{}", r.component_sha, r.manifest_sha))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let retired = reg.is_some_and(|s| s.retired_at_ms.is_some());
            self.metrics
                .sink_serving_replicas
                .get_or_create(&SinkLabel { sink: name.clone() })
                .set(serving.len() as i64);
            self.note_skew(&name, &serving, &versions);
            sinks.push(FleetSink {
                served_here: mine.iter().any(|m| m.name == name),
                registered: reg.is_some(),
                retired,
                unserved: reg.is_some() && !retired && serving.is_empty(),
                replicas: serving,
                versions,
                name,
            });
        }
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.sinks = sinks;
        status.error = None;
        Ok(())
    }

    /// Log a version skew once per change of the versions served.
    fn note_skew(&self, sink: &str, serving: &[SinkReplica], versions: &[String]) {
        let mut skews = self.skews.lock().unwrap_or_else(|e| e.into_inner());
        let before = skews.get(sink).cloned().unwrap_or_default();
        if versions.len() > 1 && before != versions {
            let detail: Vec<String> = serving
                .iter()
                .map(|r| {
                    format!(
                        "{} runs {} (component {}, manifest {})",
                        r.replica,
                        r.version,
                        &r.component_sha[..12.min(r.component_sha.len())],
                        &r.manifest_sha[..12.min(r.manifest_sha.len())]
                    )
                })
                .collect();
            tracing::warn!(sink, replicas = %detail.join("; "), "version skew: replicas serve this sink with different components or manifests");
            skews.insert(sink.to_string(), versions.to_vec());
        } else if versions.len() <= 1 && !before.is_empty() {
            tracing::info!(
                sink,
                "version skew ended: every replica serves one component and manifest"
            );
            skews.remove(sink);
        }
    }

    /// Run [`Fleet::cycle`] every [`BEAT_EVERY`] until `shutdown`; a failed
    /// cycle is logged and shown in the status.
    pub fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(BEAT_EVERY) => {}
                    _ = shutdown.changed() => return,
                }
                if let Err(e) = self.cycle().await {
                    tracing::warn!("fleet heartbeat: {e}");
                    self.status.lock().unwrap_or_else(|e| e.into_inner()).error =
                        Some(e.to_string());
                }
            }
        })
    }
}
