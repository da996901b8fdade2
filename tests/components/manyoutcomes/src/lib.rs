//! `manyoutcomes`: a sink that answers 3,000,000 outcomes for a batch of
//! any size — about 96 MB of canonical-ABI list in its own memory, which
//! the host must refuse to copy rather than allocate for.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

/// Outcomes answered.
const OUTCOMES: usize = 3_000_000;

struct ManyOutcomes;

impl bindings::Guest for ManyOutcomes {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(_batch: Vec<Event>) -> Vec<Outcome> {
        (0..OUTCOMES).map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(ManyOutcomes with_types_in bindings);
