//! Receivers that accept a connection and then hold the request: one never
//! answers, one stops after a few bytes, one trickles its answer a byte a
//! second forever. The batch deadline holds, each of their events is
//! retried with a reason saying which way it was held, and another stream
//! of the same sink, in the same batches, keeps being delivered.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// When each `steady` event reached the receiver, by event id.
type Arrivals = Arc<Mutex<Vec<(String, Instant)>>>;

/// One HTTP/1.1 server on loopback that behaves by the request's stream
/// (`ce-partitionkey`): `steady` gets `200` at once (keep-alive), `silent`
/// gets nothing, `stall` gets the start of a status line and then nothing,
/// `trickle` gets a header one byte a second for as long as it listens.
async fn held_receiver() -> (String, Arrivals) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let arrivals: Arrivals = Arrivals::default();
    let seen = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, seen.clone()));
        }
    });
    (origin, arrivals)
}

async fn serve(mut socket: TcpStream, arrivals: Arrivals) {
    let mut buf = Vec::new();
    loop {
        let Some((stream, id)) = read_request(&mut socket, &mut buf).await else {
            return;
        };
        match stream.as_str() {
            "steady" => {
                arrivals.lock().unwrap().push((id, Instant::now()));
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                if socket.write_all(ok).await.is_err() {
                    return;
                }
            }
            "stall" => {
                let _ = socket.write_all(b"HTTP/1.1 2").await;
                return hold(socket).await;
            }
            "trickle" => {
                let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nx-slow: ").await;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if socket.write_all(b"z").await.is_err() {
                        return;
                    }
                }
            }
            _ => return hold(socket).await,
        }
    }
}

/// Keep the connection open, saying nothing, until the client goes away.
async fn hold(mut socket: TcpStream) {
    let mut sink = [0u8; 1024];
    while let Ok(n) = socket.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// Read one request (head and `content-length` body) from `socket`; its
/// stream and event id, or `None` once the client closed.
async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String)> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head_end + length);
    Some((header("ce-partitionkey"), header("ce-id")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_requests_are_retried_saying_how_and_other_streams_flow() {
    // Fails rather than hangs when a timeout is missing.
    tokio::time::timeout(Duration::from_secs(90), held_requests_scenario())
        .await
        .expect("the scenario finished within 90 s");
}

async fn held_requests_scenario() {
    init_logs();
    let (origin, arrivals) = held_receiver().await;
    let (d, _plugins) = Harness::new()
        .plugins(move |plugins| {
            plugins.add_webhook_with_limits(
                "hook",
                &format!("{origin}/hook"),
                std::slice::from_ref(&origin),
                &new_secret(),
                "deadline = \"6s\"\nmax-batch = 50\n\
                 first-byte-timeout = \"2s\"\nbetween-bytes-timeout = \"2500ms\"\n",
                "",
            )
        })
        .start()
        .await
        .into_daemon();

    let held = [
        (
            "silent-1",
            "silent",
            "no response within the first-byte timeout",
        ),
        (
            "stall-1",
            "stall",
            "response stalled: no byte within the between-bytes timeout",
        ),
        (
            "trickle-1",
            "trickle",
            "unfinished before the batch deadline",
        ),
    ];
    let mut batch: Vec<_> = held
        .iter()
        .map(|(id, stream, _)| event(id, stream, "com.example.held", json!({})))
        .collect();
    batch.extend((1..=3).map(|i| {
        event(
            &format!("steady-{i}"),
            "steady",
            "com.example.steady",
            json!({ "i": i }),
        )
    }));
    d.post_batch(&batch).await;

    // Each held event ends its attempt as a retry naming how it was held;
    // none is a batch failure (a trap at the deadline would say so).
    for (id, _, why) in held {
        let state = d
            .wait_sink(id, "hook", Duration::from_secs(30), |x| {
                !x["last_error"].is_null()
            })
            .await;
        let reason = state["last_error"].as_str().unwrap();
        assert!(reason.contains(why), "{id}: {reason}");
        assert!(!reason.contains("trap"), "{id}: {reason}");
        assert_ne!(state["status"], "delivered", "{id}: {state}");
    }
    // The steady stream was delivered in the same batch, once each.
    for i in 1..=3 {
        let done = d
            .wait_sink(
                &format!("steady-{i}"),
                "hook",
                Duration::from_secs(30),
                |x| x["status"] == "delivered",
            )
            .await;
        assert_eq!(done["attempts"], 1, "{done}");
    }

    // While the held streams keep being retried (and held again), new
    // events of the steady stream reach the receiver at once and are
    // delivered on their first attempt.
    let posted = Instant::now();
    d.post_batch(&[event("steady-4", "steady", "com.example.steady", json!({}))])
        .await;
    let done = d
        .wait_sink("steady-4", "hook", Duration::from_secs(30), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(done["attempts"], 1, "{done}");
    let reached = arrivals
        .lock()
        .unwrap()
        .iter()
        .find(|(id, _)| id == "steady-4")
        .map(|(_, at)| *at - posted)
        .expect("steady-4 reached the receiver");
    assert!(
        reached < Duration::from_secs(7),
        "steady-4 waited {reached:?} behind the held streams"
    );
    for (id, _, why) in held {
        let state = d.delivery(id, "hook").await.unwrap();
        assert_ne!(state["status"], "delivered", "{id}: {state}");
        let reason = state["last_error"].as_str().unwrap();
        assert!(reason.contains(why), "{id}: {reason}");
    }
    d.stop().await;
}
