//! `awareness`: an outboxd sink that POSTs each event to an awareness
//! service's `/ingest`, the role of the vaults' awareness dispatcher.
//!
//! The event is read by the shared mapping (docs/awareness.md) into the body
//! `{eventId, id, w3id, evaultPublicKey, data, schemaId, operation,
//! requestingPlatform, occurredAt, streamVersion}`, sent with
//! `x-ingest-secret`; different streams (packets) concurrently, each in
//! order, through the SDK's sender. See README.md.
//!
//! Modules: `config` (the `[config]` keys), `answer` (what the service's
//! status means).
//!
//! Must never: dead-letter on a refused secret (every event would go), or
//! send an event before its predecessor in the same packet.

mod answer;
mod config;

use std::borrow::Cow;

use awareness_wire::Packet;
use config::Config;
use outboxd_sink::configured::Configured;
use outboxd_sink::pending::{self, Answer, Header, Post, Progress, Request};
use outboxd_sink::{streams, Event, Outcome};

/// Sent as `user-agent`.
const USER_AGENT: &str = concat!("outboxd-awareness/", env!("CARGO_PKG_VERSION"));

/// The configuration `init` accepted, for this instance's `deliver` call.
static CONFIG: Configured<Config> = Configured::new();

struct Awareness;

impl outboxd_sink::Guest for Awareness {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        CONFIG.init(&config, Config::parse)
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        CONFIG.deliver(&batch, |config, batch| {
            streams::deliver(
                batch,
                config.max_concurrency,
                |event| start(config, event),
                |_, response| answer::judge(&response, pending::now()),
            )
        })
    }
}

/// Builds the body and headers of `event` and starts its request.
fn start<'a>(config: &Config, event: &'a Event) -> Progress<'a> {
    let packet = match Packet::from_event(event) {
        Ok(packet) => packet,
        Err(reason) => return Progress::Done(Answer::Decided(Outcome::Reject(reason))),
    };
    let body = awareness_wire::ingest_body(&packet);
    let headers: [Header; 4] = [
        ("content-type".into(), b"application/json".to_vec()),
        ("content-length".into(), body.len().to_string().into_bytes()),
        ("user-agent".into(), USER_AGENT.as_bytes().to_vec()),
        ("x-ingest-secret".into(), config.secret.as_bytes().to_vec()),
    ];
    let post = Post {
        url: &config.ingest,
        headers: &headers,
        timeout: config.timeout,
    };
    Request::start(post, Cow::Owned(body))
}

outboxd_sink::export!(Awareness);
