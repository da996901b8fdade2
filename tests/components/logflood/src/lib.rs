//! `logflood`: a sink that writes 5,000 log lines of 100 bytes in every
//! batch and asks for every event to be retried, so it floods the host's
//! log batch after batch.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::outboxd::sink::log::{log, Level};
use bindings::outboxd::sink::types::RetryInfo;
use bindings::{Event, Outcome};

/// Lines per batch.
const LINES: usize = 5_000;

struct LogFlood;

impl bindings::Guest for LogFlood {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        for i in 0..LINES {
            log(Level::Info, &format!("FLOOD line {i:05} {}", "x".repeat(83)));
        }
        batch
            .iter()
            .map(|_| {
                Outcome::Retry(RetryInfo {
                    reason: "flooding".into(),
                    after_ms: None,
                })
            })
            .collect()
    }
}

bindings::export!(LogFlood with_types_in bindings);
