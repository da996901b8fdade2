//! Guest SDK for outboxd sinks (`outboxd:sink@0.1.5`, from the WIT in
//! `wit/`).
//!
//! - The world's bindings under plain names: [`Event`], [`Outcome`],
//!   [`RetryInfo`], [`Guest`], [`log()`] and [`Level`], the [`amqp`]
//!   interface, and [`export!`] to export your sink.
//! - [`http`]: one blocking request over `wasi:http/outgoing-handler` that
//!   drops host resources in the order the host requires.
//! - [`batch`]: many requests in one host call (`http-batch`, since
//!   0.1.2), the fast way out; [`streams`] sends a batch's events with it,
//!   one request per stream per call, each stream in batch order (what the
//!   `webhook` and `awareness` sinks send with).
//! - [`pending`]: one request over `wasi:http` driven without blocking,
//!   for a sink that wants `wasi:http` itself.
//! - [`config`]: the `[config]` table read with known keys, each once;
//!   [`configured::Configured`] keeps what `init` accepted for `deliver`.
//! - [`trace`]: the current attempt's W3C `traceparent`, to send on.
//! - [`sign`]: HMAC-SHA-256 computed by the host (`hmac`, since WIT 0.1.3).
//! - [`alloc`]: a size-class allocator for a sink's instance, about 20,000
//!   WebAssembly instructions a request cheaper than `dlmalloc` for the
//!   `webhook` sink; a sink opts in with `#[global_allocator]`.
//! - [`outcome`]: what an HTTP answer means — 2xx delivered; 408, 425, 429
//!   and 5xx retry with the `Retry-After` hint (delta-seconds or HTTP-date);
//!   anything else reject; a transport error retry, named.
//!
//! ```ignore
//! struct MySink;
//! impl outboxd_sink::Guest for MySink {
//!     fn init(config: Vec<(String, String)>) -> Result<(), String> { Ok(()) }
//!     fn deliver(batch: Vec<outboxd_sink::Event>) -> Vec<outboxd_sink::Outcome> {
//!         batch.iter().map(|_| outboxd_sink::Outcome::Delivered).collect()
//!     }
//! }
//! outboxd_sink::export!(MySink);
//! ```
//!
//! Must never: hold state across batches (the host instantiates a sink
//! afresh for each), or decide retries beyond one answer's meaning.

/// Bindings generated from `wit/` for the world `outboxd:sink/sink`.
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "sink",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "outboxd_sink::bindings",
    });
}

pub mod alloc;
pub mod batch;
pub mod config;
pub mod configured;
pub mod http;
pub mod outcome;
pub mod pending;
pub mod sign;
pub mod streams;
pub mod trace;

pub use bindings::outboxd::sink::amqp;
pub use bindings::outboxd::sink::log::{log, Level};
pub use bindings::outboxd::sink::types::RetryInfo;
pub use bindings::{export, Event, Guest, Outcome};
