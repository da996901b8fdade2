//! `wrongcount`: a sink whose `deliver` answers one outcome fewer than the
//! batch has events, breaking the `outcomes[i]` answers `batch[i]` rule.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct WrongCount;

impl bindings::Guest for WrongCount {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        batch.iter().skip(1).map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(WrongCount with_types_in bindings);
