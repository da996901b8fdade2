//! The Neo4j outbox relay against a real Neo4j 5.26 (embedded, started by
//! `tests/common/neo4j.rs`) and a real outboxd store.
//!
//! The claim scenarios race two or more relays: one holds its claim
//! transaction open while another claims the same shortlist. With the
//! lock-first write, the second relay waits on the node locks and then
//! re-reads the nodes as taken; without it, the second relay's filter reads
//! the committed (still pending) nodes, waits on the locks, and then
//! overwrites the first claim — a duplicate, which these tests catch.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::neo4j::{unique_label, Neo4jServer};
use common::{Backend, TestDb};
use neo4rs::query;
use outboxd::sources::neo4j::{ClaimedNode, Neo4jSourceConfig, Outbox};

/// How long a racing relay holds its claim open before committing, so the
/// other relay's claim surely runs meanwhile.
const HOLD: Duration = Duration::from_millis(700);

fn config(label: &str) -> Neo4jSourceConfig {
    Neo4jSourceConfig {
        url: Neo4jServer::shared().uri.clone(),
        label: label.to_string(),
        batch_size: 100,
        page_size: 50,
        poll_interval: Duration::from_millis(100),
        // The tests share one embedded server and run beside each other on
        // a loaded machine: a query there once waited past the default 10 s
        // (the driver's `ConnectionTimedOut`), failing a test that asserts
        // nothing about time. 30 s still fails a query that hangs.
        timeout: Duration::from_secs(30),
        ..Neo4jSourceConfig::default()
    }
}

/// A relay's outbox on `config`'s label, its indexes online. The tests
/// share one Neo4j and each creates indexes for its own label, so under a
/// loaded machine waiting for them can pass the query timeout: the wait is
/// tried up to three times before the test fails.
async fn outbox(config: &Neo4jSourceConfig) -> Outbox {
    let outbox = Outbox::connect(config, "").unwrap();
    let mut tries = 0;
    while let Err(e) = outbox.ensure_indexes().await {
        tries += 1;
        assert!(tries < 3, "indexes of {}: {e}", config.label);
    }
    outbox
}

/// Create pending outbox nodes `(stream, version)` with id `stream-version`.
async fn add_nodes(graph: &neo4rs::Graph, label: &str, nodes: &[(&str, i64)]) {
    let streams: Vec<String> = nodes.iter().map(|(s, _)| s.to_string()).collect();
    let versions: Vec<i64> = nodes.iter().map(|(_, v)| *v).collect();
    graph
        .run(
            query(&format!(
                "UNWIND range(0, size($streams) - 1) AS i \
                 CREATE (:`{label}` {{eventId: $streams[i] + '-' + toString($versions[i]), \
                   packetId: $streams[i], streamVersion: $versions[i], status: 'pending', attempts: 0, \
                   nextAttemptAt: datetime(), createdAt: datetime(), eventType: 'com.example.changed', \
                   payload: '{{\"n\": ' + toString($versions[i]) + '}}'}})"
            ))
            .param("streams", streams)
            .param("versions", versions),
        )
        .await
        .unwrap();
}

/// Set properties of node `id` from a Cypher map expression, e.g.
/// `{status: 'inflight', leaseExpiresAt: datetime() - duration('PT1M')}`.
async fn set_node(graph: &neo4rs::Graph, label: &str, id: &str, map: &str) {
    graph
        .run(
            query(&format!(
                "MATCH (n:`{label}` {{eventId: $id}}) SET n += {map}"
            ))
            .param("id", id),
        )
        .await
        .unwrap();
}

/// (status, leaseToken, lastError) of node `id`.
async fn node_state(
    graph: &neo4rs::Graph,
    label: &str,
    id: &str,
) -> (String, Option<String>, Option<String>) {
    let mut rows = graph
        .execute(
            query(&format!(
                "MATCH (n:`{label}` {{eventId: $id}}) RETURN n.status AS s, n.leaseToken AS t, n.lastError AS e"
            ))
            .param("id", id),
        )
        .await
        .unwrap();
    let row = rows.next().await.unwrap().expect("the node exists");
    (
        row.get("s").unwrap(),
        row.get("t").unwrap(),
        row.get("e").unwrap(),
    )
}

fn ids(nodes: &[ClaimedNode]) -> Vec<String> {
    let mut v: Vec<String> = nodes.iter().map(|n| n.event_id.clone()).collect();
    v.sort();
    v
}

/// Two relays shortlist the same nodes; `first` claims and holds its
/// transaction open for [`HOLD`] while `second` claims its shortlist; then
/// both commit. Returns what each claimed.
async fn race_two(
    first: &Arc<Outbox>,
    second: &Arc<Outbox>,
    limit: usize,
) -> (Vec<ClaimedNode>, Vec<ClaimedNode>) {
    let a_ids = first.shortlist(limit).await.unwrap();
    let b_ids = second.shortlist(limit).await.unwrap();
    let open = first.claim_open(&a_ids).await.unwrap();
    let second = second.clone();
    let racer = tokio::spawn(async move {
        if b_ids.is_empty() {
            return Vec::new();
        }
        second
            .claim_open(&b_ids)
            .await
            .unwrap()
            .commit()
            .await
            .unwrap()
    });
    tokio::time::sleep(HOLD).await;
    let a = open.commit().await.unwrap();
    let b = racer.await.unwrap();
    (a, b)
}

fn assert_disjoint(claims: &[Vec<ClaimedNode>]) -> Vec<String> {
    let mut all = Vec::new();
    let mut seen = HashSet::new();
    for c in claims {
        for n in c {
            assert!(
                seen.insert(n.event_id.clone()),
                "node {} was claimed twice: {:?}",
                n.event_id,
                claims.iter().map(|c| ids(c)).collect::<Vec<_>>()
            );
            all.push(n.event_id.clone());
        }
    }
    all.sort();
    all
}

#[tokio::test]
async fn harness_neo4j_speaks_bolt_and_explains() {
    let server = Neo4jServer::shared();
    let graph = server.graph();
    let mut rows = graph.execute(query("RETURN 40 + 2 AS n")).await.unwrap();
    let n: i64 = rows.next().await.unwrap().unwrap().get("n").unwrap();
    assert_eq!(n, 42);
    let plan = server.explain("MATCH (n:NoSuchLabel) RETURN n");
    assert!(
        plan.iter().any(|op| op.contains("NodeByLabelScan")),
        "{plan:?}"
    );
    assert!(server.is_running());
}

#[tokio::test]
async fn claim_takes_stream_heads_a1_and_b1_once_under_a_racing_relay() {
    let label = unique_label();
    let c = config(&label);
    let (r1, r2) = (Arc::new(outbox(&c).await), Arc::new(outbox(&c).await));
    add_nodes(
        r1.graph(),
        &label,
        &[("A", 1), ("A", 2), ("A", 3), ("B", 1)],
    )
    .await;
    let (a, b) = race_two(&r1, &r2, 10).await;
    assert_eq!(ids(&a), vec!["A-1", "B-1"]);
    assert_eq!(assert_disjoint(&[a, b.clone()]), vec!["A-1", "B-1"]);
    assert!(b.is_empty(), "the racing relay claimed {:?}", ids(&b));
    // While A1 is in flight, A2 is not a head: nothing more to claim.
    assert!(r2.claim(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn claim_reclaims_an_expired_lease_and_keeps_a_live_one() {
    let label = unique_label();
    let c = config(&label);
    let (r1, r2) = (Arc::new(outbox(&c).await), Arc::new(outbox(&c).await));
    add_nodes(r1.graph(), &label, &[("A", 1), ("B", 1)]).await;
    set_node(
        r1.graph(),
        &label,
        "A-1",
        "{status: 'inflight', leaseToken: 'old', leaseExpiresAt: datetime() - duration('PT1M')}",
    )
    .await;
    set_node(
        r1.graph(),
        &label,
        "B-1",
        "{status: 'inflight', leaseToken: 'live', leaseExpiresAt: datetime() + duration('PT1H')}",
    )
    .await;
    let (a, b) = race_two(&r1, &r2, 10).await;
    assert_eq!(assert_disjoint(&[a.clone(), b]), vec!["A-1"]);
    assert_eq!(ids(&a), vec!["A-1"]);
    let (status, token, _) = node_state(r1.graph(), &label, "A-1").await;
    assert_eq!(
        (status.as_str(), token.as_deref()),
        ("inflight", Some(a[0].lease_token.as_str()))
    );
    let (_, token, _) = node_state(r1.graph(), &label, "B-1").await;
    assert_eq!(token.as_deref(), Some("live"));
}

#[tokio::test]
async fn claim_with_a1_in_flight_blocks_a2_to_a5_and_takes_b1() {
    let label = unique_label();
    let c = config(&label);
    let (r1, r2) = (Arc::new(outbox(&c).await), Arc::new(outbox(&c).await));
    add_nodes(
        r1.graph(),
        &label,
        &[("A", 1), ("A", 2), ("A", 3), ("A", 4), ("A", 5), ("B", 1)],
    )
    .await;
    set_node(
        r1.graph(),
        &label,
        "A-1",
        "{status: 'inflight', leaseToken: 'live', leaseExpiresAt: datetime() + duration('PT1H')}",
    )
    .await;
    let (a, b) = race_two(&r1, &r2, 10).await;
    assert_eq!(assert_disjoint(&[a, b]), vec!["B-1"]);
    assert!(r1.claim(10).await.unwrap().is_empty());
    for v in 2..=5 {
        assert_eq!(
            node_state(r1.graph(), &label, &format!("A-{v}")).await.0,
            "pending"
        );
    }
}

#[tokio::test]
async fn claim_pages_through_forty_one_event_streams_five_at_a_time() {
    let label = unique_label();
    let mut c = config(&label);
    c.page_size = 5;
    let (r1, r2) = (Arc::new(outbox(&c).await), Arc::new(outbox(&c).await));
    let names: Vec<String> = (0..40).map(|i| format!("S{i:02}")).collect();
    let nodes: Vec<(&str, i64)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    add_nodes(r1.graph(), &label, &nodes).await;
    let (a, b) = race_two(&r1, &r2, 40).await;
    let all = assert_disjoint(&[a, b]);
    assert_eq!(all.len(), 40);
    let expected: Vec<String> = names.iter().map(|s| format!("{s}-1")).collect();
    assert_eq!(all, expected);
}

/// The streams a relay just finished get their next heads first
/// (`Outbox::note_finished`), but a quarter of every claim stays with the
/// lanes (all of a claim of 1), so the other streams are reached while the
/// finished ones still have a backlog: four hot streams of 40 versions,
/// four cold streams of one, claims of 4, then claims of 1. Every cold node
/// is claimed within 8 claims while each hot stream still has versions
/// pending, and each stream's versions come in order. Were the finished
/// streams' heads given every place, the hot streams would keep them all
/// until they ran dry.
#[tokio::test]
async fn finished_streams_go_first_yet_every_other_stream_is_reached() {
    for limit in [4, 1] {
        finished_streams_scenario(limit).await;
    }
}

async fn finished_streams_scenario(limit: usize) {
    let label = unique_label();
    let r = outbox(&config(&label)).await;
    let (hot, cold) = (["A1", "A2", "A3", "A4"], ["Z1", "Z2", "Z3", "Z4"]);
    let mut nodes: Vec<(&str, i64)> = Vec::new();
    for s in hot {
        nodes.extend((1..=40).map(|v| (s, v)));
    }
    nodes.extend(cold.iter().map(|s| (*s, 1)));
    add_nodes(r.graph(), &label, &nodes).await;
    let mut claimed: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for _ in 0..8 {
        let batch = r.claim(limit).await.unwrap();
        assert!(
            !batch.is_empty(),
            "claims of {limit}: one came back empty: {claimed:?}"
        );
        let token = batch[0].lease_token.clone();
        let ids: Vec<String> = batch.iter().map(|n| n.event_id.clone()).collect();
        let n = ids.len() as u64;
        assert_eq!(r.finish_delivered(&token, ids).await.unwrap(), n);
        for n in &batch {
            let stream = n.stream.clone().unwrap();
            claimed.entry(stream).or_default().push(n.version.unwrap());
        }
        r.note_finished(batch.iter().filter_map(|n| n.stream.clone()));
    }
    for s in cold {
        assert_eq!(
            claimed.get(s),
            Some(&vec![1]),
            "claims of {limit}, cold stream {s}: {claimed:?}"
        );
    }
    for s in hot {
        let versions = &claimed[s];
        let n = versions.len() as i64;
        assert!(n < 40, "hot stream {s} is not drained yet: {claimed:?}");
        assert_eq!(
            *versions,
            (1..=n).collect::<Vec<_>>(),
            "stream {s} in order"
        );
    }
}

/// A relay that has finished nothing yet, on a backlog deep in every
/// stream (12 streams of 30 versions, pages of 10): its lane pages hold
/// about one head each, so the walk over the streams fills the claim. Two
/// claims of 12, each finished before the next: the first takes every
/// stream's version 1, the second every version 2 (the walk goes on from
/// its cursor and round from the first stream). Without the walk the first
/// claim holds one head: the lane's first page (S00-1, S00-10 … S00-18)
/// is mostly nodes behind their head, so the lane stops there.
#[tokio::test]
async fn a_cold_relay_on_a_deep_backlog_claims_a_head_of_every_stream() {
    let label = unique_label();
    let mut c = config(&label);
    c.page_size = 10;
    let r = outbox(&c).await;
    let names: Vec<String> = (0..12).map(|i| format!("S{i:02}")).collect();
    let mut nodes: Vec<(&str, i64)> = Vec::new();
    for v in 1..=30 {
        nodes.extend(names.iter().map(|s| (s.as_str(), v)));
    }
    add_nodes(r.graph(), &label, &nodes).await;
    for version in 1..=2 {
        let batch = r.claim(12).await.unwrap();
        let mut got: Vec<(String, i64)> = batch
            .iter()
            .map(|n| (n.stream.clone().unwrap(), n.version.unwrap()))
            .collect();
        got.sort();
        let expected: Vec<(String, i64)> = names.iter().map(|s| (s.clone(), version)).collect();
        assert_eq!(got, expected, "claim {version}");
        let ids: Vec<String> = batch.iter().map(|n| n.event_id.clone()).collect();
        let token = batch[0].lease_token.clone();
        assert_eq!(r.finish_delivered(&token, ids).await.unwrap(), 12);
    }
}

/// `relays` relays claim `limit` at a time, in rounds (each relay holding
/// its claim open for `hold`), until a round in which none found anything;
/// returns every claim.
async fn claim_all_concurrently(
    relays: Vec<Arc<Outbox>>,
    limit: usize,
    hold: Duration,
) -> Vec<Vec<ClaimedNode>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(relays.len()));
    let round_total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = relays
        .into_iter()
        .map(|r| {
            let (barrier, round_total) = (barrier.clone(), round_total.clone());
            tokio::spawn(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let mut claims = Vec::new();
                for _ in 0..100 {
                    barrier.wait().await;
                    let ids = r.shortlist(limit).await.unwrap();
                    let got = if ids.is_empty() {
                        Vec::new()
                    } else {
                        let open = r.claim_open(&ids).await.unwrap();
                        tokio::time::sleep(hold).await;
                        open.commit().await.unwrap()
                    };
                    round_total.fetch_add(got.len(), SeqCst);
                    claims.push(got);
                    barrier.wait().await;
                    let total = round_total.load(SeqCst);
                    if barrier.wait().await.is_leader() {
                        round_total.store(0, SeqCst);
                    }
                    if total == 0 {
                        break;
                    }
                }
                claims
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test]
async fn four_relays_claiming_25_over_60_streams_never_claim_a_node_twice() {
    let label = unique_label();
    let c = config(&label);
    let mut relays = Vec::new();
    for _ in 0..4 {
        relays.push(Arc::new(outbox(&c).await));
    }
    let names: Vec<String> = (0..60).map(|i| format!("S{i:02}")).collect();
    let nodes: Vec<(&str, i64)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    add_nodes(relays[0].graph(), &label, &nodes).await;
    let claims = claim_all_concurrently(relays, 25, Duration::from_millis(200)).await;
    let all = assert_disjoint(&claims);
    assert_eq!(all.len(), 60, "every node claimed once");
}

#[tokio::test]
async fn four_relays_racing_one_stream_of_20_claim_exactly_its_head() {
    let label = unique_label();
    let c = config(&label);
    let mut relays = Vec::new();
    for _ in 0..4 {
        relays.push(Arc::new(outbox(&c).await));
    }
    let nodes: Vec<(&str, i64)> = (1..=20).map(|v| ("hot", v)).collect();
    add_nodes(relays[0].graph(), &label, &nodes).await;
    let claims = claim_all_concurrently(relays, 25, Duration::from_millis(300)).await;
    assert_eq!(assert_disjoint(&claims), vec!["hot-1"]);
}

#[tokio::test]
async fn a_stolen_lease_makes_the_old_tokens_finish_change_nothing() {
    let label = unique_label();
    let mut c = config(&label);
    c.lease = Duration::from_secs(3600);
    let (r1, r2) = (outbox(&c).await, outbox(&c).await);
    add_nodes(r1.graph(), &label, &[("A", 1)]).await;
    let first = r1.claim(10).await.unwrap();
    assert_eq!(ids(&first), vec!["A-1"]);
    let again = r2.claim(10).await.unwrap();
    assert!(
        again.is_empty(),
        "a live lease is kept: {:?} {first:?} {:?}",
        node_state(r1.graph(), &label, "A-1").await,
        again
    );
    // The first holder stalls past its lease (its expiry is moved into the
    // past rather than waited for).
    set_node(
        r1.graph(),
        &label,
        "A-1",
        "{leaseExpiresAt: datetime() - duration('PT1S')}",
    )
    .await;
    let second = r2.claim(10).await.unwrap();
    assert_eq!(ids(&second), vec!["A-1"]);
    assert_ne!(first[0].lease_token, second[0].lease_token);
    // The old holder finishes: nothing changes.
    assert_eq!(
        r1.finish_delivered(&first[0].lease_token, vec!["A-1".into()])
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        r1.finish_dead(&first[0].lease_token, vec![("A-1".into(), "x".into())])
            .await
            .unwrap(),
        0
    );
    let (status, token, _) = node_state(r1.graph(), &label, "A-1").await;
    assert_eq!(
        (status.as_str(), token.as_deref()),
        ("inflight", Some(second[0].lease_token.as_str()))
    );
    // The new holder's finish holds.
    assert_eq!(
        r2.finish_delivered(&second[0].lease_token, vec!["A-1".into()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(node_state(r1.graph(), &label, "A-1").await.0, "delivered");
}

#[tokio::test]
async fn every_relay_query_is_index_backed() {
    let label = unique_label();
    assert_index_backed(&config(&label)).await;
}

/// The same with an owner's vocabulary: other state words, epoch
/// milliseconds for every time, no dead state, a lease owner.
#[tokio::test]
async fn every_relay_query_is_index_backed_in_an_owners_vocabulary() {
    let label = unique_label();
    let mut c = config(&label);
    c.statuses = outboxd::sources::neo4j::StatusWords {
        pending: "pending".into(),
        in_flight: "delivering".into(),
        failed: "failed".into(),
        delivered: "delivered".into(),
        dead: None,
    };
    c.time_encoding = outboxd::sources::neo4j::TimeEncoding::EpochMillisFloat;
    c.properties.delivered_at = "acknowledgedAt".into();
    c.properties.lease_owner = Some("leaseOwner".into());
    c.properties.lock = "claimProbe".into();
    assert_index_backed(&c).await;
}

async fn assert_index_backed(c: &Neo4jSourceConfig) {
    let r = outbox(c).await;
    add_nodes(r.graph(), &c.label, &[("A", 1)]).await;
    let server = Neo4jServer::shared();
    let mut checked = BTreeMap::new();
    for (name, text) in r.queries().all() {
        let plan = server.explain(&text);
        let scans: Vec<&String> = plan
            .iter()
            .filter(|op| {
                op.contains("LabelScan")
                    || op.contains("AllNodesScan")
                    || op.contains("NodeIndexScan")
            })
            .collect();
        assert!(scans.is_empty(), "query {name:?} scans: {plan:?}\n{text}");
        assert!(
            plan.iter().any(|op| op.contains("IndexSeek")),
            "query {name:?} seeks no index: {plan:?}\n{text}"
        );
        // A sort over a seek reads every entry it matches (the whole lane,
        // the whole stream) where the index could give them in order.
        let sorts: Vec<&String> = plan
            .iter()
            .filter(|op| op.contains("Top") || op.contains("Sort"))
            .collect();
        assert!(sorts.is_empty(), "query {name:?} sorts: {plan:?}\n{text}");
        checked.insert(name, plan);
    }
    assert_eq!(checked.len(), 14, "{checked:?}");
}

#[tokio::test]
async fn config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("outboxd.toml");
    let load = |text: &str| {
        std::fs::write(&file, text).unwrap();
        outboxd::config::Config::load(Some(&file), serde_json::json!({}))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = load(
        "[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://127.0.0.1:7687\"\nbatch-sise = 10\n",
    );
    assert!(e.contains("batch-sise"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://127.0.0.1:7687\"\n[sources.graph.properties]\nstreem = \"x\"\n");
    assert!(e.contains("streem"), "{e}");
    let e = load(
        "[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://127.0.0.1:7687\"\nbatch-size = 0\n",
    );
    assert!(e.contains("sources.graph.batch-size"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo4j\"\n");
    assert!(e.contains("sources.graph.url"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo4j\"\nurl = \"http://x\"\n");
    assert!(e.contains("sources.graph.url"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://x\"\nlabel = \"a b\"\n");
    assert!(e.contains("sources.graph.label"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://x\"\nlease = \"soon\"\n");
    assert!(e.contains("lease"), "{e}");
    let e = load("[sources.graph]\nkind = \"neo5j\"\nurl = \"bolt://x\"\n");
    assert!(e.contains("neo5j"), "{e}");
    // An owner's vocabulary: words that collide, a word that is not plain,
    // text for the relay's own times, a bad type template.
    let base = "[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://x\"\n";
    let e = load(&format!(
        "{base}[sources.graph.statuses]\npending = \"new\"\nin-flight = \"busy\"\nfailed = \"new\"\ndelivered = \"done\"\n"
    ));
    assert!(
        e.contains("sources.graph.statuses.failed") && e.contains("statuses.pending"),
        "{e}"
    );
    let e = load(&format!(
        "{base}[sources.graph.statuses]\nin-flight = \"in flight\"\n"
    ));
    assert!(e.contains("sources.graph.statuses.in-flight"), "{e}");
    let e = load(&format!("{base}time-encoding = \"iso8601\"\n"));
    assert!(e.contains("sources.graph.time-encoding"), "{e}");
    let e = load(&format!("{base}[sources.graph.event]\ntype = \"a.{{op\"\n"));
    assert!(e.contains("sources.graph.event.type"), "{e}");
    let e = load(&format!(
        "{base}[sources.graph.event]\nextensions = [\"leaseToken\"]\n"
    ));
    assert!(e.contains("sources.graph.event.extensions"), "{e}");
    // A good one loads.
    std::fs::write(&file, "[sources.graph]\nkind = \"neo4j\"\nurl = \"bolt://127.0.0.1:7687\"\nbatch-size = 10\nlease = \"30s\"\n[sources.graph.properties]\nstream = \"streamKey\"\n").unwrap();
    let config = outboxd::config::Config::load(Some(&file), serde_json::json!({})).unwrap();
    let outboxd::sources::SourceConfig::Neo4j(g) = &config.sources["graph"] else {
        panic!("not a neo4j source: {:?}", config.sources["graph"]);
    };
    assert_eq!(
        (g.batch_size, g.lease, g.properties.stream.as_str()),
        (10, Duration::from_secs(30), "streamKey")
    );
}

/// Wait until `check` holds for the statuses of the label's nodes (by
/// event id), or panic with the last ones seen.
async fn wait_statuses(
    graph: &neo4rs::Graph,
    label: &str,
    timeout: Duration,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, (String, Option<String>)> {
    let start = std::time::Instant::now();
    loop {
        let mut rows = graph
            .execute(query(&format!(
                "MATCH (n:`{label}`) RETURN coalesce(toStringOrNull(n.eventId), '?') AS id, n.status AS s, n.lastError AS e"
            )))
            .await
            .unwrap();
        let mut all = BTreeMap::new();
        while let Some(row) = rows.next().await.unwrap() {
            let id: String = row.get("id").unwrap();
            all.insert(
                id,
                (
                    row.get::<String>("s").unwrap(),
                    row.get::<Option<String>>("e").unwrap(),
                ),
            );
        }
        let statuses: BTreeMap<String, String> = all
            .iter()
            .map(|(k, (s, _))| (k.clone(), s.clone()))
            .collect();
        if check(&statuses) {
            return all;
        }
        if start.elapsed() > timeout {
            panic!("outbox nodes did not reach the expected statuses within {timeout:?}: {all:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn source_config(label: &str) -> outboxd::sources::SourceConfig {
    outboxd::sources::SourceConfig::Neo4j(config(label))
}

async fn relay_ingests_delivers_in_order_and_refuses_bad_nodes(backend: Backend) {
    common::init_logs();
    let db = TestDb::new(backend).await;
    let label = unique_label();
    let graph = Neo4jServer::shared().graph();
    add_nodes(
        &graph,
        &label,
        &[("A", 1), ("A", 2), ("A", 3), ("B", 1), ("B", 2)],
    )
    .await;
    // Bad nodes: each refused with a reason naming the property.
    graph
        .run(query(&format!(
            "CREATE (:`{label}` {{eventId: 'no-stream', streamVersion: 1, status: 'pending', eventType: 't', payload: '{{}}', createdAt: datetime()}}), \
                    (:`{label}` {{eventId: 'bad-version', packetId: 'D', streamVersion: 'one', status: 'pending', eventType: 't', payload: '{{}}', createdAt: datetime()}}), \
                    (:`{label}` {{eventId: 'bad-json', packetId: 'E', streamVersion: 1, status: 'pending', eventType: 't', payload: '{{nope', createdAt: datetime()}}), \
                    (:`{label}` {{packetId: 'F', streamVersion: 1, status: 'pending', eventType: 't', payload: '{{}}', createdAt: datetime()}}), \
                    (:`{label}` {{eventId: 42, packetId: 'G', streamVersion: 1, status: 'pending', eventType: 't', payload: '{{}}', createdAt: datetime()}}), \
                    (:`{label}` {{eventId: 'E-2', packetId: 'E', streamVersion: 2, status: 'pending', eventType: 't', payload: '{{}}', createdAt: datetime()}})"
        )))
        .await
        .unwrap();
    let (url, source) = (db.url.clone(), source_config(&label));
    let (d, receiver, _plugins) = common::Harness::new()
        .webhook("webhook", "")
        .config(move |c| {
            c.database_url = Some(url);
            c.sources.insert("graph".into(), source);
        })
        .start()
        .await
        .single();
    // C-1 was stored before, with other content: a conflict.
    d.post_event(&common::event(
        "C-1",
        "C",
        "other.type",
        serde_json::json!({}),
    ))
    .await;
    add_nodes(&graph, &label, &[("C", 1)]).await;
    let all = wait_statuses(&graph, &label, Duration::from_secs(30), |s| {
        s.values().all(|v| v == "delivered" || v == "dead")
    })
    .await;
    let status = |id: &str| all[id].0.as_str();
    for id in ["A-1", "A-2", "A-3", "B-1", "B-2", "E-2"] {
        assert_eq!(status(id), "delivered", "{id}: {all:?}");
    }
    let reason = |id: &str| all[id].1.clone().unwrap_or_default();
    assert_eq!(status("no-stream"), "dead");
    assert!(reason("no-stream").contains("packetId"), "{all:?}");
    assert_eq!(status("bad-version"), "dead");
    assert!(reason("bad-version").contains("streamVersion"), "{all:?}");
    assert_eq!(status("bad-json"), "dead");
    assert!(
        reason("bad-json").contains("payload") && reason("bad-json").contains("JSON"),
        "{all:?}"
    );
    for id in ["?", "42"] {
        assert_eq!(status(id), "dead", "{all:?}");
        assert!(reason(id).contains("eventId"), "{all:?}");
    }
    assert_eq!(status("C-1"), "dead");
    assert!(reason("C-1").contains("different"), "{all:?}");

    // Stored with its id, its stream and streamVersion as the sequence.
    let (code, body) = d.get("/v1/events/A-2").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["event"]["partitionkey"], "A");
    assert_eq!(body["event"]["sequence"], 2);
    assert_eq!(body["event"]["type"], "com.example.changed");
    assert_eq!(body["event"]["data"], serde_json::json!({"n": 2}));
    assert_eq!(
        d.get("/v1/events/no-stream").await.0,
        404,
        "nothing half-ingested"
    );

    // Delivered by the webhook sink, in stream order.
    assert!(common::eventually(Duration::from_secs(20), || receiver.count() >= 7).await);
    let order: Vec<String> = receiver
        .seen()
        .iter()
        .filter_map(|r| r.header("webhook-id"))
        .collect();
    let pos = |id: &str| {
        order
            .iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("{id} not delivered: {order:?}"))
    };
    assert!(
        pos("A-1") < pos("A-2") && pos("A-2") < pos("A-3") && pos("B-1") < pos("B-2"),
        "{order:?}"
    );

    // A node relayed again (a relay died before its finish) is a duplicate
    // success: delivered again, nothing new stored or sent.
    set_node(&graph, &label, "A-3", "{status: 'pending'}").await;
    wait_statuses(&graph, &label, Duration::from_secs(20), |s| {
        s["A-3"] == "delivered"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a3 = receiver
        .seen()
        .iter()
        .filter(|r| r.header("webhook-id").as_deref() == Some("A-3"))
        .count();
    assert_eq!(a3, 1);

    // Operations: ready, metrics, admin API.
    let (code, ready) = d.get("/ready").await;
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["checks"]["sources"]["sources"]["graph"]["ok"], true);
    assert_eq!(
        ready["checks"]["sources"]["sources"]["graph"]["checks"]["neo4j_reachable"]["ok"],
        true
    );
    let (code, admin) = d.get("/v1/admin/sources").await;
    assert_eq!(code, 200);
    assert_eq!(admin["sources"][0]["name"], "graph");
    assert_eq!(admin["sources"][0]["kind"], "neo4j");
    let metrics = d.metrics_text().await;
    assert!(
        metrics.contains("outboxd_source_entries_total{source=\"graph\",outcome=\"relayed\"} 7"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outboxd_source_entries_total{source=\"graph\",outcome=\"dead\"} 6"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outboxd_source_ready{source=\"graph\"} 1"),
        "{metrics}"
    );
    d.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn relay_ingests_delivers_in_order_and_refuses_bad_nodes_sqlite() {
    relay_ingests_delivers_in_order_and_refuses_bad_nodes(Backend::Sqlite).await;
}

#[tokio::test]
async fn relay_ingests_delivers_in_order_and_refuses_bad_nodes_postgres() {
    relay_ingests_delivers_in_order_and_refuses_bad_nodes(Backend::Postgres).await;
}

#[tokio::test]
async fn retention_deletes_delivered_nodes_in_batches() {
    let label = unique_label();
    let c = config(&label);
    let r = outbox(&c).await;
    let names: Vec<String> = (0..25).map(|i| format!("S{i:02}")).collect();
    let nodes: Vec<(&str, i64)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    add_nodes(r.graph(), &label, &nodes).await;
    add_nodes(r.graph(), &label, &[("keep", 1)]).await;
    let claimed = r.claim(25).await.unwrap();
    let keep: Vec<String> = claimed
        .iter()
        .filter(|n| n.event_id != "keep-1")
        .map(|n| n.event_id.clone())
        .collect();
    assert_eq!(
        r.finish_delivered(&claimed[0].lease_token, keep)
            .await
            .unwrap(),
        25
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Not old enough yet: nothing deleted.
    assert_eq!(
        r.purge_delivered(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    // Bounded batches: 10, 10, 5, 0.
    let mut rounds = Vec::new();
    loop {
        let n = r
            .purge_delivered(Duration::from_millis(100), 10)
            .await
            .unwrap();
        rounds.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(rounds, vec![10, 10, 5, 0]);
    let left = wait_statuses(r.graph(), &label, Duration::from_secs(1), |_| true).await;
    assert_eq!(left.keys().cloned().collect::<Vec<_>>(), vec!["keep-1"]);
}

/// The Cypher block of `docs/neo4j.md` that follows `marker`, exactly as
/// written there.
fn documented_cypher(marker: &str) -> String {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/neo4j.md")).unwrap();
    let after = doc
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/neo4j.md has no {marker}"));
    let block = after.split("```cypher\n").nth(1).unwrap();
    block.split("\n```").next().unwrap().to_string()
}

#[tokio::test]
async fn documented_outbox_write_gives_gapless_versions_and_is_relayed_in_order() {
    common::init_logs();
    let graph = Neo4jServer::shared().graph();
    graph
        .run(query(&documented_cypher("<!-- neo4j-schema -->")))
        .await
        .unwrap();
    let write = documented_cypher("<!-- neo4j-outbox-write -->");
    let packet = format!("packet-{}", hex::encode(rand::random::<[u8; 4]>()));
    // 16 concurrent application transactions on one stream, each with a
    // mutation of its own and the documented outbox write.
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let (graph, write, packet) = (graph.clone(), write.clone(), packet.clone());
            tokio::spawn(async move {
                let mut txn = graph.start_txn().await.unwrap();
                txn.run(
                    query("CREATE (:DocsExampleNote {packetId: $p, text: $t})")
                        .param("p", packet.clone())
                        .param("t", format!("note {i}")),
                )
                .await
                .unwrap();
                let mut rows = txn
                    .execute(
                        query(&write)
                            .param("packetId", packet.clone())
                            .param("eventId", format!("{packet}-evt-{i}"))
                            .param("eventType", "com.example.packet.updated")
                            .param("payload", format!("{{\"note\": {i}}}")),
                    )
                    .await
                    .unwrap();
                let mut version = 0i64;
                while let Some(row) = rows.next(txn.handle()).await.unwrap() {
                    version = row.get("streamVersion").unwrap();
                }
                drop(rows);
                txn.commit().await.unwrap();
                (i, version)
            })
        })
        .collect();
    let mut versions = Vec::new();
    for w in writers {
        versions.push(w.await.unwrap());
    }
    let mut vs: Vec<i64> = versions.iter().map(|(_, v)| *v).collect();
    vs.sort();
    assert_eq!(vs, (1..=16).collect::<Vec<i64>>(), "gapless, no repeats");

    // The relay with its defaults (label AwarenessOutbox) relays them.
    let mut source = config("AwarenessOutbox");
    source.label = Neo4jSourceConfig::default().label;
    let (d, _plugins) = common::Harness::new()
        .config(move |c| {
            c.sources
                .insert("docs".into(), outboxd::sources::SourceConfig::Neo4j(source));
        })
        .start()
        .await
        .into_daemon();
    for (i, version) in &versions {
        let id = format!("{packet}-evt-{i}");
        let start = std::time::Instant::now();
        loop {
            let (code, body) = d.get(&format!("/v1/events/{id}")).await;
            if code == 200 {
                assert_eq!(body["event"]["sequence"], *version, "{body}");
                assert_eq!(body["event"]["partitionkey"], packet.as_str());
                assert_eq!(body["event"]["data"], serde_json::json!({"note": i}));
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{id} was not relayed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    d.stop().await;
}

#[tokio::test]
async fn neo4j_unreachable_shows_in_ready_and_sources_list_and_the_daemon_stays_up() {
    common::init_logs();
    let closed = common::free_loopback_addr();
    let mut source = config(&unique_label());
    source.url = format!("bolt://{closed}");
    source.timeout = Duration::from_secs(2);
    source.lease = Duration::from_secs(10);
    let (d, _plugins) = common::Harness::new()
        .config(move |c| {
            c.sources.insert(
                "graph".into(),
                outboxd::sources::SourceConfig::Neo4j(source),
            );
        })
        .start()
        .await
        .into_daemon();
    let start = std::time::Instant::now();
    let ready = loop {
        let (code, ready) = d.get("/ready").await;
        if ready["checks"]["sources"]["sources"]["graph"]["last_error"].is_string() {
            assert_eq!(code, 503, "{ready}");
            break ready;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let source = &ready["checks"]["sources"]["sources"]["graph"];
    assert_eq!(source["ok"], false);
    assert_eq!(source["checks"]["neo4j_reachable"]["ok"], false, "{ready}");
    assert_eq!(ready["checks"]["sources"]["ok"], false);
    // The daemon itself goes on serving.
    assert_eq!(d.get("/health").await.0, 200);
    let addr = d.base.trim_start_matches("http://").to_string();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["sources", "list"])
        .env("OUTBOXD_LISTEN", &addr)
        .env("OUTBOXD_DATA_DIR", d.data.path())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("graph\tneo4j\tnot ready\t"), "{text}");
    d.stop().await;
}

/// Outbox nodes of the crash test: `STREAMS` streams × `PER_STREAM` versions.
const STREAMS: usize = 200;
const PER_STREAM: usize = 50;
/// SIGKILLs of a relay process during the crash test (at least).
const KILLS: usize = 5;

#[tokio::test]
async fn three_relay_processes_sigkilled_deliver_every_node_once_in_stream_order() {
    common::init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let label = unique_label();
    let graph = Neo4jServer::shared().graph();
    for chunk in 0..STREAMS / 20 {
        let nodes: Vec<(String, i64)> = (chunk * 20..(chunk + 1) * 20)
            .flat_map(|s| (1..=PER_STREAM as i64).map(move |v| (format!("S{s:03}"), v)))
            .collect();
        let refs: Vec<(&str, i64)> = nodes.iter().map(|(s, v)| (s.as_str(), *v)).collect();
        add_nodes(&graph, &label, &refs).await;
    }
    let total = STREAMS * PER_STREAM;
    let receiver = common::Receiver::start().await;
    let plugins = common::PluginsDir::new();
    let secret = common::new_secret();
    plugins.add_webhook_with_limits(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &secret,
        "deadline = \"2s\"\nmax-batch = 100\n",
        "",
    );
    let data = tempfile::tempdir().unwrap();
    let configs: Vec<common::ChildConfig> = (0..3)
        .map(|i| common::ChildConfig {
            listen: common::free_loopback_addr(),
            database_url: db.url.clone(),
            plugins_dir: plugins.path().to_path_buf(),
            data_dir: data.path().join(format!("relay{i}")),
            env: [
                ("OUTBOXD_DELIVERY__LEASE", "9s"),
                ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL", "200ms"),
                ("OUTBOXD_SOURCES__GRAPH__KIND", "neo4j"),
                (
                    "OUTBOXD_SOURCES__GRAPH__URL",
                    Neo4jServer::shared().uri.as_str(),
                ),
                ("OUTBOXD_SOURCES__GRAPH__LABEL", label.as_str()),
                ("OUTBOXD_SOURCES__GRAPH__LEASE", "5s"),
                ("OUTBOXD_SOURCES__GRAPH__TIMEOUT", "2s"),
                ("OUTBOXD_SOURCES__GRAPH__POLL_INTERVAL", "100ms"),
                ("OUTBOXD_SOURCES__GRAPH__RETRY_BASE", "200ms"),
                ("OUTBOXD_SOURCES__GRAPH__RETRY_CAP", "1s"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            log: common::child_log(&format!("neo4j-crash-relay{i}")),
        })
        .collect();
    let mut relays: Vec<common::ChildDaemon> =
        configs.iter().map(common::ChildDaemon::spawn).collect();
    for r in &mut relays {
        r.wait_healthy(Duration::from_secs(60)).await;
    }
    let unique = |r: &common::Receiver| {
        r.with_seen(|seen| {
            seen.iter()
                .filter_map(|x| x.header("webhook-id"))
                .collect::<HashSet<_>>()
                .len()
        })
    };
    let start = std::time::Instant::now();
    let mut kills = 0;
    while kills < KILLS || unique(&receiver) < total {
        assert!(
            start.elapsed() < Duration::from_secs(400),
            "only {} of {total} delivered after {kills} kills:\n{}",
            unique(&receiver),
            relays[0].log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if kills < KILLS {
            let i = rand::random_range(0..3);
            relays[i].kill();
            kills += 1;
            relays[i] = common::ChildDaemon::spawn(&configs[i]);
            relays[i].wait_healthy(Duration::from_secs(60)).await;
        }
    }
    // Every node delivered in Neo4j, every event stored once.
    wait_statuses(&graph, &label, Duration::from_secs(60), |s| {
        s.values().all(|v| v == "delivered")
    })
    .await;
    use sqlx::Connection;
    let mut pg = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM outboxd.events")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(
        stored as usize, total,
        "no event stored twice under two ids, none missing"
    );
    // In stream order: each stream's first deliveries come in version order.
    let firsts: Vec<String> = receiver.with_seen(|seen| {
        let mut first = HashSet::new();
        seen.iter()
            .filter_map(|x| x.header("webhook-id"))
            .filter(|id| first.insert(id.clone()))
            .collect()
    });
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for id in &firsts {
        let (stream, version) = id.rsplit_once('-').unwrap();
        let version: i64 = version.parse().unwrap();
        let prev = last.insert(stream.to_string(), version).unwrap_or(0);
        assert_eq!(
            version,
            prev + 1,
            "{id} delivered first after version {prev} of {stream}"
        );
    }
    assert_eq!(last.len(), STREAMS);
    let redelivered = receiver.count() - total;
    eprintln!(
        "crash test: {total} nodes, {kills} SIGKILLs, {redelivered} re-deliveries, {:.1}s",
        start.elapsed().as_secs_f64()
    );
    drop(relays);
    db.cleanup().await;
}

/// Benchmark (run by hand: `cargo test --test integration_neo4j --
/// --ignored bench_claim --nocapture`): the cost of one claim cycle
/// (shortlist + lock-first claim of 100 heads + fenced finish) with 10,000
/// pending nodes, then with 100,000, printed as a ratio measured in the
/// same run. Ids are random UUIDs, so streams mix in the id order.
#[tokio::test]
#[ignore]
async fn bench_claim_cost_10k_vs_100k_pending() {
    let label = unique_label();
    let mut c = config(&label);
    c.batch_size = 100;
    let r = outbox(&c).await;
    let add = |count: usize, streams: usize| {
        let graph = r.graph().clone();
        let label = label.clone();
        async move {
            for _ in 0..count / 10_000 {
                graph
                    .run(
                        query(&format!(
                            "UNWIND range(1, 10000) AS i CREATE (:`{label}` {{eventId: randomUUID(), \
                             packetId: 'S' + toString(i % $streams), streamVersion: i, status: 'pending', \
                             attempts: 0, createdAt: datetime(), eventType: 't', payload: '{{}}'}})"
                        ))
                        .param("streams", streams as i64),
                    )
                    .await
                    .unwrap();
            }
        }
    };
    let measure = |rounds: usize| {
        let r = &r;
        async move {
            let start = std::time::Instant::now();
            let mut claimed = 0;
            for _ in 0..rounds {
                let nodes = r.claim(100).await.unwrap();
                claimed += nodes.len();
                if let Some(first) = nodes.first() {
                    let ids = nodes.iter().map(|n| n.event_id.clone()).collect();
                    r.finish_delivered(&first.lease_token, ids).await.unwrap();
                }
            }
            (start.elapsed() / rounds as u32, claimed)
        }
    };
    add(10_000, 1000).await;
    measure(3).await; // warm-up
    let (small, n_small) = measure(20).await;
    add(90_000, 1000).await;
    measure(3).await;
    let (large, n_large) = measure(20).await;
    eprintln!(
        "claim cycle (100 heads): {:.1} ms at ~10k pending ({n_small} claimed), {:.1} ms at ~100k pending ({n_large} claimed): ratio {:.2}",
        small.as_secs_f64() * 1e3,
        large.as_secs_f64() * 1e3,
        large.as_secs_f64() / small.as_secs_f64()
    );
}
