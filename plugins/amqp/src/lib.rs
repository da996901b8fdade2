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

use config::Config;
use outboxd_sink::configured::Configured;
use outboxd_sink::{Event, Outcome};

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Configured<Config> = Configured::new();

struct Amqp;

impl outboxd_sink::Guest for Amqp {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        CONFIG.init(&config, Config::parse)
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        CONFIG.deliver(&batch, |config, batch| {
            deliver::deliver(config, batch, outboxd_sink::amqp::publish_batch)
        })
    }
}

outboxd_sink::export!(Amqp);

/// Small blocks from per-size free lists: the batch's many short strings
/// cost a few instructions each instead of `dlmalloc`'s hundreds
/// (`outboxd_sink::alloc`).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: outboxd_sink::alloc::SizeClasses = outboxd_sink::alloc::SizeClasses::new();
