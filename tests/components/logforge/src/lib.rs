//! `logforge`: a sink that writes text shaped like the host's own log lines
//! into everything the host logs for it — a `log` message, a message of
//! 4,096 line breaks, ANSI escapes, and its `retry` (first attempt) and
//! `reject` (later attempts) reasons — trying to forge lines in the host's
//! log.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::outboxd::sink::log::{log, Level};
use bindings::outboxd::sink::types::RetryInfo;
use bindings::{Event, Outcome};

/// A line of the host's text log format, after a line break, and an ANSI
/// "clear screen".
fn forged(what: &str) -> String {
    format!(
        "harmless\n2026-12-01T00:00:00.000000Z  INFO outboxd::delivery: FORGED-{what} delivered sink=webhook\r\n\x1b[2J\u{85}\u{2028}"
    )
}

struct LogForge;

impl bindings::Guest for LogForge {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        log(Level::Warn, &forged("LOG"));
        log(Level::Info, &"\n".repeat(4096));
        batch
            .iter()
            .map(|e| {
                if e.attempt <= 1 {
                    Outcome::Retry(RetryInfo {
                        reason: forged("RETRY"),
                        after_ms: None,
                    })
                } else {
                    Outcome::Reject(forged("REJECT"))
                }
            })
            .collect()
    }
}

bindings::export!(LogForge with_types_in bindings);
