//! `checksum`: the plugin benchmark's sink (host/examples/plugin_bench.rs).
//!
//! For each event it computes an FNV-1a 64 checksum over the id, the stream
//! and the data, and answers `delivered` (`reject` should the checksum be
//! zero, so the work cannot be optimised away). The benchmark runs the same
//! function natively to price the plugin call itself.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

struct Checksum;

/// FNV-1a, 64 bits, over several byte strings in turn.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl bindings::Guest for Checksum {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        batch
            .iter()
            .map(|e| match fnv1a(&[e.id.as_bytes(), e.stream.as_bytes(), &e.data]) {
                0 => Outcome::Reject("checksum is zero".into()),
                _ => Outcome::Delivered,
            })
            .collect()
    }
}

bindings::export!(Checksum with_types_in bindings);
