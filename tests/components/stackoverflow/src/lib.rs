//! `stackoverflow`: a sink whose `deliver` recurses without bound.
//!
//! `[config] frame` picks which of a guest's two stacks runs out first:
//!
//! - `big` (the default): every call keeps a 4 KiB array in linear memory,
//!   on the shadow stack the Rust toolchain places at the bottom of linear
//!   memory (1 MiB). Past its end the stack pointer wraps below zero and
//!   the next store faults near 4 GiB.
//! - `small`: every call keeps only a few values in WebAssembly locals, so
//!   the engine's own stack limit (wasmtime's `max_wasm_stack`) is hit.
//!
//! Each call uses its callee's result after the call, through `black_box`,
//! so neither tail-call nor accumulator elimination can turn the recursion
//! into a loop.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use bindings::{Event, Outcome};

/// Size of the array each `deep_big` call keeps on the shadow stack, bytes.
const FRAME: usize = 4096;

/// Whether `init` chose `frame = "small"`.
static SMALL: AtomicBool = AtomicBool::new(false);

struct StackOverflow;

impl bindings::Guest for StackOverflow {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        for (key, value) in &config {
            match (key.as_str(), value.as_str()) {
                ("frame", "big") => SMALL.store(false, Ordering::Relaxed),
                ("frame", "small") => SMALL.store(true, Ordering::Relaxed),
                ("frame", other) => return Err(format!("frame: {other:?} is neither \"big\" nor \"small\"")),
                (other, _) => return Err(format!("unknown key {other:?}")),
            }
        }
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let depth = if SMALL.load(Ordering::Relaxed) { deep_small(0) } else { deep_big(0) };
        // Never reached; keeps the result alive.
        batch.iter().map(|_| Outcome::Reject(format!("reached the bottom at depth {depth}"))).collect()
    }
}

/// Recurse keeping a [`FRAME`]-byte array in linear memory per call.
#[inline(never)]
fn deep_big(depth: u64) -> u64 {
    let mut frame = [0u8; FRAME];
    frame[depth as usize % FRAME] = depth as u8;
    let frame = black_box(&mut frame);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    let below = deep_big(black_box(depth + 1));
    black_box(below ^ frame[depth as usize % 7] as u64)
}

/// Recurse keeping only WebAssembly locals per call.
#[inline(never)]
fn deep_small(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return 0;
    }
    let below = deep_small(black_box(depth + 1));
    black_box(below ^ depth)
}

bindings::export!(StackOverflow with_types_in bindings);
