//! The state of one plugin instance's store, and every host function the
//! `outboxd:sink` world and WASI give it: the WASI and `wasi:http` views,
//! `log`, `types`, `amqp`, `trace` and `hmac` (`http-batch`'s are
//! [`super::batch_imports`]'). Beside [`super::bindings`], as wasmtime keeps
//! host state and generated impls beside the bindings.
//!
//! Owns: [`HostState`] (one per batch, built by the runtime) and its
//! memory cap ([`MemoryCap`]). Must never: outlive its batch, or share
//! anything mutable with another instance but the plugin's log rate.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::amqp::AmqpAccess;
use super::bindings::{self, AmqpMessage, Level, PublishError};
use super::egress::{EgressHooks, InFlight, Recent};
use super::guest_text;
use super::log_limit::{self, LogLimit, PLUGIN_LOG_TARGET};
use crate::limits::{MAX_INSTANCES, MAX_RANDOM_BYTES, MAX_RESOURCES, MAX_TABLE_ELEMENTS};

/// Per-store state of one plugin instance.
pub struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    /// The plugin's log rate (shared by its batches).
    log_limit: Arc<LogLimit>,
    limits: MemoryCap,
    hooks: EgressHooks,
    /// The `http-batch` requests started and not yet waited for.
    in_flight: InFlight,
    /// What this batch's `http-batch` requests parsed so far.
    recent: Recent,
    plugin: Arc<str>,
    /// What this batch may publish over AMQP.
    amqp: AmqpAccess,
    /// The trace contexts of this batch's attempts.
    trace: super::trace::BatchTrace,
}

impl HostState {
    /// The state of one batch of `plugin`: WASI with an empty context (no
    /// preopened files, no environment, no sockets), at most
    /// [`MAX_RESOURCES`] live host resources, a memory cap of
    /// `memory_bytes`, outbound HTTP through `hooks` and AMQP through
    /// `amqp`, and the attempts' trace contexts `trace`.
    pub fn new(
        plugin: Arc<str>,
        log_limit: Arc<LogLimit>,
        memory_bytes: usize,
        hooks: EgressHooks,
        amqp: AmqpAccess,
        trace: super::trace::BatchTrace,
    ) -> HostState {
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        HostState {
            wasi: WasiCtx::builder().max_random_size(MAX_RANDOM_BYTES).build(),
            http: WasiHttpCtx::new(),
            table,
            log_limit,
            limits: MemoryCap {
                max_bytes: memory_bytes,
                refused: None,
            },
            hooks,
            in_flight: InFlight::default(),
            recent: Recent::default(),
            plugin,
            amqp,
            trace,
        }
    }

    /// The store's resource limiter.
    pub fn limiter(&mut self) -> &mut MemoryCap {
        &mut self.limits
    }

    /// What this batch's requests came to against the manifest's grant.
    pub fn denials(&self) -> Arc<super::egress::Denials> {
        self.hooks.denials.clone()
    }

    /// What the `http-batch` imports work with.
    pub fn http_batch(&mut self) -> HttpBatchState<'_> {
        HttpBatchState {
            hooks: &mut self.hooks,
            in_flight: &mut self.in_flight,
            recent: &mut self.recent,
        }
    }

    /// The memory growth refused (bytes asked for), if any was.
    pub fn refused_memory(&self) -> Option<usize> {
        self.limits.refused
    }
}

/// A batch's `http-batch` state, borrowed from its [`HostState`].
pub struct HttpBatchState<'a> {
    /// The egress hooks every request goes through.
    pub hooks: &'a mut EgressHooks,
    /// The requests started and not yet waited for.
    pub in_flight: &'a mut InFlight,
    /// What the batch's requests parsed so far.
    pub recent: &'a mut Recent,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl bindings::outboxd::sink::log::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        let plugin = &*self.plugin;
        let message = guest_text::clean(&message, guest_text::MAX_LOG_BYTES);
        if !self.log_limit.admit(message.len()) {
            return;
        }
        log_limit::log_dropped(plugin, &self.log_limit);
        match level {
            Level::Trace => tracing::trace!(target: PLUGIN_LOG_TARGET, plugin, "{message}"),
            Level::Debug => tracing::debug!(target: PLUGIN_LOG_TARGET, plugin, "{message}"),
            Level::Info => tracing::info!(target: PLUGIN_LOG_TARGET, plugin, "{message}"),
            Level::Warn => tracing::warn!(target: PLUGIN_LOG_TARGET, plugin, "{message}"),
            Level::Error => tracing::error!(target: PLUGIN_LOG_TARGET, plugin, "{message}"),
        }
    }
}

impl bindings::outboxd::sink::types::Host for HostState {}

impl bindings::outboxd::sink::trace::Host for HostState {
    fn traceparent(&mut self, event_id: String) -> Option<String> {
        self.trace.traceparent(&event_id)
    }

    fn traceparents(&mut self) -> Vec<(String, String)> {
        self.trace.traceparents()
    }
}

impl bindings::outboxd::sink::hmac::Host for HostState {
    async fn sha256(&mut self, key: Vec<u8>, message: Vec<u8>) -> Vec<u8> {
        hmac_sha256(&key, &message).await.to_vec()
    }
}

/// Bytes hashed between two yields of [`hmac_sha256`]: under a
/// millisecond of one core even for SHA-256 without the CPU's extensions.
const HMAC_SLICE: usize = 1 << 20;

/// HMAC-SHA-256 (RFC 2104 over FIPS 180-4 SHA-256) of `message` under
/// `key`, with the CPU's SHA extensions where it has them (`sha2` detects
/// them at run time). A long message is hashed [`HMAC_SLICE`] at a time,
/// the worker given back between slices, so a guest handing over all its
/// memory holds no worker for long and the batch deadline still applies.
async fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use hmac::Mac as _;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for (i, slice) in message.chunks(HMAC_SLICE).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        mac.update(slice);
    }
    mac.finalize().into_bytes().into()
}

impl bindings::outboxd::sink::amqp::Host for HostState {
    async fn publish_batch(&mut self, messages: Vec<AmqpMessage>) -> Vec<Result<(), PublishError>> {
        let access = self.amqp.clone();
        access.publish_batch(messages).await
    }
}

/// Memory cap that remembers a refused growth, so a guest that dies of it
/// (a Rust guest then hits `unreachable`, docs/measurements.md) is reported as out of
/// memory.
pub struct MemoryCap {
    max_bytes: usize,
    refused: Option<usize>,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.refused = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_INSTANCES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hmac_sha256_gives_the_rfc_4231_vectors() {
        // RFC 4231 §4.3 (test case 2) and §4.7 (test case 6: a key longer
        // than the block, hashed first).
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?").await),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )
            .await),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[tokio::test]
    async fn a_message_hashed_in_slices_is_hashed_whole() {
        use hmac::Mac as _;
        let message: Vec<u8> = (0..(HMAC_SLICE * 2 + 17)).map(|i| i as u8).collect();
        let mut whole = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"k").unwrap();
        whole.update(&message);
        let want: [u8; 32] = whole.finalize().into_bytes().into();
        assert_eq!(hmac_sha256(b"k", &message).await, want);
    }
}
