//! `membomb`: a sink whose `deliver` allocates without bound.
//!
//! It keeps 1 MiB buffers, each written so its pages are really used, until
//! the host's memory cap (`limits.memory-mib`) refuses to grow the linear
//! memory; the allocator then fails and the guest aborts.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use std::hint::black_box;

use bindings::{Event, Outcome};

/// Size of each buffer kept, bytes.
const CHUNK: usize = 1 << 20;

struct MemBomb;

impl bindings::Guest for MemBomb {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            let chunk = vec![batch.len() as u8 | 1; CHUNK];
            hoard.push(black_box(chunk));
            black_box(&mut hoard);
        }
    }
}

bindings::export!(MemBomb with_types_in bindings);
