//! The WebAssembly runtime: one wasmtime engine, one instance per batch.
//!
//! Owns: the engine settings (component model, async, epoch interruption),
//! the per-store sandbox (WASI 0.2 with an empty context — no preopened
//! files, no environment, no sockets; `wasi:http` linked only for plugins
//! whose manifest grants HTTP), the memory cap, the batch deadline, and the
//! translation of everything a guest can do wrong into a [`SinkFailure`].
//!
//! Every batch gets a fresh `Store` instantiated from the plugin's
//! `InstancePre` (about 19 µs here, docs/measurements.md): after a trap an instance
//! only answers `CannotEnterComponent`, and a fresh store also means no
//! state leaks between batches. The daemon's runtime takes that instance
//! from a pool of slots while one is free ([`Runtime::with_instance_pool`]:
//! wasmtime resets a slot's memory to the component's initial image
//! before it serves another batch), else on demand.
//!
//! A guest that computes without end gives its thread back at every epoch
//! tick through `tokio::task::yield_now`, which lets the worker poll I/O and
//! timers before it runs the guest again. wasmtime's plain `Yield` wakes the
//! task at once instead: a spinning guest then holds a worker for about 60
//! ticks between two I/O polls, and with one or two workers (these machines
//! have 2 cores) the healthy sinks and the HTTP API stall for most of the
//! spinning guest's deadline (tests/integration_sandbox.rs shows it).
//!
//! Stack overflow comes in two forms. A guest that recurses with small
//! frames hits wasmtime's own stack limit (`Trap::StackOverflow`). One that
//! keeps arrays or other addressed locals per call exhausts first the stack
//! its toolchain keeps in linear memory (Rust and C place it at the bottom,
//! 1 MiB by default); the stack pointer then wraps below zero and the next
//! access traps as an out-of-bounds memory access. That trap, raised at the
//! bottom of a recursion (the backtrace is a few functions repeated), is
//! reported as a stack overflow too; the detail keeps the original trap.
//!
//! One outcome the host decides over the guest's answer: when the manifest's
//! grant denied every outbound request of a batch, a `retry` becomes a
//! `reject` naming the origin and the grant (`denied_by_manifest`): the
//! same request is denied on every attempt, so it is a configuration error,
//! not something the retry window fixes.
//!
//! Must never: let a guest fault, hang or allocate its way into the host —
//! every failure becomes a value; keep a store after it trapped.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store, UpdateDeadline};

use super::amqp::{AmqpAccess, AmqpPool};
use super::bindings::{Event, Outcome, SinkPre};
use super::cache::CompiledCache;
use super::egress::{EgressHooks, EgressPolicy, HttpClient, Timeouts};
use super::guest_text;
use super::host_state::HostState;
use super::log_limit::{log_dropped, LogLimit};
use super::manifest::{Builtin, Manifest};
use crate::limits::{DEADLINE_MARGIN, MAX_RESOURCES};

/// Instances the daemon's pool holds ([`Runtime::with_instance_pool`]):
/// batches of 16 busy destinations at the default two batches in flight;
/// past them, batches are instantiated on demand. About 260 GiB of address
/// space reserved, none of it memory until used.
pub const DAEMON_POOL_SLOTS: u32 = 32;

/// The largest memory a pooled instance may grow to: that of the largest
/// `limits.memory-mib` (4,096), so the pool serves every plugin; each
/// plugin's own cap is its `ResourceLimiter`'s, as on demand.
const MAX_POOLED_MEMORY: usize = 4 << 30;

/// How much of a pooled memory (and table) stays resident between
/// batches: a webhook batch of 100 touches about 200 KiB; a slot that
/// touched more gives the rest back to the kernel.
const POOL_KEEP_RESIDENT: usize = 1 << 20;

/// How often the epoch ticks; the deadline is checked at this grain.
pub use crate::limits::EPOCH_TICK;
/// Fewest bytes the host copies out of one guest call (wasmtime's hostcall
/// fuel, see [`hostcall_fuel`]): room for an AMQP message or an HTTP body
/// chunk whatever the batch.
const MIN_GUEST_TRANSFER: usize = 16 << 20;
/// Bytes of reason allowed per outcome when sizing [`hostcall_fuel`] (the
/// host keeps [`guest_text::MAX_REASON_BYTES`] of each).
const REASON_TRANSFER_PER_OUTCOME: usize = 64 << 10;

/// Fewest backtrace frames (wasmtime captures up to 20, innermost first)
/// for an out-of-bounds trap to count as the end of a recursion.
const RECURSION_MIN_FRAMES: usize = 16;
/// Most distinct functions per frame, as a fraction 1/N of the frames, for
/// a backtrace to count as a recursion (20 frames: at most 5 functions).
const RECURSION_FRAMES_PER_FUNCTION: usize = 4;

/// A batch the plugin failed as a whole; every event is retried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkFailure {
    /// The guest trapped: panic, out of memory, deadline, stack overflow,
    /// or an answer of the wrong shape.
    #[error("plugin trap: {kind}")]
    Trap {
        /// What trapped.
        kind: TrapKind,
        /// wasmtime's account of it.
        detail: String,
    },
    /// `init` refused its configuration.
    #[error("plugin init failed: {0}")]
    Init(String),
}

impl SinkFailure {
    /// The batch ran out of its deadline (the loop then halves the batch).
    pub fn is_deadline(&self) -> bool {
        matches!(
            self,
            SinkFailure::Trap {
                kind: TrapKind::Deadline,
                ..
            }
        )
    }

    /// The guest ran out of its memory cap (the loop then halves the batch
    /// too: its events no longer fit).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            SinkFailure::Trap {
                kind: TrapKind::OutOfMemory,
                ..
            }
        )
    }
}

/// What a guest did wrong, as [`SinkFailure::Trap`] names it. Shown (in
/// reasons, `/ready`, the `outboxd_plugin_traps_total{kind}` label) as
/// the short text of each variant's doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// `deadline`: the batch ran past the manifest's `limits.deadline`.
    Deadline,
    /// `out of memory`: the guest grew past `limits.memory-mib`.
    OutOfMemory,
    /// `stack overflow`: wasmtime's stack limit, or the guest's in-memory
    /// stack running out at the bottom of a recursion (module note).
    StackOverflow,
    /// `panic`: the guest reached `unreachable` (Rust's panic, C's abort).
    Panic,
    /// `out of fuel`: wasmtime's instruction fuel ran out.
    OutOfFuel,
    /// `too many resources (more than N live)`: the guest held more than
    /// [`MAX_RESOURCES`] resources at once.
    TooManyResources,
    /// `answer too large`: the guest handed the host more than it copies
    /// (the hostcall fuel, [`hostcall_fuel`]).
    AnswerTooLarge,
    /// `wrong number of outcomes`: `deliver` answered a number of outcomes
    /// other than the batch's events.
    WrongNumberOfOutcomes,
    /// `exit (status N)`: the guest called `wasi:cli/exit` instead of
    /// answering.
    Exit(i32),
    /// Another wasmtime trap, shown as wasmtime words it.
    Other(wasmtime::Trap),
    /// `error`: the call failed without a trap (a host call's error).
    Error,
}

impl std::fmt::Display for TrapKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrapKind::Deadline => f.write_str("deadline"),
            TrapKind::OutOfMemory => f.write_str("out of memory"),
            TrapKind::StackOverflow => f.write_str("stack overflow"),
            TrapKind::Panic => f.write_str("panic"),
            TrapKind::OutOfFuel => f.write_str("out of fuel"),
            TrapKind::TooManyResources => {
                write!(f, "too many resources (more than {MAX_RESOURCES} live)")
            }
            TrapKind::AnswerTooLarge => f.write_str("answer too large"),
            TrapKind::WrongNumberOfOutcomes => f.write_str("wrong number of outcomes"),
            TrapKind::Exit(status) => write!(f, "exit (status {status})"),
            TrapKind::Other(trap) => write!(f, "{trap}"),
            TrapKind::Error => f.write_str("error"),
        }
    }
}

/// The engine and what every plugin shares.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    /// The instance pool of [`Runtime::with_instance_pool`]: a batch's
    /// instance comes from it while a slot is free, else from `engine`.
    pool: Option<InstancePool>,
    /// Broker connections of the `amqp` interface, shared by all plugins.
    amqp: AmqpPool,
    /// Compiled components on disk (`<data-dir>/cache/`); `None` compiles
    /// every time (`outboxd plugin check`, tests).
    cache: Option<CompiledCache>,
    /// What plugins' outbound HTTPS trusts (`[egress]`); the webpki roots
    /// unless [`Runtime::with_trust`] says more.
    tls: Arc<rustls::ClientConfig>,
}

impl Runtime {
    /// Create the engine (instances allocated on demand) and start its
    /// epoch ticker (a thread that stops when the engine is dropped).
    pub fn new() -> wasmtime::Result<Runtime> {
        Runtime::with_config(wasmtime::Config::new())
    }

    /// As [`Runtime::new`], and batches are instantiated from a pool of
    /// `slots` instances first (the daemon's runtime). A slot keeps the
    /// pages its memory touched, reset between batches to the component's
    /// initial image, instead of mapping fresh memory for each batch and
    /// unmapping it after: a fresh instance per batch costs the kernel
    /// some 50 page faults and an unmap with its TLB shootdowns, about 4%
    /// of a webhook request's CPU (bench/results/2026-12-05-per-request-cuts.md).
    /// Each plugin is compiled once and loaded into both engines. A batch
    /// that finds no free slot, or whose component the pool cannot hold,
    /// gets its instance on demand as before: the pool only ever makes a
    /// batch cheaper, never refuses one. The reservation is virtual
    /// memory: two memories of 4 GiB a slot (the largest
    /// `limits.memory-mib`), and a fiber stack.
    ///
    /// A process that cannot reserve that much address space (a `ulimit
    /// -v`, a sandbox that caps mappings) runs without the pool: the
    /// warning names the slots and wasmtime's error, and every batch is
    /// instantiated on demand ([`Runtime::pooled_instances`] is `None`).
    ///
    /// # Errors
    ///
    /// Only [`Runtime::new`]'s: the pool is never the reason a runtime
    /// cannot start.
    pub fn with_instance_pool(slots: u32) -> wasmtime::Result<Runtime> {
        let mut pool = pooling(slots, MAX_POOLED_MEMORY);
        pool.linear_memory_keep_resident(POOL_KEEP_RESIDENT)
            .table_keep_resident(POOL_KEEP_RESIDENT)
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut runtime = Runtime::new()?;
        match Runtime::with_config(pooled_config(pool)) {
            Ok(pooled) => {
                runtime.pool = Some(InstancePool {
                    engine: pooled.engine,
                    slots,
                })
            }
            Err(e) => tracing::warn!(
                slots,
                error = %format!("{e:#}"),
                "the plugin instance pool cannot be reserved (is the address space limited, \
                 `ulimit -v`?); every batch is instantiated on demand"
            ),
        }
        Ok(runtime)
    }

    /// As [`Runtime::new`], with wasmtime's pooling allocator: `slots`
    /// instances' memories, tables and fiber stacks reserved up front,
    /// each memory at most `max_memory` bytes. Instantiation is cheaper
    /// (about 6.6 µs against 19 µs, docs/measurements.md); the reservation is virtual
    /// memory whether used or not. Used by the plugin benchmark.
    pub fn with_pooling(max_memory: usize, slots: u32) -> wasmtime::Result<Runtime> {
        Runtime::with_config(pooled_config(pooling(slots, max_memory)))
    }

    fn with_config(mut config: wasmtime::Config) -> wasmtime::Result<Runtime> {
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // `OUTBOXD_PERFMAP` set: compiled guest code is named in
        // `/tmp/perf-PID.map`, for `perf report` (docs/plugins.md).
        if std::env::var_os("OUTBOXD_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config)?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("outboxd-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            })
            .map_err(|e| wasmtime::format_err!("cannot start the epoch thread: {e}"))?;
        Ok(Runtime {
            engine,
            pool: None,
            amqp: AmqpPool::new(),
            cache: None,
            tls: super::egress::webpki_only(),
        })
    }

    /// Plugins prepared from now on send HTTPS trusting `tls`
    /// ([`super::egress::client_tls`]: the webpki roots and
    /// `egress.ca-file`).
    pub fn with_trust(mut self, tls: Arc<rustls::ClientConfig>) -> Runtime {
        self.tls = tls;
        self
    }

    /// Keep compiled components in `dir` (see [`super::cache`]), so a
    /// restart or a reload of an unchanged component does not compile again.
    pub fn with_cache(mut self, dir: std::path::PathBuf) -> Runtime {
        self.cache = Some(CompiledCache::new(&self.engine, dir));
        self
    }

    /// Instances the pool holds now (batches running in a slot); `None`
    /// without a pool ([`Runtime::with_instance_pool`]).
    pub fn pooled_instances(&self) -> Option<u64> {
        let pool = self.pool.as_ref()?;
        Some(
            pool.engine
                .pooling_allocator_metrics()?
                .component_instances(),
        )
    }

    /// The pool's slots: `slots` of [`Runtime::with_instance_pool`], 0
    /// without a pool (none asked for, or its address space refused).
    pub fn pool_slots(&self) -> u32 {
        self.pool.as_ref().map_or(0, |pool| pool.slots)
    }

    /// The compiled-component cache, when there is one.
    pub fn cache(&self) -> Option<&CompiledCache> {
        self.cache.as_ref()
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The AMQP brokers plugins publish to (for readiness: their status).
    pub fn amqp(&self) -> &AmqpPool {
        &self.amqp
    }

    /// A linker with WASI 0.2 and our `log` import; with `wasi:http` when
    /// `http` is true.
    pub fn linker(&self, http: bool) -> wasmtime::Result<Linker<HostState>> {
        linker(&self.engine, http)
    }

    /// Compile a component file, or load its compiled form from the cache.
    pub fn compile(&self, bytes: &[u8]) -> wasmtime::Result<Component> {
        match &self.cache {
            None => Component::new(&self.engine, bytes),
            Some(cache) => {
                let (component, source) = cache
                    .get_or_compile(&self.engine, bytes, || Component::new(&self.engine, bytes))?;
                tracing::debug!(?source, "component compiled or loaded from the cache");
                Ok(component)
            }
        }
    }

    /// Prepare a plugin: check its manifest's capabilities, link, and
    /// pre-instantiate. Errors say which import is not granted or which
    /// export is missing.
    pub fn prepare(&self, manifest: Manifest, component: &Component) -> Result<Plugin, String> {
        let policy = Arc::new(
            EgressPolicy::new(&manifest.capabilities.http)
                .map_err(|e| format!("capabilities.http: {e}"))?,
        );
        let grants_http = !manifest.capabilities.http.is_empty();
        let linker = self
            .linker(grants_http)
            .map_err(|e| format!("linking: {e:#}"))?;
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| explain_link_error(&e, grants_http))?;
        let pre = SinkPre::new(pre)
            .map_err(|e| format!("does not match the world outboxd:sink/sink: {e:#}"))?;
        let pooled = self.pooled_pre(component, grants_http);
        let config = manifest
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let amqp = self
            .amqp
            .access(manifest.capabilities.amqp.as_ref())
            .map_err(|e| format!("capabilities.amqp.{e}"))?;
        Ok(Plugin {
            name: Arc::from(manifest.name.as_str()),
            manifest,
            body: Body::Component { pre, pooled },
            config,
            client: super::egress::http_client(policy.clone(), &self.tls),
            policy,
            amqp,
            log_limit: Arc::default(),
        })
    }
}

impl Runtime {
    /// `component` loaded into the pooled engine and pre-instantiated
    /// there, when this runtime has a pool. `None` when it has none, or
    /// when the component cannot be loaded there (the plugin's batches
    /// then all run on demand; the reason is logged).
    fn pooled_pre(&self, component: &Component, http: bool) -> Option<SinkPre<HostState>> {
        let pool = &self.pool.as_ref()?.engine;
        let loaded = component.serialize().and_then(|bytes| {
            // SAFETY: the bytes are this process's own serialization of a
            // component compiled by an engine of the same settings.
            let pooled = unsafe { Component::deserialize(pool, bytes) }?;
            let pre = linker(pool, http)?.instantiate_pre(&pooled)?;
            SinkPre::new(pre)
        });
        match loaded {
            Ok(pre) => Some(pre),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the instance pool cannot load this component; its batches run on demand");
                None
            }
        }
    }

    /// A sink built into the host ([`super::manifest::Builtin`]): no
    /// component, no sandbox; its batches never leave the host.
    pub fn builtin(&self, manifest: Manifest, builtin: Builtin) -> Plugin {
        let policy = Arc::new(EgressPolicy::new(&[]).expect("an empty allow-list is valid"));
        Plugin {
            name: Arc::from(manifest.name.as_str()),
            body: Body::Builtin(builtin),
            config: Vec::new(),
            client: super::egress::http_client(policy.clone(), &self.tls),
            policy,
            amqp: self.amqp.access(None).expect("no AMQP capability is valid"),
            log_limit: Arc::default(),
            manifest,
        }
    }
}

/// The engine whose instances come from wasmtime's pooling allocator, and
/// how many slots it has.
#[derive(Clone)]
struct InstancePool {
    engine: Engine,
    slots: u32,
}

/// A pool of `slots` instances, each with its memories (two), tables and
/// fiber stack, each memory at most `max_memory` bytes.
fn pooling(slots: u32, max_memory: usize) -> wasmtime::PoolingAllocationConfig {
    let mut pool = wasmtime::PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(8))
        .total_memories(slots.saturating_mul(2))
        .total_tables(slots.saturating_mul(8))
        .total_stacks(slots)
        .max_memory_size(max_memory);
    pool
}

/// Engine settings that allocate instances from `pool`.
fn pooled_config(pool: wasmtime::PoolingAllocationConfig) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    config
}

/// The linker of every plugin of `engine`: WASI 0.2, the world's
/// interfaces, and `wasi:http` when `http` is true.
fn linker(engine: &Engine, http: bool) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    if http {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    }
    // The world's interfaces one by one: `http-batch` is defined by
    // hand, reading requests in place (`batch_imports`).
    use super::bindings::outboxd::sink::{amqp, hmac, log, trace, types};
    types::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    log::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    amqp::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    trace::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    hmac::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    super::batch_imports::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// Turn a linker error into a sentence naming the import.
fn explain_link_error(e: &wasmtime::Error, grants_http: bool) -> String {
    // Text, not a type: wasmtime 48's component linker reports a missing
    // or mismatched import only as a message (`bail!` in
    // component/linker.rs and matching.rs: "component imports instance
    // `…`", "instance export `…`"), with no error type to downcast to.
    let text = format!("{e:#}");
    if text.contains("wasi:http") && !grants_http {
        return format!(
            "imports wasi:http, which its manifest does not grant (add capabilities.http): {text}"
        );
    }
    let import = missing_import(&text);
    if text.contains("outboxd:sink/") {
        return format!(
            "imports {}, an outboxd:sink interface this host does not provide (built against another WIT version?): {text}",
            import.as_deref().unwrap_or("an interface")
        );
    }
    match import {
        Some(import) => format!(
            "imports {import}, which this host does not provide (it links wasi:cli, clocks, random, io, \
             filesystem, sockets, wasi:http when granted, and outboxd:sink/log, amqp, trace, http-batch, hmac): {text}"
        ),
        None => format!("imports something this host does not provide: {text}"),
    }
}

/// The import a linker error names (`component imports instance
/// `example:poke/poke`…` and, when the instance exists but lacks a member,
/// ``instance export `poke` …``), as "`example:poke/poke` (its `poke`)".
fn missing_import(text: &str) -> Option<String> {
    let quoted_after = |marker: &str| {
        let rest = &text[text.find(marker)? + marker.len()..];
        let start = rest.find('`')? + 1;
        let end = start + rest[start..].find('`')?;
        Some(rest[start..end].to_string())
    };
    let instance = quoted_after("imports instance")
        .or_else(|| quoted_after("imports func"))
        .or_else(|| quoted_after("import"));
    let member = quoted_after("instance export");
    match (instance, member) {
        (Some(i), Some(m)) => Some(format!("`{i}` (its `{m}`)")),
        (Some(i), None) => Some(format!("`{i}`")),
        (None, Some(m)) => Some(format!("`{m}`")),
        (None, None) => None,
    }
}

/// What runs a plugin's batches.
#[derive(Clone)]
enum Body {
    /// The pre-instantiated component, instantiated afresh per batch:
    /// from the instance pool's engine when a slot is free
    /// ([`Runtime::with_instance_pool`]), else on demand.
    Component {
        /// On demand.
        pre: SinkPre<HostState>,
        /// In the pool.
        pooled: Option<SinkPre<HostState>>,
    },
    /// A sink built into the host (manifest `builtin`).
    Builtin(Builtin),
}

/// A loaded plugin: its manifest and its pre-instantiated component.
#[derive(Clone)]
pub struct Plugin {
    name: Arc<str>,
    manifest: Manifest,
    body: Body,
    config: Vec<(String, String)>,
    policy: Arc<EgressPolicy>,
    /// This plugin's pooled outbound client (its connector applies
    /// `policy`'s address rule; see `egress`).
    client: HttpClient,
    amqp: AmqpAccess,
    /// How much this version may log ([`super::log_limit`]).
    log_limit: Arc<LogLimit>,
}

impl Plugin {
    /// Sink name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The manifest it was loaded from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// This version serving one destination of its sink: `config` merged
    /// over the manifest's `[config]` (a key given replaces the manifest's;
    /// `init` receives the result, sorted by key), and `retry` in place of
    /// the manifest's retry policy when given. Cheap: the compiled
    /// component, client and limits are shared.
    pub fn for_destination(
        &self,
        config: &std::collections::BTreeMap<String, String>,
        retry: Option<crate::plugin::manifest::RetryPolicy>,
    ) -> Plugin {
        let mut merged: std::collections::BTreeMap<String, String> =
            self.config.iter().cloned().collect();
        merged.extend(config.iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut plugin = self.clone();
        plugin.config = merged.into_iter().collect();
        if let Some(retry) = retry {
            plugin.manifest.retry = retry;
        }
        plugin
    }

    /// Deliver one batch in a fresh instance: instantiate, `init`, `deliver`,
    /// all inside the manifest's deadline and memory cap.
    ///
    /// Returns one outcome per event, or a [`SinkFailure`] for the whole
    /// batch (trap, deadline, wrong number of outcomes, init refused).
    pub async fn deliver(&self, batch: &[Event]) -> Result<Vec<Outcome>, SinkFailure> {
        self.run(batch, true, Default::default()).await
    }

    /// [`Plugin::deliver`] with the trace contexts of the batch's
    /// attempts, which the plugin reads through the `trace` interface and
    /// under which its outbound requests get their spans.
    pub async fn deliver_traced(
        &self,
        batch: &[Event],
        trace: super::trace::BatchTrace,
    ) -> Result<Vec<Outcome>, SinkFailure> {
        self.run(batch, true, trace).await
    }

    /// Instantiate and call `init` with the configuration, in the sandbox a
    /// batch gets, without calling `deliver` (what `plugin check` runs: the
    /// plugin is handed no batch, not even an empty one).
    pub async fn init(&self) -> Result<(), SinkFailure> {
        self.run(&[], false, Default::default()).await.map(|_| ())
    }

    /// [`Plugin::deliver`], or only its `init` when `deliver` is false.
    async fn run(
        &self,
        batch: &[Event],
        deliver: bool,
        trace: super::trace::BatchTrace,
    ) -> Result<Vec<Outcome>, SinkFailure> {
        let (pre, pooled) = match &self.body {
            Body::Component { pre, pooled } => (pre, pooled),
            Body::Builtin(Builtin::Discard) => {
                return Ok(batch.iter().map(|_| Outcome::Delivered).collect())
            }
        };
        let deadline = self.manifest.limits.deadline;
        let started = Instant::now();
        let mut store = None;
        let call = async {
            // A slot of the pool if one is free and the component fits it;
            // else (the pool's refusal) on demand, as without a pool. A
            // trap is the guest's own doing, and answers as it would on
            // demand.
            let mut sink = None;
            if let Some(pooled) = pooled {
                let mut in_pool = self.store(pooled.engine(), batch.len(), trace.clone());
                let instantiated = pooled.instantiate_async(&mut in_pool).await;
                store = Some(in_pool);
                match instantiated {
                    Ok(instance) => sink = Some(instance),
                    Err(e) if e.is::<wasmtime::Trap>() => return Err(e),
                    Err(_) => {}
                }
            }
            let sink = match sink {
                Some(sink) => sink,
                None => {
                    let fresh = store.insert(self.store(pre.engine(), batch.len(), trace));
                    pre.instantiate_async(fresh).await?
                }
            };
            let store = store.as_mut().expect("a store was made for the instance");
            if let Err(reason) = sink.call_init(&mut *store, &self.config).await? {
                return Ok(Err(reason));
            }
            if !deliver {
                return Ok(Ok(Vec::new()));
            }
            let outcomes = sink.call_deliver(&mut *store, batch).await?;
            Ok::<_, wasmtime::Error>(Ok(outcomes))
        };
        // The epoch deadline stops a guest that computes; this timeout stops
        // one that waits on the host (an HTTP response that never comes).
        let result = tokio::time::timeout(deadline + EPOCH_TICK * 10, call).await;
        log_dropped(&self.name, &self.log_limit);
        let Ok(result) = result else {
            return Err(SinkFailure::Trap {
                kind: TrapKind::Deadline,
                detail: format!("batch exceeded {deadline:?}"),
            });
        };
        // The store is there: `call` makes it before its first await.
        let (refused_memory, denied) = store.as_ref().map_or((None, None), |store| {
            (
                store.data().refused_memory(),
                store.data().denials().all_denied(),
            )
        });
        match result {
            Ok(Err(reason)) => Err(SinkFailure::Init(guest_text::clean(
                &reason,
                guest_text::MAX_REASON_BYTES,
            ))),
            Ok(Ok(outcomes)) if outcomes.len() != batch.len() => Err(SinkFailure::Trap {
                kind: TrapKind::WrongNumberOfOutcomes,
                detail: format!("{} outcomes for {} events", outcomes.len(), batch.len()),
            }),
            Ok(Ok(outcomes)) => Ok(outcomes
                .into_iter()
                .map(clean_outcome)
                .map(|o| match &denied {
                    Some(denial) => denied_by_manifest(o, denial),
                    None => o,
                })
                .collect()),
            Err(e) => Err(classify_trap(
                &e,
                refused_memory,
                started.elapsed() >= deadline,
            )),
        }
    }

    /// A fresh store of `engine` for one batch of `events`, its clock
    /// starting now: the sandbox's state ([`HostState`]), the memory cap,
    /// the hostcall fuel, and the epoch deadline — every tick stops the
    /// guest past its deadline, else lets the worker poll I/O and run
    /// other tasks before it resumes (see the module note on why
    /// `yield_now`, not `UpdateDeadline::Yield`).
    fn store(
        &self,
        engine: &Engine,
        events: usize,
        trace: super::trace::BatchTrace,
    ) -> Store<HostState> {
        let limits = &self.manifest.limits;
        let deadline = limits.deadline;
        let now = Instant::now();
        let memory_bytes = (limits.memory_mib as usize) << 20;
        let hooks = EgressHooks {
            plugin: self.name.clone(),
            policy: self.policy.clone(),
            client: self.client.clone(),
            requests_left: limits.max_requests,
            denials: Arc::default(),
            telemetry: trace.telemetry.clone(),
            answer_headers: Default::default(),
            last_host: None,
            max_response_bytes: limits.max_response_bytes,
            timeouts: Timeouts {
                first_byte: limits.first_byte_timeout,
                between_bytes: limits.between_bytes_timeout,
                until: now + deadline - DEADLINE_MARGIN.min(deadline / 2),
            },
        };
        let state = HostState::new(
            self.name.clone(),
            self.log_limit.clone(),
            memory_bytes,
            hooks,
            self.amqp.for_batch(now + deadline),
            trace,
        );
        let mut store = Store::new(engine, state);
        store.limiter(|s| s.limiter());
        store.set_hostcall_fuel(hostcall_fuel(events, memory_bytes));
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if now.elapsed() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::YieldCustom(
                    1,
                    Box::pin(tokio::task::yield_now()),
                ))
            }
        });
        store
    }
}

/// How many bytes the host may copy out of one guest call — a host call's
/// arguments, or `deliver`'s answer — for a batch of `events` from a guest
/// capped at `memory_bytes`: room for one outcome per event with a reason of
/// [`REASON_TRANSFER_PER_OUTCOME`], at least [`MIN_GUEST_TRANSFER`], never
/// more than the guest's own memory cap.
///
/// wasmtime charges this fuel while it lifts: a list's length times the
/// host size of its elements *before* it allocates the host vector, and
/// each string's length before it copies it. An answer past it fails the
/// call (`answer too large`) with nothing allocated for it, so a guest
/// returning millions of outcomes, or one string aliased by every outcome,
/// cannot make the host allocate past this bound.
fn hostcall_fuel(events: usize, memory_bytes: usize) -> usize {
    let answer =
        events.saturating_mul(std::mem::size_of::<Outcome>() + REASON_TRANSFER_PER_OUTCOME);
    answer.max(MIN_GUEST_TRANSFER).min(memory_bytes)
}

/// `outcome` of a batch whose every outbound request the manifest denied
/// (`denial`: the first one, naming the URL and the grant): a `retry`
/// becomes a `reject`. A request outside `capabilities.http` is denied the
/// same way on every attempt, so retrying it for the whole retry window
/// (24 h by default) only hides a configuration error; dead-lettered at
/// once, with a reason saying what to fix, it shows at the first attempt
/// and is replayed (`outboxd dead replay`) once the manifest or the URL is
/// fixed. Outcomes the guest already decided (`delivered`, `reject`) stand.
/// A batch in which any request went out is left as the guest answered:
/// which of its retries a denial caused cannot be told.
fn denied_by_manifest(outcome: Outcome, denial: &str) -> Outcome {
    match outcome {
        Outcome::Retry(info) => Outcome::Reject(guest_text::clean(
            &format!(
                "HTTP-request-denied by the manifest, not retried: {denial}; \
                 grant the origin in capabilities.http or fix the URL, then replay \
                 (plugin said: {})",
                info.reason
            ),
            guest_text::MAX_REASON_BYTES,
        )),
        other => other,
    }
}

/// An outcome whose reason passed [`guest_text::clean`].
fn clean_outcome(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Delivered => Outcome::Delivered,
        Outcome::Retry(mut info) => {
            info.reason = guest_text::clean(&info.reason, guest_text::MAX_REASON_BYTES);
            Outcome::Retry(info)
        }
        Outcome::Reject(reason) => {
            Outcome::Reject(guest_text::clean(&reason, guest_text::MAX_REASON_BYTES))
        }
    }
}

/// Name the kind of a guest failure.
fn classify_trap(
    e: &wasmtime::Error,
    refused_memory: Option<usize>,
    past_deadline: bool,
) -> SinkFailure {
    // The error text carries the guest's own function names (its name
    // section), which are guest-supplied text like any other.
    let detail = guest_text::clean(&format!("{e:#}"), guest_text::MAX_LOG_BYTES);
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        // `wasi:cli/exit`: the guest ended itself instead of answering.
        return SinkFailure::Trap {
            kind: TrapKind::Exit(exit.0),
            detail,
        };
    }
    let kind = match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => TrapKind::Deadline,
        Some(wasmtime::Trap::StackOverflow) => TrapKind::StackOverflow,
        Some(wasmtime::Trap::MemoryOutOfBounds) if in_deep_recursion(e) => TrapKind::StackOverflow,
        _ if refused_memory.is_some() => TrapKind::OutOfMemory,
        _ if e.chain().any(|c| {
            c.downcast_ref::<wasmtime::component::ResourceTableError>()
                .is_some()
        }) =>
        {
            TrapKind::TooManyResources
        }
        // Text, not a type: wasmtime 48's `HostcallFuelExhausted`
        // (component/func/options.rs) is private, so its message is all a
        // caller can recognise it by.
        _ if e.chain().any(|c| {
            c.to_string()
                .contains("fuel allocated for hostcalls has been exhausted")
        }) =>
        {
            TrapKind::AnswerTooLarge
        }
        Some(wasmtime::Trap::UnreachableCodeReached) => TrapKind::Panic,
        Some(wasmtime::Trap::OutOfFuel) => TrapKind::OutOfFuel,
        Some(trap) => TrapKind::Other(*trap),
        None if past_deadline => TrapKind::Deadline,
        None => TrapKind::Error,
    };
    SinkFailure::Trap { kind, detail }
}

/// Whether the guest trapped at the bottom of a recursion: its backtrace has
/// at least [`RECURSION_MIN_FRAMES`] frames and at most one distinct
/// function per [`RECURSION_FRAMES_PER_FUNCTION`] frames. An out-of-bounds
/// access there is the guest's in-memory stack running out (module note).
fn in_deep_recursion(e: &wasmtime::Error) -> bool {
    let Some(backtrace) = e.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return false;
    };
    let frames = backtrace.frames();
    if frames.len() < RECURSION_MIN_FRAMES {
        return false;
    }
    let mut distinct: Vec<&wasmtime::FrameInfo> = Vec::new();
    for frame in frames {
        let seen = distinct.iter().any(|d| {
            d.func_index() == frame.func_index()
                && wasmtime::Module::same(d.module(), frame.module())
        });
        if !seen {
            distinct.push(frame);
        }
    }
    distinct.len() * RECURSION_FRAMES_PER_FUNCTION <= frames.len()
}
