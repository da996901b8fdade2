//! `amqp`: an outboxd sink that publishes each event to one RabbitMQ
//! exchange, with a routing key built from the event, persistent and
//! confirmed by the broker.
//!
//! The host creates a fresh instance per batch and calls `init` with the
//! manifest's `[config]`, then `deliver` once. `init` parses and checks the
//! configuration and keeps it in a static; `deliver` turns the events into
//! messages in the CloudEvents AMQP binary binding and hands them to the
//! host's `outboxd:sink/amqp` interface, which sends them together and
//! awaits their confirms together. See README.md.
//!
//! Modules: `config` (the `[config]` keys), `template` (the routing key),
//! `message` (event → message and headers), `deliver` (the batch's rounds
//! and what each answer means).

mod config;
mod deliver;
mod message;
mod template;

// The `outboxd:sink/sink` world's bindings come from the guest SDK
// (`plugins/sdk`, crate `outboxd_sink`).

use std::sync::{Mutex, PoisonError};

use config::Config;
use outboxd_sink::{log, Event, Level, Outcome, RetryInfo};

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

struct Amqp;

impl outboxd_sink::Guest for Amqp {
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
                .map(|_| {
                    Outcome::Retry(RetryInfo {
                        reason: "sink not initialised".into(),
                        after_ms: None,
                    })
                })
                .collect();
        };
        let outcomes = deliver::deliver(config, &batch, outboxd_sink::amqp::publish_batch);
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

outboxd_sink::export!(Amqp);
