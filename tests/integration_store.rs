//! Ingest and claim semantics, one suite run against both stores (real
//! PostgreSQL and SQLite): every rule of `outboxd::store` a user relies on.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Backend, HeldLocks, TestDb};
use outboxd::event::parse_one;
use outboxd::store::{Finish, IngestError, IngestItem, Store};
use serde_json::json;

fn item(id: &str, stream: &str, data: serde_json::Value, sinks: &[&str]) -> IngestItem {
    let ev = json!({"specversion": "1.0", "id": id, "source": "s", "type": "t", "partitionkey": stream, "data": data});
    IngestItem {
        event: parse_one(ev.to_string().as_bytes()).unwrap(),
        sinks: sinks.iter().map(|s| s.to_string()).collect(),
        producer: None,
    }
}

fn raw_item(text: &str, sinks: &[&str]) -> IngestItem {
    IngestItem {
        event: parse_one(text.as_bytes()).unwrap(),
        sinks: sinks.iter().map(|s| s.to_string()).collect(),
        producer: None,
    }
}

async fn deliveries(store: &Arc<dyn Store>, id: &str) -> usize {
    store
        .event(id)
        .await
        .unwrap()
        .map(|(_, d)| d.len())
        .unwrap_or(0)
}

async fn event_and_deliveries_commit_together(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .ingest(&[item("a", "s1", json!({"v": 1}), &["x", "y"])])
        .await
        .unwrap();
    assert_eq!(deliveries(&store, "a").await, 2);
    // The second item conflicts with "a": nothing of the request is stored.
    let err = store
        .ingest(&[
            item("b", "s1", json!({}), &["x"]),
            item("a", "s1", json!({"v": 2}), &["x"]),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, IngestError::Conflict { index: 1, .. }),
        "{err}"
    );
    assert!(
        store.event("b").await.unwrap().is_none(),
        "b must not be half-stored"
    );
    // ...and the stream's sequence did not move.
    let r = store
        .ingest(&[item("c", "s1", json!({}), &["x"])])
        .await
        .unwrap();
    assert_eq!(r[0].sequence, 2);
    db.cleanup().await;
}

async fn same_id_same_content_is_a_duplicate_different_content_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let first = r#"{"specversion":"1.0","id":"e1","source":"s","type":"t","partitionkey":"p","data":{"a":1,"b":[1,2]}}"#;
    let same = r#"{"data":{ "b":[1, 2], "a":1 },"type":"t","partitionkey":"p","source":"s","id":"e1","specversion":"1.0"}"#;
    let r1 = store.ingest(&[raw_item(first, &["x"])]).await.unwrap();
    let r2 = store.ingest(&[raw_item(same, &["x"])]).await.unwrap();
    assert!(!r1[0].duplicate);
    assert!(r2[0].duplicate);
    assert_eq!(r1[0].sequence, r2[0].sequence);
    assert_eq!(
        deliveries(&store, "e1").await,
        1,
        "a duplicate queues nothing"
    );

    let other = r#"{"specversion":"1.0","id":"e1","source":"s","type":"t2","partitionkey":"p","data":{"a":2,"b":[1,2]}}"#;
    match store.ingest(&[raw_item(other, &["x"])]).await {
        Err(IngestError::Conflict { attributes, .. }) => {
            assert_eq!(attributes, vec!["type", "data"])
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Never overwritten.
    let (stored, _) = store.event("e1").await.unwrap().unwrap();
    assert_eq!(stored.event.ty, "t");
    db.cleanup().await;
}

async fn the_same_id_twice_in_one_request_is_a_duplicate_or_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let r = store
        .ingest(&[
            item("d1", "s", json!({"v": 1}), &["x"]),
            item("d2", "s", json!({"v": 2}), &["x"]),
            item("d1", "s", json!({"v": 1}), &["x"]),
        ])
        .await
        .unwrap();
    assert!(!r[0].duplicate && !r[1].duplicate);
    assert!(r[2].duplicate, "the repeat is a duplicate");
    assert_eq!(
        (r[2].sequence, r[1].sequence),
        (1, 2),
        "the repeat keeps the first's sequence"
    );
    assert_eq!(deliveries(&store, "d1").await, 1, "one delivery, not two");
    let err = store
        .ingest(&[
            item("d3", "s", json!({}), &["x"]),
            item("d3", "s", json!({"other": true}), &["x"]),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, IngestError::Conflict { index: 1, .. }),
        "{err}"
    );
    assert!(
        store.event("d3").await.unwrap().is_none(),
        "nothing of the request stored"
    );
    db.cleanup().await;
}

async fn a_b_a_is_three_events(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut seqs = Vec::new();
    for (id, state) in [("1", "A"), ("2", "B"), ("3", "A")] {
        let r = store
            .ingest(&[item(id, "doc", json!({"state": state}), &["x", "y"])])
            .await
            .unwrap();
        assert!(!r[0].duplicate);
        seqs.push(r[0].sequence);
        assert_eq!(deliveries(&store, id).await, 2);
    }
    assert_eq!(seqs, vec![1, 2, 3]);
    db.cleanup().await;
}

async fn sixteen_concurrent_writers_get_gapless_sequences(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let per_writer = 10;
    let mut tasks = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..per_writer {
                let r = store
                    .ingest(&[item(
                        &format!("w{w}-{i}"),
                        "hot",
                        json!({"w": w, "i": i}),
                        &["x"],
                    )])
                    .await
                    .unwrap();
                seqs.push(r[0].sequence);
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let seqs = t.await.unwrap();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "one writer's sequences increase: {seqs:?}"
        );
        all.extend(seqs);
    }
    all.sort();
    let expected: Vec<u64> = (1..=16 * per_writer as u64).collect();
    assert_eq!(all, expected, "1..N, no duplicate, no gap");
    db.cleanup().await;
}

/// One request larger than a multi-row statement holds (1,200 events over
/// seven streams, two sinks each: 2,400 deliveries): every event and
/// delivery is stored with its sequence, and each (sink, stream) gets one
/// head, its first event — the claim takes the seven heads, then their runs
/// in order.
async fn a_request_of_1200_events_is_stored_whole_in_order(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let items: Vec<IngestItem> = (0..1200)
        .map(|i| {
            item(
                &format!("e{i}"),
                &format!("s{}", i % 7),
                json!({"i": i}),
                &["x", "y"],
            )
        })
        .collect();
    let r = store.ingest(&items).await.unwrap();
    for (i, got) in r.iter().enumerate() {
        assert_eq!(got.sequence, (i / 7 + 1) as u64, "e{i}");
    }
    for i in [0, 499, 500, 1199] {
        assert_eq!(deliveries(&store, &format!("e{i}")).await, 2, "e{i}");
    }
    for sink in ["x", "y"] {
        let heads = store.claim(sink, 7, Duration::from_secs(30)).await.unwrap();
        let ids: BTreeSet<String> = heads.iter().map(|c| c.event.event.id.clone()).collect();
        let want: BTreeSet<String> = (0..7).map(|i| format!("e{i}")).collect();
        assert_eq!(
            ids, want,
            "{sink}: the first event of each stream is its head"
        );
        for c in &heads {
            assert!(store
                .finish(c.delivery_id, &c.lease_token, &Finish::Delivered)
                .await
                .unwrap());
        }
        // Then the rest, batch after batch, each stream in order.
        let mut last: std::collections::HashMap<String, u64> = Default::default();
        let mut delivered = heads.len();
        loop {
            let run = store
                .claim(sink, 300, Duration::from_secs(30))
                .await
                .unwrap();
            if run.is_empty() {
                break;
            }
            for c in &run {
                let prev = last.insert(c.event.event.stream.clone(), c.event.sequence);
                assert!(
                    prev.is_none_or(|p| p < c.event.sequence),
                    "{sink}: in order"
                );
                assert!(c.event.sequence > 1, "{sink}: heads were delivered");
                assert!(store
                    .finish(c.delivery_id, &c.lease_token, &Finish::Delivered)
                    .await
                    .unwrap());
            }
            delivered += run.len();
        }
        assert_eq!(delivered, 1200, "{sink}: every delivery, once");
    }
    db.cleanup().await;
}

async fn producer_sequence_is_kept_and_must_not_go_backwards(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let ev = |id: &str, seq: u64| {
        raw_item(
            &format!(
                r#"{{"specversion":"1.0","id":"{id}","source":"s","type":"t","partitionkey":"p","sequence":"{seq}"}}"#
            ),
            &["x"],
        )
    };
    assert_eq!(store.ingest(&[ev("a", 10)]).await.unwrap()[0].sequence, 10);
    assert_eq!(store.ingest(&[ev("b", 12)]).await.unwrap()[0].sequence, 12);
    for (id, seq) in [("c", 11), ("d", 12)] {
        match store.ingest(&[ev(id, seq)]).await {
            Err(IngestError::SequenceNotIncreasing { given, last, .. }) => {
                assert_eq!((given, last), (seq, 12))
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // outboxd-assigned sequences continue after the producer's.
    assert_eq!(
        store
            .ingest(&[item("e", "p", json!({}), &["x"])])
            .await
            .unwrap()[0]
            .sequence,
        13
    );
    db.cleanup().await;
}

async fn claims_take_heads_and_runs_never_a_successor_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    for (id, stream) in [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B")] {
        store
            .ingest(&[item(id, stream, json!({}), &["x"])])
            .await
            .unwrap();
    }
    let lease = Duration::from_secs(30);
    let first = store.claim("x", 2, lease).await.unwrap();
    let ids: BTreeSet<String> = first.iter().map(|c| c.event.event.id.clone()).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["a1".to_string(), "b1".to_string()]),
        "heads first"
    );
    assert!(
        store.claim("x", 10, lease).await.unwrap().is_empty(),
        "a2 waits while a1 is leased"
    );
    for c in &first {
        assert_eq!(c.attempts, 1, "the attempt is counted at claim");
        assert!(store
            .finish(c.delivery_id, &c.lease_token, &Finish::Delivered)
            .await
            .unwrap());
    }
    let run = store.claim("x", 10, lease).await.unwrap();
    let ids: Vec<String> = run.iter().map(|c| c.event.event.id.clone()).collect();
    assert_eq!(
        ids,
        vec!["a2", "a3"],
        "a contiguous run of one stream, in order"
    );
    // A released delivery is not charged an attempt.
    for c in &run {
        assert!(store
            .finish(c.delivery_id, &c.lease_token, &Finish::Release)
            .await
            .unwrap());
    }
    let again = store.claim("x", 10, lease).await.unwrap();
    assert_eq!(
        again.iter().map(|c| c.attempts).collect::<Vec<_>>(),
        vec![1, 1]
    );
    db.cleanup().await;
}

async fn an_expired_lease_is_reclaimed_and_the_stale_holder_is_fenced_off(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .ingest(&[item("e", "s", json!({}), &["x"])])
        .await
        .unwrap();
    let old = store
        .claim("x", 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(old.len(), 1);
    assert!(
        store
            .claim("x", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "a live lease is left alone"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = store.claim("x", 10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(new.len(), 1, "an expired lease is reclaimed");
    assert_eq!(new[0].attempts, 2);
    assert_ne!(new[0].lease_token, old[0].lease_token);
    let stale = Finish::Dead {
        reason: "stale".into(),
        blocks_stream: false,
    };
    assert!(
        !store
            .finish(old[0].delivery_id, &old[0].lease_token, &stale)
            .await
            .unwrap(),
        "stale token changes nothing"
    );
    assert!(store
        .finish(new[0].delivery_id, &new[0].lease_token, &Finish::Delivered)
        .await
        .unwrap());
    let (_, d) = store.event("e").await.unwrap().unwrap();
    assert_eq!(d[0].status, "delivered");
    db.cleanup().await;
}

async fn a_retry_waits_its_delay(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .ingest(&[item("e", "s", json!({}), &["x"])])
        .await
        .unwrap();
    let c = store.claim("x", 10, Duration::from_secs(30)).await.unwrap();
    let retry = Finish::Retry {
        delay: Duration::from_millis(600),
        reason: "HTTP 503".into(),
    };
    assert!(store
        .finish(c[0].delivery_id, &c[0].lease_token, &retry)
        .await
        .unwrap());
    assert!(
        store
            .claim("x", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "not before its time"
    );
    let wait = store.next_due_in("x").await.unwrap().unwrap();
    assert!(
        wait > Duration::from_millis(300) && wait <= Duration::from_millis(600),
        "{wait:?}"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let again = store.claim("x", 10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1);
    let (_, d) = store.event("e").await.unwrap().unwrap();
    assert_eq!(d[0].last_error.as_deref(), Some("HTTP 503"));
    assert!(store
        .finish(
            again[0].delivery_id,
            &again[0].lease_token,
            &Finish::Delivered
        )
        .await
        .unwrap());
    let (_, d) = store.event("e").await.unwrap().unwrap();
    assert_eq!(d[0].status, "delivered");
    assert_eq!(
        d[0].last_error, None,
        "a delivered delivery shows no error of an earlier attempt"
    );
    db.cleanup().await;
}

async fn four_workers_never_claim_the_same_delivery(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let items: Vec<IngestItem> = (0..60)
        .map(|i| item(&format!("e{i}"), &format!("s{i}"), json!({}), &["x"]))
        .collect();
    store.ingest(&items).await.unwrap();
    let hot: Vec<IngestItem> = (0..20)
        .map(|i| item(&format!("h{i}"), "hot", json!({}), &["y"]))
        .collect();
    store.ingest(&hot).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let x = store.claim("x", 20, Duration::from_secs(30)).await.unwrap();
            let y = store.claim("y", 1, Duration::from_secs(30)).await.unwrap();
            (
                x.into_iter().map(|c| c.event.event.id).collect::<Vec<_>>(),
                y.into_iter().map(|c| c.event.event.id).collect::<Vec<_>>(),
            )
        }));
    }
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for t in tasks {
        let (x, y) = t.await.unwrap();
        xs.extend(x);
        ys.extend(y);
    }
    let unique: BTreeSet<&String> = xs.iter().collect();
    assert_eq!(unique.len(), xs.len(), "no delivery claimed twice: {xs:?}");
    assert_eq!(xs.len(), 60);
    assert_eq!(
        ys,
        vec!["h0".to_string()],
        "one stream of 20: exactly one claim, of the head"
    );
    db.cleanup().await;
}

/// Ids of a claim, in batch order.
async fn claim_ids(store: &Arc<dyn Store>, sink: &str) -> Vec<String> {
    store
        .claim(sink, 10, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.event.event.id)
        .collect()
}

/// Finish every delivery of a claim: the first of each stream with
/// `first`, the rest released (as the engine does behind a failure).
async fn finish_claim(store: &Arc<dyn Store>, sink: &str, first: &Finish) -> Vec<String> {
    let claimed = store
        .claim(sink, 10, Duration::from_secs(30))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    for c in &claimed {
        let f = if seen.insert(c.event.event.stream.clone()) {
            first
        } else {
            &Finish::Release
        };
        assert!(store
            .finish(c.delivery_id, &c.lease_token, f)
            .await
            .unwrap());
    }
    claimed.into_iter().map(|c| c.event.event.id).collect()
}

async fn a_blocking_dead_letter_holds_its_stream_until_replayed_or_purged(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let items: Vec<IngestItem> = ["a1", "a2", "a3"]
        .iter()
        .map(|id| item(id, "a", json!({}), &["x"]))
        .chain(
            ["c1", "c2"]
                .iter()
                .map(|id| item(id, "c", json!({}), &["x"])),
        )
        .collect();
    store.ingest(&items).await.unwrap();
    let block = Finish::Dead {
        reason: "rejected: no".into(),
        blocks_stream: true,
    };
    let move_on = Finish::Dead {
        reason: "rejected: no".into(),
        blocks_stream: false,
    };
    // a1 dies blocking its stream; c1 dies letting its stream move on.
    let claimed = store.claim("x", 10, Duration::from_secs(30)).await.unwrap();
    for c in &claimed {
        let f = match c.event.event.id.as_str() {
            "a1" => &block,
            "c1" => &move_on,
            _ => &Finish::Release,
        };
        assert!(store
            .finish(c.delivery_id, &c.lease_token, f)
            .await
            .unwrap());
    }
    assert_eq!(
        finish_claim(&store, "x", &Finish::Delivered).await,
        vec!["c2"],
        "only the moved-on stream goes on"
    );
    assert_eq!(
        store.next_due_in("x").await.unwrap(),
        None,
        "a blocked head is never due"
    );

    // A new event of the blocked stream waits too.
    store
        .ingest(&[item("a4", "a", json!({}), &["x"])])
        .await
        .unwrap();
    assert!(claim_ids(&store, "x").await.is_empty());

    // Replayed, the dead letter goes first, and the stream follows it.
    let only_a = outboxd::store::DeadFilter {
        stream: Some("a".into()),
        ..Default::default()
    };
    assert_eq!(store.replay_dead(&only_a, 100).await.unwrap(), 1);
    assert_eq!(
        finish_claim(&store, "x", &block).await,
        vec!["a1", "a2", "a3", "a4"]
    );
    assert!(claim_ids(&store, "x").await.is_empty(), "blocked again");

    // Purged, the stream moves on without it.
    assert_eq!(store.purge_dead(&only_a, 100).await.unwrap(), 1);
    assert_eq!(claim_ids(&store, "x").await, vec!["a2", "a3", "a4"]);

    // Stream b: b1 died moving on (say, before the sink chose "block"),
    // then b2 died blocking. Replaying b1 alone does not lift b2's block;
    // replaying b2 too sends b1, b2, b3 in order.
    let b: Vec<IngestItem> = ["b1", "b2", "b3"]
        .iter()
        .map(|id| item(id, "b", json!({}), &["y"]))
        .collect();
    store.ingest(&b).await.unwrap();
    assert_eq!(
        finish_claim(&store, "y", &move_on).await,
        vec!["b1", "b2", "b3"]
    );
    assert_eq!(finish_claim(&store, "y", &block).await, vec!["b2", "b3"]);
    let event = |id: &str| outboxd::store::DeadFilter {
        event_id: Some(id.into()),
        ..Default::default()
    };
    assert_eq!(store.replay_dead(&event("b1"), 100).await.unwrap(), 1);
    assert!(claim_ids(&store, "y").await.is_empty(), "b2 still blocks");
    assert_eq!(store.replay_dead(&event("b2"), 100).await.unwrap(), 1);
    assert_eq!(claim_ids(&store, "y").await, vec!["b1", "b2", "b3"]);
    db.cleanup().await;
}

/// Found by the model (model/README.md, `NO_BLOCK_HEAD_CHECK`): a worker
/// whose lease on a batch ran out finishes the follower of a head that
/// another worker took over and dead-lettered, blocking. The follower must
/// not take the blocked head (a replay of it alone would then let the
/// stream pass the first dead letter): it is released and waits.
async fn a_stale_follower_never_blocks_ahead_of_an_earlier_dead_letter(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let items: Vec<IngestItem> = ["e1", "e2"]
        .iter()
        .map(|id| item(id, "a", json!({}), &["x"]))
        .collect();
    store.ingest(&items).await.unwrap();
    let block = Finish::Dead {
        reason: "rejected: no".into(),
        blocks_stream: true,
    };
    let old = store
        .claim("x", 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(old.len(), 2, "head and its run");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The takeover claims only the head.
    let new = store.claim("x", 1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].event.event.id, "e1");
    assert!(store
        .finish(new[0].delivery_id, &new[0].lease_token, &block)
        .await
        .unwrap());
    // The stale worker's outcomes: e1 fenced off, e2 still under its token.
    let stale: Vec<(i64, &str, &Finish)> = old
        .iter()
        .map(|c| (c.delivery_id, c.lease_token.as_str(), &block))
        .collect();
    assert_eq!(store.finish_many(&stale).await.unwrap(), vec![false, true]);
    let (_, d) = store.event("e2").await.unwrap().unwrap();
    assert_ne!(d[0].status, "dead", "e2 waits behind e1, it does not block");
    assert_eq!(d[0].attempts, 0, "the release does not charge the attempt");
    let event = |id: &str| outboxd::store::DeadFilter {
        event_id: Some(id.into()),
        ..Default::default()
    };
    assert_eq!(store.replay_dead(&event("e2"), 100).await.unwrap(), 0);
    assert!(claim_ids(&store, "x").await.is_empty(), "e1 still blocks");
    assert_eq!(store.replay_dead(&event("e1"), 100).await.unwrap(), 1);
    assert_eq!(claim_ids(&store, "x").await, vec!["e1", "e2"]);
    db.cleanup().await;
}

use common::both_stores;

/// A search by state finds exactly the events with a delivery the read of
/// an event shows in that state: the search's condition on plain columns
/// (`plan::state_sql`) and the row-state CASE (`plan::row_state_sql`)
/// agree on rows in every state — never tried, leased, lease run out,
/// waiting to retry, delivered, dead — and an event counts once for each
/// state any of its deliveries is in.
async fn a_state_search_finds_exactly_the_events_shown_in_that_state(backend: Backend) {
    use outboxd::store::{DeliveryStatus, EventFilter};
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // One sink per state, so each claim takes exactly its own event; `both`
    // has one delivery delivered and one never tried.
    let events = [
        ("pending", "sp", vec!["sp"]),
        ("leased", "sl", vec!["sl"]),
        ("expired", "sx", vec!["sx"]),
        ("retrying", "sr", vec!["sr"]),
        ("delivered", "sd", vec!["sd"]),
        ("dead", "sk", vec!["sk"]),
        ("both", "sb", vec!["sb", "sp"]),
    ];
    for (id, stream, sinks) in &events {
        store
            .ingest(&[item(id, stream, json!({}), sinks)])
            .await
            .unwrap();
    }
    let claim = |sink: &'static str, lease: Duration| {
        let store = store.clone();
        async move {
            let mut c = store.claim(sink, 10, lease).await.unwrap();
            assert_eq!(c.len(), 1, "{sink}");
            c.remove(0)
        }
    };
    let hour = Duration::from_secs(3600);
    claim("sl", hour).await;
    claim("sx", Duration::from_millis(200)).await;
    for (sink, outcome) in [
        (
            "sr",
            Finish::Retry {
                delay: hour,
                reason: "HTTP 503".into(),
            },
        ),
        ("sd", Finish::Delivered),
        ("sb", Finish::Delivered),
        (
            "sk",
            Finish::Dead {
                reason: "HTTP 400".into(),
                blocks_stream: false,
            },
        ),
    ] {
        let c = claim(sink, hour).await;
        assert!(store
            .finish(c.delivery_id, &c.lease_token, &outcome)
            .await
            .unwrap());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;

    let states = [
        DeliveryStatus::Pending,
        DeliveryStatus::Leased,
        DeliveryStatus::Retrying,
        DeliveryStatus::Delivered,
        DeliveryStatus::Dead,
    ];
    for state in states {
        let mut shown = BTreeSet::new();
        for (id, _, _) in &events {
            let (_, d) = store.event(id).await.unwrap().unwrap();
            if d.iter().any(|d| d.status == state) {
                shown.insert(id.to_string());
            }
        }
        let filter = EventFilter {
            state: Some(state),
            ..EventFilter::default()
        };
        let found: BTreeSet<String> = store
            .search_events(&filter, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(found, shown, "state {state}");
        let expected: &[&str] = match state {
            DeliveryStatus::Pending => &["both", "pending"],
            DeliveryStatus::Leased => &["leased"],
            DeliveryStatus::Retrying => &["expired", "retrying"],
            DeliveryStatus::Delivered => &["both", "delivered"],
            DeliveryStatus::Dead => &["dead"],
        };
        let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
        assert_eq!(shown, expected, "the rows are in the states meant");
    }
    db.cleanup().await;
}

both_stores!(
    event_and_deliveries_commit_together,
    same_id_same_content_is_a_duplicate_different_content_a_conflict,
    a_b_a_is_three_events,
    a_request_of_1200_events_is_stored_whole_in_order,
    the_same_id_twice_in_one_request_is_a_duplicate_or_a_conflict,
    sixteen_concurrent_writers_get_gapless_sequences,
    producer_sequence_is_kept_and_must_not_go_backwards,
    claims_take_heads_and_runs_never_a_successor_first,
    an_expired_lease_is_reclaimed_and_the_stale_holder_is_fenced_off,
    a_retry_waits_its_delay,
    four_workers_never_claim_the_same_delivery,
    a_blocking_dead_letter_holds_its_stream_until_replayed_or_purged,
    a_stale_follower_never_blocks_ahead_of_an_earlier_dead_letter,
    a_state_search_finds_exactly_the_events_shown_in_that_state,
);

/// An application's own transaction enqueues with `outboxd.enqueue`: a
/// rollback leaves no event; a commit leaves one, which the router then
/// gives its deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_in_transaction_enqueue_commits_and_rolls_back_with_the_application() {
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let mut app = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE orders (id int PRIMARY KEY, state text)")
        .execute(&mut app)
        .await
        .unwrap();

    let mut tx = app.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (1, 'paid')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let seq: i64 = sqlx::query_scalar(
        "SELECT outboxd.enqueue('o1', 'shop', 'order.paid', 'orders/1', '{\"id\": 1}'::jsonb)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(seq, 1);
    tx.rollback().await.unwrap();
    assert!(
        store.event("o1").await.unwrap().is_none(),
        "rolled back with the application"
    );

    let mut tx = app.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (1, 'paid')")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "SELECT outboxd.enqueue('o1', 'shop', 'order.paid', 'orders/1', '{\"id\": 1}'::jsonb)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // Same id, same content: idempotent. Different content: refused.
    let again: i64 = sqlx::query_scalar(
        "SELECT outboxd.enqueue('o1', 'shop', 'order.paid', 'orders/1', '{\"id\": 1}'::jsonb)",
    )
    .fetch_one(&mut app)
    .await
    .unwrap();
    assert_eq!(again, 1);
    let conflict = sqlx::query(
        "SELECT outboxd.enqueue('o1', 'shop', 'order.paid', 'orders/1', '{\"id\": 2}'::jsonb)",
    )
    .execute(&mut app)
    .await;
    assert!(conflict.is_err());

    let (stored, d) = store.event("o1").await.unwrap().unwrap();
    assert_eq!(stored.sequence, 1);
    assert!(d.is_empty(), "not routed yet");
    let routed = store
        .route_pending(&|_: &outboxd::event::NewEvent| vec!["x".to_string()], 100)
        .await
        .unwrap();
    assert_eq!(routed, 1);
    let (_, d) = store.event("o1").await.unwrap().unwrap();
    assert_eq!(d.len(), 1);
    let c = store.claim("x", 10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(c[0].event.event.data, br#"{"id": 1}"#);
    // An HTTP ingest of the same event is a duplicate, not a conflict.
    let same = r#"{"specversion":"1.0","id":"o1","source":"shop","type":"order.paid","partitionkey":"orders/1","datacontenttype":"application/json","data":{"id":1}}"#;
    let r = store.ingest(&[raw_item(same, &["x"])]).await.unwrap();
    assert!(r[0].duplicate);
    db.cleanup().await;
}

/// The router gives a whole page its deliveries at once: each sink its
/// events in stream order, each event marked routed with its content hash,
/// an event no route takes included. Six events over three streams, routed
/// by stream (`a` to sinks x and y, `b` to x) and type (`none` nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_router_routes_a_page_of_several_streams_and_sinks() {
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let mut app = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let enqueued = [
        ("a1", "a", "t"),
        ("b1", "b", "t"),
        ("a2", "a", "t"),
        ("n1", "n", "none"),
        ("b2", "b", "t"),
        ("a3", "a", "t"),
    ];
    for (id, stream, ty) in enqueued {
        sqlx::query("SELECT outboxd.enqueue($1, 'shop', $2, $3, $4::jsonb)")
            .bind(id)
            .bind(ty)
            .bind(stream)
            .bind(format!("{{\"id\": \"{id}\"}}"))
            .execute(&mut app)
            .await
            .unwrap();
    }
    let route = |e: &outboxd::event::NewEvent| -> Vec<String> {
        match (e.ty.as_str(), e.stream.as_str()) {
            ("none", _) => vec![],
            (_, "a") => vec!["x".into(), "y".into()],
            _ => vec!["x".into()],
        }
    };
    assert_eq!(store.route_pending(&route, 100).await.unwrap(), 6);
    assert_eq!(
        store.route_pending(&route, 100).await.unwrap(),
        0,
        "every event of the page is marked routed, n1 too"
    );
    let (_, none) = store.event("n1").await.unwrap().unwrap();
    assert!(none.is_empty(), "{none:?}");
    for (sink, want) in [
        (
            "x",
            vec![("a", vec!["a1", "a2", "a3"]), ("b", vec!["b1", "b2"])],
        ),
        ("y", vec![("a", vec!["a1", "a2", "a3"])]),
    ] {
        let claimed = store
            .claim(sink, 10, Duration::from_secs(30))
            .await
            .unwrap();
        for (stream, ids) in want {
            let got: Vec<&str> = claimed
                .iter()
                .filter(|c| c.event.event.stream == stream)
                .map(|c| c.event.event.id.as_str())
                .collect();
            assert_eq!(got, ids, "sink {sink}, stream {stream}");
        }
        assert_eq!(
            claimed.len(),
            if sink == "x" { 5 } else { 3 },
            "sink {sink}: {:?}",
            claimed
                .iter()
                .map(|c| &c.event.event.id)
                .collect::<Vec<_>>()
        );
    }
    // Each event's content hash was stored with the page (enqueue leaves it
    // NULL), and an HTTP ingest of the same event is a duplicate, with other
    // data a conflict.
    let unhashed: Vec<String> =
        sqlx::query_scalar("SELECT id FROM outboxd.events WHERE content_hash IS NULL ORDER BY id")
            .fetch_all(&mut app)
            .await
            .unwrap();
    assert!(
        unhashed.is_empty(),
        "routed without a content hash: {unhashed:?}"
    );
    let same = r#"{"specversion":"1.0","id":"b2","source":"shop","type":"t","partitionkey":"b","datacontenttype":"application/json","data":{"id":"b2"}}"#;
    assert!(store.ingest(&[raw_item(same, &["x"])]).await.unwrap()[0].duplicate);
    let other = same.replace(r#"{"id":"b2"}"#, r#"{"id":"other"}"#);
    assert!(matches!(
        store.ingest(&[raw_item(&other, &["x"])]).await,
        Err(IngestError::Conflict { .. })
    ));
    db.cleanup().await;
}

/// One router at a time: while another session (another replica's
/// router) holds the router's advisory lock, a router routes nothing, so
/// two replicas never commit pages of one stream out of order; once the
/// lock is free it routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_router_routes_at_a_time() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let held = HeldLocks::take(
        &db.url,
        &format!(
            "SELECT pg_advisory_xact_lock({})",
            outboxd::store::postgres::ROUTER_LOCK
        ),
    )
    .await;
    let mut app = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&db.url).await.unwrap()
    };
    sqlx::query("SELECT outboxd.enqueue('r1', 'shop', 't', 'r', '{}'::jsonb)")
        .execute(&mut app)
        .await
        .unwrap();
    let route = |_: &outboxd::event::NewEvent| vec!["x".to_string()];
    assert_eq!(store.route_pending(&route, 100).await.unwrap(), 0);
    let (_, d) = store.event("r1").await.unwrap().unwrap();
    assert!(d.is_empty(), "routed while another router held the lock");
    held.release().await;
    assert_eq!(store.route_pending(&route, 100).await.unwrap(), 1);
    let (_, d) = store.event("r1").await.unwrap().unwrap();
    assert_eq!(d.len(), 1);
    db.cleanup().await;
}

/// The claim's plan touches indexes only: no sequential scan over the
/// deliveries or the heads, with a backlog of 50,000 (90% in one stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claim_plan_has_no_sequential_scan() {
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    let _store = db.store().await;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in [
        "INSERT INTO outboxd.events (id, source, type, stream, sequence, data, data_format) \
         SELECT 'e' || g, 's', 't', CASE WHEN g % 10 = 0 THEN 's' || g ELSE 'hot' END, g, '\\x7b7d'::bytea, 'json' \
         FROM generate_series(1, 50000) g",
        "INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence, status) \
         SELECT id, 'x', stream, sequence, CASE WHEN sequence < 20000 THEN 'delivered' ELSE 'pending' END FROM outboxd.events",
        "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) SELECT DISTINCT ON (stream) sink, stream, id, now() \
         FROM outboxd.deliveries WHERE status = 'pending' ORDER BY stream, sequence",
        "ANALYZE outboxd.deliveries",
        "ANALYZE outboxd.heads",
    ] {
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
    let plans = [
        (
            "claim heads",
            format!("EXPLAIN {}", outboxd::store::postgres::CLAIM_HEADS_SQL),
        ),
        (
            "claim runs",
            format!("EXPLAIN {}", outboxd::store::postgres::CLAIM_RUNS_SQL),
        ),
        (
            "move heads",
            format!("EXPLAIN {}", outboxd::store::postgres::MOVE_HEADS_SQL),
        ),
        (
            "lock finishing heads",
            format!(
                "EXPLAIN {}",
                outboxd::store::postgres::LOCK_FINISHING_HEADS_SQL
            ),
        ),
    ];
    let head_ids: Vec<i64> = sqlx::query_scalar("SELECT delivery_id FROM outboxd.heads LIMIT 100")
        .fetch_all(&mut c)
        .await
        .unwrap();
    for (what, sql) in plans {
        let q = sqlx::query_scalar::<_, String>(&sql);
        let q = match what {
            "claim heads" => q.bind("x").bind(100i64),
            "claim runs" => q.bind("x").bind(&head_ids).bind(100i64),
            "lock finishing heads" => q.bind(&head_ids),
            _ => q
                .bind(&head_ids)
                .bind(vec!["x".to_string(); head_ids.len()])
                .bind(vec!["hot".to_string(); head_ids.len()]),
        };
        let plan = q.fetch_all(&mut c).await.unwrap().join("\n");
        // Moving (and first locking) a batch's heads joins its (up to
        // max-batch) finished deliveries with the heads table, one row per
        // live (sink, stream): at a few thousand heads hashing them all is
        // cheaper than probing the primary key, and the planner says so;
        // the deliveries must be reached by index whatever the size.
        let forbidden = if what == "move heads" || what == "lock finishing heads" {
            "Seq Scan on deliveries"
        } else {
            "Seq Scan"
        };
        assert!(
            !plan.contains(forbidden),
            "{what} plan has a sequential scan:\n{plan}"
        );
    }
    db.cleanup().await;
}

/// Sequential scans of the events and of the deliveries, index scans of
/// `events_ingested_seq` and of `deliveries_dead`, as the statistics
/// collector last heard of them.
async fn search_counters(c: &mut sqlx::PgConnection) -> (i64, i64, i64, i64) {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *c)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT (SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'outboxd.events'::regclass), \
           (SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'outboxd.deliveries'::regclass), \
           (SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = 'outboxd.events_ingested_seq'::regclass), \
           (SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = 'outboxd.deliveries_dead'::regclass)",
    )
    .fetch_one(&mut *c)
    .await
    .unwrap()
}

/// The event search reads by index where a scan would cost the whole
/// table: 20,000 events stored in one statement (one `ingested_at`, so
/// only `seq_id` orders them), 20 of their deliveries dead and 20 waiting
/// to retry. Newest first with no filter walks `events_ingested_seq`
/// backwards; the dead ones are read through `deliveries_dead`, the
/// retrying ones through `deliveries_tried`. No search scans the events or
/// the deliveries (the table statistics' counters say which were read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_event_search_reads_by_index() {
    use outboxd::store::{DeliveryStatus, EventFilter};
    use sqlx::Connection;
    let db = TestDb::new(Backend::Postgres).await;
    drop(db.store().await);
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in [
        "INSERT INTO outboxd.events (id, source, type, stream, sequence, data, data_format) \
         SELECT 'e' || g, 's', 't', 's' || (g % 100), g, '\\x7b7d'::bytea, 'json' \
         FROM generate_series(1, 20000) g",
        "INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence, status, finished_at, attempts) \
         SELECT id, 'x', stream, sequence, CASE WHEN sequence % 1000 = 0 THEN 'dead' ELSE 'pending' END, \
           CASE WHEN sequence % 1000 = 0 THEN now() END, \
           CASE WHEN sequence % 1000 = 500 THEN 1 ELSE 0 END FROM outboxd.events",
        "ANALYZE outboxd.events",
        "ANALYZE outboxd.deliveries",
        // The migrations' index builds and the fill's own scans are counted
        // before the searches are: a backend reports its counters when it
        // exits, this one at its next idle moment.
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
        "SELECT pg_stat_force_next_flush()",
    ] {
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
    let started = std::time::Instant::now();
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{others} backends stay"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = search_counters(&mut c).await;
    let store = outboxd::store::open(&db.url).await.unwrap();

    let newest = store
        .search_events(&EventFilter::default(), 50)
        .await
        .unwrap();
    assert_eq!(newest.len(), 50);
    assert_eq!(newest[0].id, "e20000", "newest first by row");
    assert_eq!(newest[49].id, "e19951");
    let dead = EventFilter {
        state: Some(DeliveryStatus::Dead),
        ..EventFilter::default()
    };
    let dead = store.search_events(&dead, 50).await.unwrap();
    assert_eq!(dead.len(), 20);
    assert_eq!(dead[0].id, "e20000");
    let retrying = EventFilter {
        state: Some(DeliveryStatus::Retrying),
        ..EventFilter::default()
    };
    let retrying = store.search_events(&retrying, 50).await.unwrap();
    assert_eq!(retrying.len(), 20, "read through deliveries_tried");
    assert_eq!(retrying[0].id, "e19500");
    assert_eq!(retrying[19].id, "e500");

    // A backend reports its counters within about ten seconds of going idle.
    let started = std::time::Instant::now();
    let after = loop {
        let now = search_counters(&mut c).await;
        if now.2 > before.2 && now.3 > before.3 {
            break now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the searches did not read events_ingested_seq and deliveries_dead: \
             before {before:?}, now {now:?} (seq scans of events, of deliveries; \
             index scans of events_ingested_seq, of deliveries_dead)"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(after.0, before.0, "a search scanned the events");
    assert_eq!(after.1, before.1, "a search scanned the deliveries");
    db.cleanup().await;
}

/// An ingest adding a stream's next delivery while a finish moves that
/// stream's head, 400 times at once: every new delivery ends behind a head
/// and is claimable. Without the head locks of finish and ingest (finish
/// step 1, the head insert's `DO UPDATE … WHERE false`) the finish drops a
/// head whose stream just got a delivery it could not see yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_ingest_racing_a_finish_never_leaves_a_delivery_without_a_head() {
    const STREAMS: usize = 400;
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let first: Vec<IngestItem> = (0..STREAMS)
        .map(|i| item(&format!("a{i}"), &format!("s{i}"), json!({}), &["x"]))
        .collect();
    store.ingest(&first).await.unwrap();
    let claimed = store
        .claim("x", STREAMS as u32, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), STREAMS);
    // Finish the heads in batches of 5 while each stream gets its second
    // event, one ingest per stream, 16 at a time.
    let finishes = {
        let store = store.clone();
        tokio::spawn(async move {
            for chunk in claimed.chunks(5) {
                let items: Vec<(i64, &str, &Finish)> = chunk
                    .iter()
                    .map(|c| (c.delivery_id, c.lease_token.as_str(), &Finish::Delivered))
                    .collect();
                let kept = store.finish_many(&items).await.unwrap();
                assert!(kept.iter().all(|k| *k));
            }
        })
    };
    let mut ingests = Vec::new();
    for lane in 0..16 {
        let store = store.clone();
        ingests.push(tokio::spawn(async move {
            for i in (lane..STREAMS).step_by(16) {
                let e = item(&format!("b{i}"), &format!("s{i}"), json!({}), &["x"]);
                store.ingest(&[e]).await.unwrap();
            }
        }));
    }
    finishes.await.unwrap();
    for t in ingests {
        t.await.unwrap();
    }
    let mut got = BTreeSet::new();
    loop {
        let c = store
            .claim("x", STREAMS as u32, Duration::from_secs(30))
            .await
            .unwrap();
        if c.is_empty() {
            break;
        }
        got.extend(c.into_iter().map(|c| c.event.event.id));
    }
    let want: BTreeSet<String> = (0..STREAMS).map(|i| format!("b{i}")).collect();
    let stranded: Vec<&String> = want.difference(&got).collect();
    assert!(
        stranded.is_empty(),
        "{} second events left without a head: {:?}",
        stranded.len(),
        &stranded[..stranded.len().min(10)]
    );
    db.cleanup().await;
}

/// A finish never waits on its stream's row: with another session holding
/// that row locked (as an ingest of the stream does), a delivery of the
/// stream is still finished, and its head moves on. Fifty destinations
/// finishing on one stream therefore queue neither behind each other nor
/// an ingest behind all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_finish_does_not_wait_for_its_streams_row() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    store
        .ingest(&[
            item("e1", "s", json!({}), &["x", "y"]),
            item("e2", "s", json!({}), &["x", "y"]),
        ])
        .await
        .unwrap();
    let c = store.claim("x", 1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(c.len(), 1);
    let held = HeldLocks::take(
        &db.url,
        "SELECT 1 FROM outboxd.streams WHERE stream = 's' FOR UPDATE",
    )
    .await;
    let finished = tokio::time::timeout(
        Duration::from_secs(5),
        store.finish(c[0].delivery_id, &c[0].lease_token, &Finish::Delivered),
    )
    .await
    .expect("the finish waited on the stream's row, held by another session");
    assert!(finished.unwrap());
    assert_eq!(claim_ids(&store, "x").await, vec!["e2".to_string()]);
    held.release().await;
    db.cleanup().await;
}

/// However many delivery calls wait on the database, an ingest finds a
/// connection: with 20 finishes (more than the pool's 16 connections)
/// blocked on heads another session holds locked, an ingest of another
/// stream is stored at once. Without the delivery loops' cap
/// (`limits::PG_DELIVERY_CONNECTIONS`) the finishes hold every connection
/// and the ingest waits for the pool until it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_ingest_never_waits_behind_the_delivery_loops() {
    use outboxd::limits::PG_DELIVERY_CONNECTIONS;
    use sqlx::Connection;
    const SINKS: usize = 20;
    let db = TestDb::new(Backend::Postgres).await;
    // Statements may wait a minute: the finishes stay blocked for as long
    // as the test holds the heads.
    let store: Arc<dyn Store> = Arc::new(
        outboxd::store::postgres::PgStore::open(&db.url, Duration::from_secs(60))
            .await
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let sinks: Vec<String> = (0..SINKS).map(|i| format!("d{i}")).collect();
    let names: Vec<&str> = sinks.iter().map(String::as_str).collect();
    store
        .ingest(&[item("e1", "s", json!({}), &names)])
        .await
        .unwrap();
    let mut claims = Vec::new();
    for sink in &sinks {
        let mut c = store.claim(sink, 1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(c.len(), 1, "{sink}");
        claims.push(c.remove(0));
    }
    let held = HeldLocks::take(
        &db.url,
        "SELECT 1 FROM outboxd.heads WHERE stream = 's' FOR UPDATE",
    )
    .await;
    let finishes: Vec<_> = claims
        .into_iter()
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .finish(c.delivery_id, &c.lease_token, &Finish::Delivered)
                    .await
            })
        })
        .collect();
    // Every finish that got a connection is now waiting on a head.
    let mut watch = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watch)
        .await
        .unwrap();
        if waiting as usize >= PG_DELIVERY_CONNECTIONS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "only {waiting} finishes reached the locked heads"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ingested = tokio::time::timeout(
        Duration::from_secs(5),
        store.ingest(&[item("e2", "t", json!({}), &["d0"])]),
    )
    .await
    .expect("the ingest waited behind the blocked finishes for a connection");
    assert_eq!(ingested.unwrap().len(), 1);
    held.release().await;
    for f in finishes {
        assert!(f.await.unwrap().unwrap(), "every finish kept its lease");
    }
    assert_eq!(claim_ids(&store, "d0").await, vec!["e2".to_string()]);
    db.cleanup().await;
}
