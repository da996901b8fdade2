//! Assembling a running daemon from a [`Config`].
//!
//! Owns: start-up order (store → migrations check → plugins → routes →
//! delivery loops → HTTP listener), and graceful shutdown (stop accepting,
//! stop claiming, let in-flight batches finish, return).
//!
//! Must never: start delivering while migrations are pending, or start with
//! a route that names an unknown sink.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::delivery::{Heartbeats, Shared};
use crate::ingest::http::IngestState;
use crate::ingest::routes::Router as Routes;
use crate::metrics::{Metrics, PluginLabel};
use crate::ops::OpsState;
use crate::plugin::registry::Registry;
use crate::plugin::{self, Plugin, Runtime};
use crate::store::{self, StoreError};

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Routes(#[from] crate::ingest::routes::UnknownSink),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("WebAssembly runtime: {0}")]
    Runtime(String),
    #[error("{0}")]
    Config(String),
}

/// How to treat pending migrations at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrations {
    /// Apply them (`outboxd run --migrate`).
    Apply,
    /// Apply them only to a new, empty database; otherwise refuse to start
    /// while any are pending, naming them.
    RequireCurrent,
}

/// Longest a graceful shutdown waits for in-flight batches.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(40);

/// A running daemon.
pub struct Daemon {
    /// The address the HTTP API listens on (useful with port 0).
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Delivery loops, one per sink; plugins added while running add theirs.
    sink_tasks: SinkTasks,
}

type SinkTasks = Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>;

impl Daemon {
    /// Start everything; returns once the listener is bound.
    pub async fn start(config: Config, migrations: Migrations) -> Result<Daemon, StartError> {
        let url = config.effective_database_url();
        let store = store::open(&url).await?;
        let pending = store.pending_migrations().await?;
        if !pending.is_empty() {
            if migrations == Migrations::Apply || store.is_uninitialised().await? {
                tracing::info!(migrations = %pending.join(", "), "applying database migrations");
                store.migrate().await?;
            } else {
                return Err(StoreError::PendingMigrations(pending.join(", ")).into());
            }
        }

        let runtime = Runtime::new()
            .map_err(|e| StartError::Runtime(format!("{e:#}")))?
            .with_cache(config.data_dir.join("cache"));
        let metrics = Metrics::new();
        let plugins = plugin::load_dir(&runtime, &config.plugins_dir);
        for name in plugins.loaded.keys() {
            metrics.sink_started(name);
            metrics
                .plugin_loads
                .get_or_create(&PluginLabel {
                    plugin: name.clone(),
                })
                .inc();
        }
        for failure in &plugins.failed {
            let plugin = failure
                .name
                .clone()
                .unwrap_or_else(|| failure.file.display().to_string());
            metrics
                .plugin_load_failures
                .get_or_create(&PluginLabel { plugin })
                .inc();
        }
        let known = plugins.known_sinks();
        for plugin in plugins.loaded.values() {
            admit(plugin, &known, config.delivery.lease).map_err(StartError::Config)?;
            crate::sources::amqp::check_routes_apart(&config.sources, plugin.manifest())
                .map_err(StartError::Config)?;
        }
        let live = crate::destinations::live::Live::load(store.clone()).await?;
        let routes = Arc::new(
            Routes::new(config.routes.clone(), known)?.with_destinations(live.subscribe()),
        );

        let (shutdown, shutdown_rx) = watch::channel(false);
        let wake = crate::wakeups::Wakeups::new();
        let heartbeats = Arc::new(Heartbeats::default());
        let quarantines = Arc::new(crate::delivery::Quarantines::default());
        store.forward_wakeups(wake.clone(), shutdown_rx.clone());
        let shared = Shared {
            store: store.clone(),
            config: config.delivery.clone(),
            wake: wake.clone(),
            heartbeats: heartbeats.clone(),
            metrics: metrics.clone(),
            quarantines: quarantines.clone(),
            paused: Arc::default(),
        };
        let mut tasks = Vec::new();
        let route_table = routes.clone();
        tasks.push(tokio::spawn(crate::delivery::run_router(
            store.clone(),
            Arc::new(move |e: &crate::event::NewEvent| route_table.sinks_for(e)),
            config.delivery.clone(),
            wake.clone(),
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(crate::delivery::run_retention(
            shared.clone(),
            shutdown_rx.clone(),
        )));
        let lease = config.delivery.lease;
        let sink_routes = routes.clone();
        let sink_tasks: SinkTasks = Arc::default();
        let source_configs = config.sources.clone();
        let serve = crate::destinations::live::ServeContext {
            shared: shared.clone(),
            live: live.clone(),
            disable_after: config.destinations.disable_after,
            idle_poll: config.destinations.idle_poll_interval,
            spawned: sink_tasks.clone(),
            shutdown: shutdown_rx.clone(),
        };
        tasks.push(
            live.clone()
                .run(config.destinations.refresh_interval, shutdown_rx.clone()),
        );
        let registry = Registry::new(
            runtime.clone(),
            &config.plugins_dir,
            plugins,
            Box::new(move |plugin, known| {
                admit(plugin, known, lease)?;
                crate::sources::amqp::check_routes_apart(&source_configs, plugin.manifest())
            }),
            Box::new(move |sink, current| {
                if !sink_routes.add_sink(sink) {
                    tracing::warn!(
                        sink,
                        "no route names this sink: it gets no events until the routes do"
                    );
                }
                crate::destinations::live::serve_sink(serve.clone(), sink.to_string(), current);
            }),
            metrics.clone(),
        );
        tasks.push(registry.clone().watch(shutdown_rx.clone()));
        let fleet = crate::fleet::Fleet::join(
            store.clone(),
            registry.clone(),
            routes.clone(),
            metrics.clone(),
            config.delivery.replica_timeout,
        )
        .await?;
        tasks.push(fleet.clone().run(shutdown_rx.clone()));

        let sources = Arc::new(crate::sources::Statuses::default());
        tasks.extend(crate::sources::spawn_all(
            &config.sources,
            crate::sources::SourceContext {
                store: store.clone(),
                routes: routes.clone(),
                wake: wake.clone(),
                metrics: metrics.clone(),
                db_timeout: config.delivery.db_timeout,
                amqp: runtime.amqp().clone(),
            },
            sources.clone(),
            shutdown_rx.clone(),
        ));

        if let Some(sync) = &config.destinations.sync {
            let ctx = crate::destinations::actions::Context {
                store: store.clone(),
                live: live.clone(),
                plugins: registry.clone(),
                routes: routes.clone(),
                wake: wake.clone(),
            };
            tasks.push(crate::destinations::sync::run_every(
                ctx,
                sync.from.clone(),
                sync.every,
                shutdown_rx.clone(),
            ));
        }
        let wake_ops = wake.clone();
        // `[ingest.awareness]`: the awareness-compatible `POST /ingest`.
        let awareness = crate::ingest::awareness::router(
            &config.ingest,
            IngestState {
                store: store.clone(),
                routes: routes.clone(),
                limits: config.ingest.clone(),
                wake: wake.clone(),
                metrics: metrics.clone(),
            },
        )
        .map_err(StartError::Config)?;
        let app = crate::ingest::http::router(IngestState {
            store: store.clone(),
            routes: routes.clone(),
            limits: config.ingest.clone(),
            wake,
            metrics: metrics.clone(),
        })
        .merge(crate::ops::router(OpsState {
            store: store.clone(),
            plugins: registry.clone(),
            heartbeats,
            metrics,
            quarantines,
            admin_token: config.admin.token.clone(),
            amqp: runtime.amqp().clone(),
            routes,
            sources,
            live,
            wake: wake_ops,
            fleet,
        }));
        let app = app.merge(awareness);
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!("HTTP server failed: {e}");
            }
        }));
        tracing::info!(
            listen = %addr,
            store = %store::redact_url(&url),
            plugins_dir = %config.plugins_dir.display(),
            sinks = ?registry.loaded(),
            refused = registry.failures().len(),
            "outboxd started"
        );
        Ok(Daemon {
            addr,
            shutdown,
            tasks,
            sink_tasks,
        })
    }

    /// Stop claiming and accepting, wait for in-flight batches (at most
    /// [`SHUTDOWN_GRACE`]; a batch still running then is abandoned and its
    /// leases expire), return.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let mut tasks = self.tasks;
        tasks.append(&mut self.sink_tasks.lock().unwrap());
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!("in-flight batches did not finish within {SHUTDOWN_GRACE:?}; their leases will expire");
        }
        tracing::info!("outboxd stopped");
    }
}

/// Whether `plugin` may serve in a daemon whose delivery lease is `lease`
/// and whose sinks are `known`: its lease must outlast its deadline
/// ([`crate::delivery::minimum_lease`]) and its `after` must name another
/// known sink. `Err` says what to change.
fn admit(plugin: &Plugin, known: &[String], lease: std::time::Duration) -> Result<(), String> {
    admit_lease(plugin, lease)?;
    if let Some(after) = &plugin.manifest().after {
        if !known.contains(after) || after == plugin.name() {
            return Err(format!(
                "sink {:?}: `after = {after:?}` names no other sink (known: {})",
                plugin.name(),
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// The lease half of [`admit`]: whether a daemon whose delivery lease is
/// `lease` can serve `plugin`, whose deadline the lease must outlast
/// ([`crate::delivery::minimum_lease`]). `Err` says which setting to
/// change and to what. `outboxd plugin check` applies this same rule.
pub fn admit_lease(plugin: &Plugin, lease: std::time::Duration) -> Result<(), String> {
    let deadline = plugin.manifest().limits.deadline;
    let needed = crate::delivery::minimum_lease(deadline);
    if lease < needed {
        return Err(format!(
            "delivery.lease {} is not comfortably longer than sink {:?}'s deadline {}: \
             set it to at least {} (2 × deadline + 5 s)",
            humantime::format_duration(lease),
            plugin.name(),
            humantime::format_duration(deadline),
            humantime::format_duration(needed),
        ));
    }
    Ok(())
}
