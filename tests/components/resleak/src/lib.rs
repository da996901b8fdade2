//! `resleak`: a sink whose `deliver` asks the host for resources (clock
//! pollables) without end and never drops one.
//!
//! Each live resource costs host memory outside the guest's memory cap; the
//! host must refuse the one past its per-batch cap, fail the batch as a trap
//! and retry it.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct ResLeak;

impl bindings::Guest for ResLeak {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        loop {
            let pollable = wasip2::clocks::monotonic_clock::subscribe_duration(1_000_000_000);
            std::mem::forget(pollable);
            if batch.is_empty() {
                return Vec::new();
            }
        }
    }
}

bindings::export!(ResLeak with_types_in bindings);
