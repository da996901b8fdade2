//! `exitzero`: a sink whose `deliver` calls `exit(0)` (`wasi:cli/exit` with
//! success) instead of answering.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct ExitZero;

impl bindings::Guest for ExitZero {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        if !batch.is_empty() {
            std::process::exit(0);
        }
        Vec::new()
    }
}

bindings::export!(ExitZero with_types_in bindings);
