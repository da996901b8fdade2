//! `panic`: a sink whose `deliver` panics.
//!
//! Built with `panic = "abort"` like every shipped plugin, so the panic
//! ends in an `unreachable` trap.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct Panic;

impl bindings::Guest for Panic {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        panic!("the panic test sink panics on every batch ({} events)", batch.len());
    }
}

bindings::export!(Panic with_types_in bindings);
