//! What the plugin call costs: the `checksum` test component
//! (tests/components/checksum) against the same checksum run natively, per
//! event, for batches of 1, 100 and 1000 events of 256 bytes of data; and
//! the cost of a call with an empty batch (instantiate from the
//! `InstancePre`, `init`, `deliver` of nothing) with wasmtime's on-demand
//! and pooling allocators.
//!
//! ```text
//! cargo build --release --target wasm32-wasip2 -p checksum \
//!     --manifest-path tests/components/Cargo.toml   # CARGO_TARGET_DIR=target/wasm-test-components
//! cargo run --release -p outboxd-bench --example plugin_bench -- \
//!     --component target/wasm-test-components/wasm32-wasip2/release/checksum.wasm
//! ```
//!
//! Prints a table, then one JSON line (`{"sizes": [...], "empty": {...}}`)
//! for bench/run.py. The WASM path is what a delivery turn pays: a fresh
//! instance per batch, the events copied into the guest, the outcomes
//! copied out.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use outboxd::plugin::bindings::{Event, Outcome};
use outboxd::plugin::{load_one, Plugin, Runtime};

#[derive(Parser)]
struct Args {
    /// The `checksum` component (.wasm).
    #[arg(long)]
    component: PathBuf,
    /// Events per batch size measured.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Batch sizes, comma-separated.
    #[arg(long, default_value = "1,100,1000", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Bytes of data per event.
    #[arg(long, default_value_t = 256)]
    data_bytes: usize,
}

/// The guest's checksum, natively: FNV-1a 64 over id, stream and data.
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

/// The native sink: the same work as the component, in the host.
fn native_deliver(batch: &[Event]) -> Vec<Outcome> {
    batch
        .iter()
        .map(
            |e| match fnv1a(&[e.id.as_bytes(), e.stream.as_bytes(), &e.data]) {
                0 => Outcome::Reject("checksum is zero".into()),
                _ => Outcome::Delivered,
            },
        )
        .collect()
}

fn events(n: usize, data_bytes: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event {
            id: format!("01JBENCH{i:08}"),
            source: "https://example.com/bench".into(),
            type_: "com.example.bench".into(),
            subject: None,
            stream: format!("orders/{}", i % 10),
            sequence: i as u64 + 1,
            time: "2026-11-30T00:00:00Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: (0..data_bytes)
                .map(|b| b"0123456789abcdef"[(i + b) % 16])
                .collect(),
            extensions: vec![],
            attempt: 1,
            ingested_at: "2026-11-30T00:00:00Z".into(),
        })
        .collect()
}

fn load(runtime: &Runtime, component: &std::path::Path, dir: &std::path::Path) -> Plugin {
    let manifest = dir.join("checksum.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = \"checksum\"\nversion = \"0.1.0\"\ncomponent = {:?}\nwit = \"outboxd:sink@0.1.0\"\n\
             [limits]\nmax-batch = 1000\nmemory-mib = 64\n",
            component.canonicalize().expect("component file").display().to_string()
        ),
    )
    .unwrap();
    load_one(runtime, &manifest).unwrap_or_else(|f| panic!("{}: {}", f.file.display(), f.reason))
}

/// Mean time per call of `f` over `calls` calls, after a warm-up.
async fn per_call<F, Fut>(calls: usize, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..(calls / 10).clamp(3, 100) {
        f().await;
    }
    let start = Instant::now();
    for _ in 0..calls {
        f().await;
    }
    start.elapsed() / calls as u32
}

fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let on_demand = Runtime::new().expect("engine");
    let pooling = Runtime::with_pooling(64 << 20, 16).expect("pooling engine");
    let plugin = load(&on_demand, &args.component, dir.path());
    let pooled = load(&pooling, &args.component, dir.path());

    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>12}",
        "batch", "wasm ns/event", "native ns/ev", "call ns/event", "wasm/native"
    );
    let mut rows = Vec::new();
    for &size in &args.sizes {
        let batch = events(size, args.data_bytes);
        let calls = (args.events / size).max(20);
        let wasm = per_call(calls, || async {
            let out = plugin.deliver(black_box(&batch)).await.expect("deliver");
            assert!(out.iter().all(|o| matches!(o, Outcome::Delivered)));
        })
        .await;
        // The native sink is fast enough to need many more calls to time.
        let native_calls = calls * 50;
        let native = per_call(native_calls, || async {
            black_box(native_deliver(black_box(&batch)));
        })
        .await;
        let (w, n) = (ns(wasm) / size as f64, ns(native) / size as f64);
        println!(
            "{size:>6} {w:>14.0} {n:>14.0} {:>14.0} {:>12.1}",
            w - n,
            w / n
        );
        rows.push(serde_json::json!({
            "batch": size, "calls": calls, "wasm_ns_per_event": w, "native_ns_per_event": n,
            "ratio": w / n,
        }));
    }

    let calls = 2000;
    let empty_on_demand = per_call(calls, || async {
        plugin.deliver(&[]).await.expect("deliver");
    })
    .await;
    let empty_pooling = per_call(calls, || async {
        pooled.deliver(&[]).await.expect("deliver");
    })
    .await;
    println!(
        "empty batch (instantiate + init + deliver): on-demand {:.1} µs, pooling {:.1} µs, on-demand/pooling {:.2}",
        ns(empty_on_demand) / 1e3,
        ns(empty_pooling) / 1e3,
        ns(empty_on_demand) / ns(empty_pooling)
    );
    println!(
        "{}",
        serde_json::json!({
            "data_bytes": args.data_bytes,
            "sizes": rows,
            "empty": {
                "on_demand_us": ns(empty_on_demand) / 1e3,
                "pooling_us": ns(empty_pooling) / 1e3,
                "ratio": ns(empty_on_demand) / ns(empty_pooling),
            },
        })
    );
}
