//! `webhook`: an outboxd sink that POSTs each event to one URL in the
//! CloudEvents HTTP binary binding, signed per Standard Webhooks — or, with
//! `payload = "awareness"`, as the awareness service POSTs to its
//! subscriptions.
//!
//! The host creates a fresh instance per batch and calls `init` with the
//! manifest's `[config]`, then `deliver` once. `init` parses and checks the
//! configuration and keeps it in a static; `deliver` sends the batch with
//! `wasi:http/outgoing-handler`, different streams concurrently and each
//! stream in order, and answers one outcome per event. See README.md.
//!
//! Modules: `config` (the `[config]` keys), `cloudevents` (headers and
//! Standard Webhooks signature), `awareness` (the awareness payload mode),
//! `deliver` (each event's request). Sending and scheduling are the SDK's
//! (`outboxd_sink::pending`, `outboxd_sink::streams`).

mod awareness;
mod cloudevents;
mod config;
mod deliver;

use config::Config;
use outboxd_sink::configured::Configured;
use outboxd_sink::{Event, Outcome};

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Configured<Config> = Configured::new();

struct Webhook;

impl outboxd_sink::Guest for Webhook {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        CONFIG.init(&config, Config::parse)
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        CONFIG.deliver(&batch, deliver::deliver)
    }
}

outboxd_sink::export!(Webhook);

/// Small blocks from per-size free lists: the batch's many short strings
/// cost a few instructions each instead of `dlmalloc`'s hundreds
/// (`outboxd_sink::alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: outboxd_sink::alloc::SizeClasses = outboxd_sink::alloc::SizeClasses::new();
