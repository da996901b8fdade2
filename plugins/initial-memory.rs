//! The build script of the shipped sinks (each names it as `build` in its
//! Cargo.toml): links a WebAssembly sink with 2 MiB of initial linear
//! memory. The toolchain's default is its 1 MiB stack and the data, about
//! 1.1 MiB, so the heap a batch needs (a webhook batch of 100 touches
//! about 200 KiB) comes from `memory.grow`, again in every batch, as every
//! batch gets a fresh instance. In the daemon's instance pool each grow,
//! and each reset of a grown memory to its initial size, is an `mprotect`:
//! with 2 MiB none is needed, and the thread that runs the webhook sink
//! spends about 2.5% less CPU a request
//! (bench/results/2026-12-05-initial-memory.md). The pages cost nothing
//! until touched; the manifest's `limits.memory-mib` still caps the
//! memory, and must be at least 2 for these sinks.
//!
//! Native builds (the sinks' own tests) are linked as usual.

/// Bytes of linear memory a sink starts with (a multiple of the 64 KiB
/// WebAssembly page).
const INITIAL_MEMORY: u32 = 2 << 20;

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-cdylib=--initial-memory={INITIAL_MEMORY}");
    }
    println!("cargo:rerun-if-changed=../initial-memory.rs");
}
