//! `spin`: a sink whose `deliver` computes forever and never answers.
//!
//! The host must stop it at the manifest's `limits.deadline` (epoch
//! interruption) and retry the batch. The loop feeds its state through
//! `black_box`, so the compiler cannot prove it useless and remove it.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use std::hint::black_box;

use bindings::{Event, Outcome};

struct Spin;

impl bindings::Guest for Spin {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let mut state = batch.len() as u64;
        loop {
            state = black_box(state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
        }
    }
}

bindings::export!(Spin with_types_in bindings);
