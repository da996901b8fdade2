//! `hungry`: a sink that needs memory in proportion to its batch, as a real
//! sink building request bodies does: it keeps three copies of every
//! event's data until the batch is answered, then answers `delivered` for
//! each. A batch too big for `limits.memory-mib` runs out of memory; a
//! smaller one of the same events goes through.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use std::hint::black_box;

use bindings::{Event, Outcome};

/// Copies kept of each event's data.
const COPIES: usize = 3;

struct Hungry;

impl bindings::Guest for Hungry {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for event in &batch {
            for _ in 0..COPIES {
                kept.push(black_box(event.data.clone()));
            }
        }
        black_box(&kept);
        batch.iter().map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(Hungry with_types_in bindings);
