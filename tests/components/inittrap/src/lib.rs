//! `inittrap`: a sink whose `init` panics (an `unreachable` trap, built with
//! `panic = "abort"`), so every batch fails before `deliver` runs.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct InitTrap;

impl bindings::Guest for InitTrap {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        panic!("init refuses to start ({} config keys)", config.len())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        batch.iter().map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(InitTrap with_types_in bindings);
