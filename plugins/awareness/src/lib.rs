//! `awareness`: an outboxd sink that POSTs each event to an awareness
//! service's `/ingest`, the role of the vaults' awareness dispatcher.
//!
//! The event is read by the shared mapping (docs/awareness.md) into the body
//! `{eventId, id, w3id, evaultPublicKey, data, schemaId, operation,
//! requestingPlatform, occurredAt, streamVersion}`, sent with
//! `x-ingest-secret`; different streams (packets) concurrently, each in
//! order, through the SDK's sender. See README.md.
//!
//! Modules: `config` (the `[config]` keys), `request` (an event's body and
//! headers), `answer` (what the service's status means).
//!
//! Must never: dead-letter on a refused secret (every event would go), or
//! send an event before its predecessor in the same packet.

mod answer;
mod config;
mod request;

use config::Config;
use outboxd_sink::batch::{self, BatchRequest};
use outboxd_sink::configured::Configured;
use outboxd_sink::{streams, Event, Outcome};

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Configured<Config> = Configured::new();

struct Awareness;

impl outboxd_sink::Guest for Awareness {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        CONFIG.init(&config, Config::parse)
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        CONFIG.deliver(&batch, |config, batch| {
            // The one response header an answer is judged by (`answer`).
            outboxd_sink::batch::keep_response_headers(&["retry-after"]);
            streams::deliver(
                batch,
                config.max_concurrency,
                |event| start(config, event),
                |_, response| answer::judge(&response, batch::now()),
            )
        })
    }
}

/// Builds `event`'s request; `Err` is an outcome decided without sending.
fn start(config: &Config, event: &Event) -> Result<BatchRequest, Outcome> {
    match request::build_traced(config, event) {
        Ok((headers, body)) => Ok(batch::post(&config.ingest, headers, body, config.timeout)),
        Err(reason) => Err(Outcome::Reject(reason)),
    }
}

outboxd_sink::export!(Awareness);

/// Small blocks from per-size free lists: the batch's many short strings
/// cost a few instructions each instead of `dlmalloc`'s hundreds
/// (`outboxd_sink::alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: outboxd_sink::alloc::SizeClasses = outboxd_sink::alloc::SizeClasses::new();
