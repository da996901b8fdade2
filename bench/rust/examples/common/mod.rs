//! What the benchmark programs share (included with `#[path]`, so Cargo
//! does not take it for an example of its own): the wall clock the
//! receiver and the load generators compare, the 256-byte JSON data of
//! event `k`, percentiles, reading the receiver's JSON, and loading and
//! calling a plugin as a delivery turn does.
//!
//! Must never: hold anything measured; it only formats and reads.

#![allow(dead_code)] // each program uses part of it

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// Wall-clock time in Unix nanoseconds: the receiver's arrival times and
/// the load generators' ack and commit times are compared on it (one
/// machine, one clock).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// 256 bytes of JSON data for event `k` (`{"k":k,"pad":"xx…"}`), the size
/// docs/measurements.md measures with.
pub fn data(k: usize) -> Value {
    let head = format!("{{\"k\":{k},\"pad\":\"\"}}");
    let pad = "x".repeat(256usize.saturating_sub(head.len()));
    json!({ "k": k, "pad": pad })
}

/// p50, p90, p95, p99, p99.9 and the maximum of `v` (nearest rank), and
/// how many there were (`count`); `null` for none.
pub fn percentiles(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    json!({
        "p50": at(0.50), "p90": at(0.90), "p95": at(0.95), "p99": at(0.99), "p999": at(0.999),
        "max": v[v.len() - 1], "count": v.len(),
    })
}

/// GET `url` and parse its JSON body; panics naming what failed (the
/// receiver is the harness's own).
pub async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client
        .get(url)
        .send()
        .await
        .expect("receiver answers")
        .json()
        .await
        .expect("receiver JSON")
}

/// Load the built plugin `target/plugins/<name>.wasm` with `manifest` (the
/// TOML text, naming `<name>.wasm` as its component or none), as the
/// daemon loads a plugins folder. Errors name a missing build or what the
/// loader refused.
pub fn load_plugin(name: &str, manifest: &str) -> anyhow::Result<outboxd::plugin::Plugin> {
    // This crate is bench/rust/: the repository is two folders up.
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wasm = root.join(format!("target/plugins/{name}.wasm"));
    anyhow::ensure!(
        wasm.is_file(),
        "{} is missing: run scripts/build-plugins.sh first",
        wasm.display()
    );
    let dir = tempfile::tempdir()?;
    std::fs::copy(&wasm, dir.path().join(format!("{name}.wasm")))?;
    let path = dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, manifest)?;
    // The daemon's runtime: instances from its pool while a slot is free.
    let runtime = outboxd::plugin::Runtime::with_instance_pool(outboxd::plugin::DAEMON_POOL_SLOTS)
        .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let plugin = outboxd::plugin::load_one(&runtime, &path)
        .map_err(|f| anyhow::anyhow!("{}: {}", f.file.display(), f.reason))?;
    // The component is compiled into memory; the folder may go.
    drop(dir);
    Ok(plugin)
}

/// Deliver `chunk` through `plugin` as a turn does (fresh instance,
/// `init`, `deliver`). Errors: a failed batch, or any event not
/// delivered (naming its outcome).
pub async fn deliver_all(
    plugin: &outboxd::plugin::Plugin,
    chunk: &[outboxd::plugin::bindings::Event],
) -> anyhow::Result<()> {
    let outcomes = plugin
        .deliver(chunk)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(bad) = outcomes
        .iter()
        .find(|o| !matches!(o, outboxd::plugin::bindings::Outcome::Delivered))
    {
        anyhow::bail!("plugin did not deliver: {bad:?}");
    }
    Ok(())
}
