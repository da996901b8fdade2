//! `webhook`: an outboxd sink that POSTs each event to one URL in the
//! CloudEvents HTTP binary binding, signed per Standard Webhooks.
//!
//! The host creates a fresh instance per batch and calls `init` with the
//! manifest's `[config]`, then `deliver` once. `init` parses and checks the
//! configuration and keeps it in a static; `deliver` sends the batch with
//! `wasi:http/outgoing-handler`, different streams concurrently and each
//! stream in order, and answers one outcome per event. See README.md.
//!
//! Modules: `config` (the `[config]` keys), `cloudevents` (headers and
//! signature), `send` (one request, non-blocking), `deliver` (the batch's
//! scheduling), `outcome` (what a response means).

mod cloudevents;
mod config;
mod deliver;
mod send;

/// The `outboxd:sink/sink` world's bindings and the outcome of an HTTP
/// answer, from the guest SDK (`plugins/sdk`). WASI comes from the `wasip2`
/// crate.
use outboxd_sink::outcome;

use std::sync::{Mutex, PoisonError};

use config::Config;
use outboxd_sink::{log, Event, Level, Outcome};

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

struct Webhook;

impl outboxd_sink::Guest for Webhook {
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
                .map(|_| outcome::retry("sink not initialised"))
                .collect();
        };
        let outcomes = deliver::deliver(config, &batch);
        log(Level::Debug, &summary(&outcomes));
        outcomes
    }
}

/// `N events: D delivered, R to retry, J rejected`.
fn summary(outcomes: &[Outcome]) -> String {
    let (mut delivered, mut retry, mut reject) = (0, 0, 0);
    for outcome in outcomes {
        match outcome {
            Outcome::Delivered => delivered += 1,
            Outcome::Retry(_) => retry += 1,
            Outcome::Reject(_) => reject += 1,
        }
    }
    format!(
        "{} events: {delivered} delivered, {retry} to retry, {reject} rejected",
        outcomes.len()
    )
}

outboxd_sink::export!(Webhook);
