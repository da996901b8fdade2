//! `bigreason`: a sink whose reasons and log messages are 512 KiB each: a
//! `retry` reason on the first attempt, a `reject` reason after, trying to
//! fill the host's database, log and admin answers.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::outboxd::sink::log::{log, Level};
use bindings::outboxd::sink::types::RetryInfo;
use bindings::{Event, Outcome};

/// Size of every reason and message, bytes.
const SIZE: usize = 512 << 10;

fn big(what: &str) -> String {
    let mut s = format!("{what}:");
    s.push_str(&"x".repeat(SIZE - s.len()));
    s
}

struct BigReason;

impl bindings::Guest for BigReason {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        log(Level::Info, &big("log"));
        batch
            .iter()
            .map(|e| {
                if e.attempt <= 1 {
                    Outcome::Retry(RetryInfo {
                        reason: big("retry"),
                        after_ms: None,
                    })
                } else {
                    Outcome::Reject(big("reject"))
                }
            })
            .collect()
    }
}

bindings::export!(BigReason with_types_in bindings);
