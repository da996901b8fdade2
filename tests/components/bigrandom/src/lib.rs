//! `bigrandom`: a sink whose `deliver` asks `wasi:random` for 64 MiB at
//! once, more than the host hands out in one call.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

/// Bytes asked for.
const ASK: u64 = 64 << 20;

struct BigRandom;

impl bindings::Guest for BigRandom {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let bytes = wasip2::random::random::get_random_bytes(ASK);
        batch
            .iter()
            .map(|_| {
                if bytes.is_empty() {
                    Outcome::Reject("no random bytes".into())
                } else {
                    Outcome::Delivered
                }
            })
            .collect()
    }
}

bindings::export!(BigRandom with_types_in bindings);
