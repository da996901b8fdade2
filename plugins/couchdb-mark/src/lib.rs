//! `couchdb-mark`: an outboxd sink that marks a CouchDB document's outbox
//! entry published — the last step of the document-store outbox, chained
//! `after = "amqp"` so an entry is marked only once the broker confirmed
//! its publish.
//!
//! The event's stream is the document id and its id the entry's
//! `event_id` (as the `couchdb` source relays them). The host creates a
//! fresh instance per batch and calls `init` with the manifest's
//! `[config]`, then `deliver` once; `deliver` marks the events through the
//! host's `http-batch` interface, different documents concurrently (HTTP is
//! the only capability it needs). See README.md.
//!
//! Modules: `config` (the `[config]` keys), `http` (a round of requests in
//! one host call),
//! `mark` (load, set, save, re-read on 409; what each answer means).

mod config;
mod http;
mod mark;

/// Bindings for the `outboxd:sink/sink` world, generated from `wit/` at the
/// repository root. WASI comes from the `wasip2` crate instead.
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "sink",
    });
}

use std::sync::{Mutex, PoisonError};

use bindings::outboxd::sink::log::{log, Level};
use bindings::outboxd::sink::types::RetryInfo;
use bindings::{Event, Outcome};
use config::Config;

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

struct CouchdbMark;

impl bindings::Guest for CouchdbMark {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        let config = Config::parse(&config)?;
        *CONFIG.lock().unwrap_or_else(PoisonError::into_inner) = Some(config);
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let guard = CONFIG.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(config) = guard.as_ref() else {
            log(Level::Error, "deliver called before a successful init");
            return batch
                .iter()
                .map(|_| retry("sink not initialised".into()))
                .collect();
        };
        let now = wasip2::clocks::wall_clock::now();
        let now = mark::rfc3339(now.seconds, now.nanoseconds);
        mark::mark_batch(config, &batch, &now)
    }
}

fn retry(reason: String) -> Outcome {
    Outcome::Retry(RetryInfo {
        reason,
        after_ms: None,
    })
}

bindings::export!(CouchdbMark with_types_in bindings);

/// Small blocks from per-size free lists: the batch's many short strings
/// cost a few instructions each instead of `dlmalloc`'s hundreds
/// (`outboxd_sink::alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: outboxd_sink::alloc::SizeClasses = outboxd_sink::alloc::SizeClasses::new();
