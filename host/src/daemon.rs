//! Assembling a running daemon from a [`Config`].
//!
//! Owns: start-up order (store → migrations check → plugins → secrets
//! keyring, plain secrets sealed → routes → delivery loops → HTTP
//! listener), and graceful shutdown (stop accepting,
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
use crate::metrics::{Metrics, PluginLabel};
use crate::ops::OpsState;
use crate::plugin::registry::Registry;
use crate::plugin::{self, Plugin, Runtime};
use crate::routing::Router as Routes;
use crate::store::{self, Store, StoreError};

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    /// The store could not be opened or migrated.
    Store(#[from] StoreError),
    #[error("{0}")]
    /// A route names a sink no plugin provides.
    Routes(#[from] crate::routing::UnknownSink),
    #[error("cannot listen on {addr}: {source}")]
    /// The HTTP listener could not bind.
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it could not.
        source: std::io::Error,
    },
    #[error("WebAssembly runtime: {0}")]
    /// The WebAssembly engine could not start.
    Runtime(String),
    #[error("{0}")]
    /// A setting the loaded plugins cannot work with (what to change).
    Config(String),
    #[error(transparent)]
    /// The listener's certificate or key could not be loaded.
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    /// The secrets key file or `secrets.key` cannot be read (names the
    /// file or setting, and the line).
    Secrets(#[from] crate::secrets::SecretsError),
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
    /// The tracer (off unless `[otel]` enables it), flushed at shutdown.
    telemetry: crate::otel::Telemetry,
}

type SinkTasks = Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>;

impl Daemon {
    /// Start everything; returns once the listener is bound.
    // Longer than most functions here, on purpose: it is the start-up
    // order this module owns, read top to bottom — each step is one call
    // or the struct literal that call needs.
    pub async fn start(config: Config, migrations: Migrations) -> Result<Daemon, StartError> {
        // The listener's certificate first: a broken pair stops the start
        // before the database is touched.
        let tls = match &config.tls {
            Some(t) => Some((t.clone(), crate::tls::server_config(t)?)),
            None => None,
        };
        // So does a CA file the outbound HTTPS (plugins, OTLP) cannot trust.
        let trust = crate::plugin::egress::client_tls(&config.egress)
            .map_err(|e| StartError::Config(e.to_string()))?;
        let telemetry = crate::otel::Telemetry::start(&config.otel, &trust)
            .map_err(|e| StartError::Config(format!("[otel]: {e}")))?;
        let url = config.effective_database_url();
        let store = open_store(&url, config.delivery.db_timeout, migrations).await?;
        let runtime = Runtime::with_instance_pool(crate::plugin::DAEMON_POOL_SLOTS)
            .map_err(|e| StartError::Runtime(format!("{e:#}")))?
            .with_cache(config.data_dir.join("cache"))
            .with_trust(trust);
        let metrics = Metrics::new();
        let plugins = load_plugins(&runtime, &config, &metrics)?;
        let secrets = load_secrets(&config, &url)?;
        crate::destinations::sealing::at_start(&*store, &secrets).await?;
        let live = crate::destinations::live::Live::load(store.clone(), secrets).await?;
        let routes = Arc::new(
            Routes::new(config.routes.clone(), plugins.known_sinks())?
                .with_destinations(live.subscribe()),
        );

        let (shutdown, shutdown_rx) = watch::channel(false);
        let wake = crate::wakeups::Wakeups::new();
        store.forward_wakeups(wake.clone(), shutdown_rx.clone());
        let shared = Shared {
            store: store.clone(),
            config: config.delivery.clone(),
            wake: wake.clone(),
            heartbeats: Arc::new(Heartbeats::default()),
            metrics: metrics.clone(),
            quarantines: Arc::new(crate::delivery::Quarantines::default()),
            paused: Arc::default(),
            telemetry: telemetry.clone(),
        };
        let mut tasks = background(&config, &shared, &routes, &live, &shutdown_rx);
        let sink_tasks: SinkTasks = Arc::default();
        let registry = registry(
            &config,
            &runtime,
            plugins,
            &routes,
            crate::destinations::live::ServeContext {
                shared: shared.clone(),
                live: live.clone(),
                disable_after: config.destinations.disable_after,
                idle_poll: config.destinations.idle_poll_interval,
                spawned: sink_tasks.clone(),
                shutdown: shutdown_rx.clone(),
            },
            &metrics,
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
                telemetry: telemetry.clone(),
            },
            sources.clone(),
            shutdown_rx.clone(),
        ));
        let actions = crate::ops::actions::destinations::Context {
            store: store.clone(),
            live: live.clone(),
            plugins: registry.clone(),
            routes: routes.clone(),
            wake: wake.clone(),
        };
        tasks.extend(sync_destinations(&config, actions, &shutdown_rx));
        let gate = producer_gate(&config, &store, &shutdown_rx, &mut tasks).await?;
        let ops = OpsState {
            store: store.clone(),
            plugins: registry.clone(),
            heartbeats: shared.heartbeats.clone(),
            metrics,
            quarantines: shared.quarantines.clone(),
            admin_token: config.admin.token.clone(),
            metrics_require_token: config.metrics_require_token(),
            gate,
            amqp: runtime.amqp().clone(),
            runtime: runtime.clone(),
            routes,
            sources,
            live,
            wake,
            fleet,
        };
        let mut app = http_app(&config, ops.clone(), &telemetry)?;
        if config.console.enabled {
            let mount = crate::console::Mount {
                prefix: config.console.prefix.clone(),
                read_only: config.console.read_only,
                session_ttl: config.console.session_ttl,
                secure: config.tls.is_some(),
                trace_url: config.console.trace_url.clone(),
            };
            let (console, sampler) = crate::console::mount(mount, ops, shutdown_rx.clone());
            app = app.merge(console);
            tasks.push(sampler);
        }
        let (addr, server) = serve(config.listen, tls, app, shutdown_rx).await?;
        tasks.extend(server);
        if config.tls.is_none() && !config.listen.ip().is_loopback() {
            tracing::warn!(
                listen = %addr,
                "plain HTTP beyond loopback: producer and admin tokens cross the network in the clear \
                 unless a proxy in front terminates TLS; set [tls] cert-file and key-file otherwise"
            );
        }
        tracing::info!(
            listen = %addr,
            tls = config.tls.is_some(),
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
            telemetry,
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
        self.telemetry.shutdown().await;
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

/// Open the store at `url` (PostgreSQL statements limited to
/// `statement_timeout`) and bring its schema up to date as
/// `migrations` allows. Errors: the database cannot be opened, or
/// migrations are pending and may not be applied (named).
async fn open_store(
    url: &str,
    statement_timeout: std::time::Duration,
    migrations: Migrations,
) -> Result<Arc<dyn Store>, StartError> {
    let store = store::open_with(url, statement_timeout).await?;
    let pending = store.pending_migrations().await?;
    if !pending.is_empty() {
        if migrations == Migrations::Apply || store.is_uninitialised().await? {
            tracing::info!(migrations = %pending.join(", "), "applying database migrations");
            store.migrate().await?;
        } else {
            return Err(StoreError::PendingMigrations(pending.join(", ")).into());
        }
    }
    Ok(store)
}

/// The secrets keyring as configured: `secrets.key-file`, else
/// `secrets.key`, else — on the embedded SQLite store only — the key file
/// generated into the data folder; PostgreSQL without either has no key
/// (secrets are then refused, and plain ones stored earlier still
/// deliver).
fn load_secrets(config: &Config, url: &str) -> Result<Arc<crate::secrets::Secrets>, StartError> {
    let embedded = store::sqlite_path(url).is_some();
    Ok(crate::secrets::Secrets::load(
        config.secrets.key_file.as_deref(),
        config.secrets.key.as_deref(),
        embedded.then_some(config.data_dir.as_path()),
    )?)
}

/// Load the plugins folder, count loads and refusals, and check every
/// loaded sink against the lease and the sources' routes. Errors: a sink
/// the daemon cannot serve as configured (what to change).
fn load_plugins(
    runtime: &Runtime,
    config: &Config,
    metrics: &Metrics,
) -> Result<plugin::Plugins, StartError> {
    let plugins = plugin::load_dir(runtime, &config.plugins_dir);
    for name in plugins.loaded.keys() {
        // Every series of the sink present from the first scrape, at 0.
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
        crate::sources::check_sink(&config.sources, &sink_view(plugin.manifest()))
            .map_err(StartError::Config)?;
    }
    Ok(plugins)
}

/// A sink as the sources' checks see it ([`crate::sources::SinkView`]).
fn sink_view(manifest: &plugin::manifest::Manifest) -> crate::sources::SinkView<'_> {
    crate::sources::SinkView {
        name: &manifest.name,
        config: &manifest.config,
        amqp: manifest
            .capabilities
            .amqp
            .as_ref()
            .map(|grant| crate::sources::SinkAmqp {
                url: &grant.url,
                exchanges: &grant.exchanges,
            }),
    }
}

/// The tasks that run beside the delivery loops: the router of events
/// enqueued by SQL, retention, and the destinations' refresh.
fn background(
    config: &Config,
    shared: &Shared,
    routes: &Arc<Routes>,
    live: &Arc<crate::destinations::live::Live>,
    shutdown: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let route_table = routes.clone();
    vec![
        tokio::spawn(crate::delivery::run_router(
            shared.store.clone(),
            Arc::new(move |e: &crate::event::NewEvent| route_table.sinks_for(e)),
            config.delivery.clone(),
            shared.wake.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::delivery::run_retention(
            shared.clone(),
            shutdown.clone(),
        )),
        live.clone()
            .run(config.destinations.refresh_interval, shutdown.clone()),
    ]
}

/// The plugin registry: admits each sink loaded now or later (the same
/// checks as at start) and starts its delivery loops through `serve`.
fn registry(
    config: &Config,
    runtime: &Runtime,
    plugins: plugin::Plugins,
    routes: &Arc<Routes>,
    serve: crate::destinations::live::ServeContext,
    metrics: &Arc<Metrics>,
) -> Arc<Registry> {
    let lease = config.delivery.lease;
    let source_configs = config.sources.clone();
    let sink_routes = routes.clone();
    Registry::new(
        runtime.clone(),
        &config.plugins_dir,
        plugins,
        Box::new(move |plugin, known| {
            admit(plugin, known, lease)?;
            crate::sources::check_sink(&source_configs, &sink_view(plugin.manifest()))
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
    )
}

/// The `[destinations.sync]` task, when configured: the destinations kept
/// as its file says, every `every`.
fn sync_destinations(
    config: &Config,
    actions: crate::ops::actions::destinations::Context,
    shutdown: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let sync = config.destinations.sync.as_ref()?;
    Some(crate::ops::actions::sync::run_every(
        actions,
        sync.from.clone(),
        sync.every,
        shutdown.clone(),
    ))
}

/// The HTTP API: ingest and the read API, the awareness-compatible
/// `POST /ingest` when `[ingest.awareness]` enables it, and operations.
fn http_app(
    config: &Config,
    ops: OpsState,
    telemetry: &crate::otel::Telemetry,
) -> Result<axum::Router, StartError> {
    let ingest = IngestState {
        telemetry: telemetry.clone(),
        store: ops.store.clone(),
        routes: ops.routes.clone(),
        limits: config.ingest.clone(),
        wake: ops.wake.clone(),
        metrics: ops.metrics.clone(),
        gate: ops.gate.clone(),
    };
    let awareness = crate::ingest::awareness::router(&config.ingest, ingest.clone())
        .map_err(StartError::Config)?;
    Ok(crate::ingest::http::router(ingest)
        .merge(crate::ops::router(ops))
        .merge(awareness))
}

/// The producer gate of the HTTP ingest, read from `store`, kept fresh
/// every `destinations.refresh-interval` (its task pushed on `tasks`).
/// Beyond loopback with anonymous posts allowed, a warning at every start.
async fn producer_gate(
    config: &Config,
    store: &Arc<dyn Store>,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Arc<crate::auth::Gate>, StartError> {
    let mode = config
        .producers
        .mode_for(config.listen)
        .map_err(|(key, problem)| {
            StartError::Config(format!("configuration key `{key}`: {problem}"))
        })?;
    if mode == crate::auth::ProducerAuth::Optional && !config.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %config.listen,
            "producers.auth = \"optional\" beyond loopback: anyone who reaches this port can post \
             events without a token, and outboxd signs and delivers them; use it only on a trusted network"
        );
    }
    let gate = crate::auth::Gate::load(
        store.clone(),
        mode,
        config.producers.clone(),
        (config.ingest.max_body_bytes, config.ingest.max_batch_items),
    )
    .await?;
    tasks.push(
        gate.clone()
            .run(config.destinations.refresh_interval, shutdown.clone()),
    );
    Ok(gate)
}

/// Bind `listen` and serve `app` until `shutdown` turns true — over TLS
/// when `tls` is set (its files watched for a renewed pair, [`crate::tls`]);
/// the bound address and the server's tasks.
async fn serve(
    listen: SocketAddr,
    tls: Option<(crate::tls::TlsConfig, Arc<rustls::ServerConfig>)>,
    app: axum::Router,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, Vec<JoinHandle<()>>), StartError> {
    let listen_error = |source| StartError::Listen {
        addr: listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(listen_error)?;
    let addr = listener.local_addr().map_err(listen_error)?;
    if let Some((tls, config)) = tls {
        let serving = axum_server::tls_rustls::RustlsConfig::from_config(config);
        let listener = listener.into_std().map_err(listen_error)?;
        let server = axum_server::tls_rustls::from_tcp_rustls(listener, serving.clone())
            .map_err(listen_error)?;
        let handle = axum_server::Handle::new();
        let stopper = handle.clone();
        let mut stop = shutdown.clone();
        let watcher = crate::tls::watch(tls, serving, shutdown);
        let task = tokio::spawn(async move {
            tokio::spawn(async move {
                let _ = stop.wait_for(|s| *s).await;
                stopper.graceful_shutdown(Some(TLS_CLOSE_GRACE));
            });
            if let Err(e) = server.handle(handle).serve(app.into_make_service()).await {
                tracing::error!("HTTPS server failed: {e}");
            }
        });
        return Ok((addr, vec![task, watcher]));
    }
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!("HTTP server failed: {e}");
        }
    });
    Ok((addr, vec![task]))
}

/// How long open TLS connections may finish their requests at shutdown.
const TLS_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
