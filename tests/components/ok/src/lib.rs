//! `ok`: a healthy sink that answers `delivered` for every event without
//! sending anything anywhere — the control for the sandbox tests, and a
//! baseline for the cost of a sink call that does no work.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct Ok;

impl bindings::Guest for Ok {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Result::Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        batch.iter().map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(Ok with_types_in bindings);
