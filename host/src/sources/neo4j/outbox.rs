//! The outbox protocol over Neo4j: the lock-first claim of stream heads,
//! the fenced finishes and lease renewals (`{eventId, leaseToken}`),
//! retention, the sweeps for nodes it cannot read, the leases it waits out
//! and the checks `/ready` shows ([`Outbox`]), and what fails in them
//! ([`OutboxError`]). The Cypher text is in [`super::queries`].
//!
//! Must never: set a node's status without holding its lock and having
//! re-read it, finish a node whose lease token changed, or take a node
//! whose lease it cannot read before that lease has been waited out.

use super::*;

/// A Neo4j failure of the relay.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The driver or the server failed.
    #[error("neo4j {what}: {source}")]
    Neo4j {
        /// The step that failed (`claim`, `finish`, `indexes`, ...).
        what: &'static str,
        /// The driver's error.
        #[source]
        source: neo4rs::Error,
    },
    /// No answer within the configured timeout.
    #[error("neo4j {what}: no answer within {timeout:?}")]
    Timeout {
        /// The step that timed out.
        what: &'static str,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// outboxd's own store failed while ingesting a claimed batch (the
    /// nodes were marked failed, to retry).
    #[error("ingest into the outboxd store: {0}")]
    Ingest(String),
    /// A setting that can only be read at run time is unusable (the
    /// message names the key).
    #[error("configuration: {0}")]
    Config(String),
    /// A row of an answer did not have the expected shape.
    #[error("neo4j {what}: unexpected answer: {detail}")]
    Shape {
        /// The step whose answer it was.
        what: &'static str,
        /// What was wrong with the row.
        detail: String,
    },
}

impl OutboxError {
    /// True when the server answered (so it is reachable).
    pub fn connected(&self) -> bool {
        matches!(
            self,
            OutboxError::Neo4j {
                source: neo4rs::Error::Neo4j(_),
                ..
            } | OutboxError::Shape { .. }
                | OutboxError::Ingest(_)
        )
    }

    fn transient(&self) -> bool {
        matches!(self, OutboxError::Neo4j { source: neo4rs::Error::Neo4j(e), .. }
            if e.kind() == neo4rs::Neo4jErrorKind::Transient)
    }
}

/// A node claimed by [`Outbox::claim`], with what the event is made of.
#[derive(Debug, Clone)]
pub struct ClaimedNode {
    /// The node's event id property (becomes the event's `id`).
    pub event_id: String,
    /// The claim's fencing token.
    pub lease_token: String,
    /// Attempts including this one.
    pub attempts: i64,
    /// The stream property when it is a string.
    pub stream: Option<String>,
    /// The stream property as text, whatever its type (for reasons).
    pub stream_text: Option<String>,
    /// The version property when it is an integer.
    pub version: Option<i64>,
    /// The version property as text, whatever its type (for reasons).
    pub version_text: Option<String>,
    /// The type property (CloudEvents `type`) when it is a string.
    pub ty: Option<String>,
    /// The source property (CloudEvents `source`) when it is a string.
    pub source: Option<String>,
    /// The subject property (CloudEvents `subject`) when it is a string.
    pub subject: Option<String>,
    /// The node was in flight under another lease (expired, or unreadable
    /// and waited out) when this claim took it.
    pub reclaimed: bool,
    /// The time property as RFC 3339 text (CloudEvents `time`), when it is
    /// in its configured encoding.
    pub time: Option<String>,
    /// The time property is set (in any encoding).
    pub has_time: bool,
    /// The data property when it is a string.
    pub data: Option<String>,
    /// The data property is set (of any type).
    pub has_data: bool,
    /// Every property but the data, as (name, value as text; `None` when
    /// not representable): the extension attributes and the type
    /// template's fields are taken from these.
    pub properties: Vec<(String, Option<String>)>,
}

/// A node the relay read but cannot use as it is: a time or lease property
/// in another encoding than configured, or a status none of the words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The node's event id (or `<none>`).
    pub event_id: String,
    /// The configured key of the property (`lease-expires-at`, `status` …).
    pub property: String,
    /// What happens to it.
    pub consequence: &'static str,
}

/// A claim transaction that has taken its nodes and not yet committed
/// (tests hold one open to race another relay against it).
pub struct OpenClaim {
    txn: neo4rs::Txn,
    /// The nodes taken, `inflight` under this claim's lease token.
    pub nodes: Vec<ClaimedNode>,
    timeout: Duration,
}

impl OpenClaim {
    /// Commit: the claim holds from now on.
    pub async fn commit(self) -> Result<Vec<ClaimedNode>, OutboxError> {
        let what = "commit claim";
        match tokio::time::timeout(self.timeout, self.txn.commit()).await {
            Ok(Ok(_)) => Ok(self.nodes),
            Ok(Err(source)) => Err(OutboxError::Neo4j { what, source }),
            Err(_) => Err(OutboxError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }
}

/// An outbox in one Neo4j database: its queries and a connection pool.
pub struct Outbox {
    graph: Graph,
    config: Neo4jSourceConfig,
    queries: Queries,
    /// Keyset cursor per lane: the next cycle goes on after it.
    cursors: Mutex<[String; 3]>,
    /// The walk's cursor: the last stream value it asked about.
    walked: Mutex<String>,
    /// Streams whose head this relay finished (delivered or dead), oldest
    /// first, at most [`SUCCESSORS_KEPT`]: their next node is the likely
    /// next head.
    successors: Mutex<Finished>,
    /// Nodes read with a property not as configured, by (event id,
    /// property key): when this relay first and last saw it so, and how
    /// many times. A node is reported on its second sighting (a read racing
    /// another relay's finish can see a status with the properties of the
    /// next state: Neo4j reads committed data, not a snapshot), and an
    /// unreadable lease is taken once `unreadable-lease-wait` has passed
    /// since first seen. Forgotten when not seen for as long (the holder
    /// finished it); at most [`UNREADABLE_KEPT`].
    unreadable: Mutex<HashMap<(String, String), Sighting>>,
    /// Malformed nodes found since [`Outbox::take_malformed`] last ran,
    /// each node and property reported once ([`REPORTED_KEPT`] remembered).
    malformed: Mutex<Reported>,
    /// Written into `properties.lease-owner` at claim: `outboxd-HOST-PID`.
    owner: String,
}

/// Malformed nodes found and not taken yet, and every (node, property)
/// reported so far.
type Reported = (Vec<Malformed>, HashSet<(String, String)>);

/// One node's unreadable property as seen by the relay.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    first: Instant,
    last: Instant,
    times: u32,
}

/// Most unreadable properties [`Outbox`] keeps track of at once.
const UNREADABLE_KEPT: usize = 10_000;
/// Most malformed (node, property) pairs remembered as reported.
const REPORTED_KEPT: usize = 100_000;

/// The streams [`Outbox::note_finished`] remembers, oldest first, each
/// once (the set mirrors the queue, so remembering one is O(1)).
#[derive(Default)]
struct Finished {
    order: std::collections::VecDeque<String>,
    kept: HashSet<String>,
}

/// `outboxd-HOST-PID`, as a dispatcher names itself in a lease owner
/// property (`$HOSTNAME`, else `/etc/hostname`, else `host`).
fn lease_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("outboxd-{host}-{}", std::process::id())
}

/// Most streams [`Outbox`] remembers as just finished; older ones are
/// forgotten (the lanes find their heads again).
const SUCCESSORS_KEPT: usize = 10_000;

impl Outbox {
    /// A pool for `config` (validated) with `password`. Connects lazily.
    pub fn connect(config: &Neo4jSourceConfig, password: &str) -> Result<Outbox, OutboxError> {
        let mut builder = neo4rs::ConfigBuilder::default()
            .uri(&config.url)
            .user(&config.user)
            .password(password)
            .max_connections(8)
            .connection_timeout(config.timeout);
        if let Some(db) = &config.database {
            builder = builder.db(db.as_str());
        }
        let what = "connect";
        let graph = builder
            .build()
            .and_then(Graph::connect)
            .map_err(|source| OutboxError::Neo4j { what, source })?;
        Ok(Outbox {
            graph,
            queries: Queries::new(config),
            config: config.clone(),
            cursors: Mutex::new(Default::default()),
            walked: Mutex::new(String::new()),
            successors: Mutex::new(Default::default()),
            unreadable: Mutex::new(HashMap::new()),
            malformed: Mutex::new(Default::default()),
            owner: lease_owner(),
        })
    }

    /// The value written into `properties.lease-owner`.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The malformed nodes found since the last call, each (node,
    /// property) once.
    pub fn take_malformed(&self) -> Vec<Malformed> {
        std::mem::take(&mut self.malformed.lock().unwrap().0)
    }

    fn report(&self, event_id: &str, property: &str, consequence: &'static str) {
        let mut m = self.malformed.lock().unwrap();
        if m.1.len() >= REPORTED_KEPT {
            m.1.clear();
        }
        if m.1.insert((event_id.to_string(), property.to_string())) {
            m.0.push(Malformed {
                event_id: event_id.to_string(),
                property: property.to_string(),
                consequence,
            });
        }
    }

    /// Note a node the relay read with `bad` (the key of its property not
    /// as configured). Reported on the second sighting.
    fn note_bad(&self, id: &str, bad: &str) {
        let now = Instant::now();
        let times = {
            let mut u = self.unreadable.lock().unwrap();
            let key = (id.to_string(), bad.to_string());
            if u.len() >= UNREADABLE_KEPT && !u.contains_key(&key) {
                return;
            }
            let seen = u.entry(key).or_insert(Sighting {
                first: now,
                last: now,
                times: 0,
            });
            seen.last = now;
            seen.times += 1;
            seen.times
        };
        if times < 2 {
            return;
        }
        if bad == "lease-expires-at" {
            self.report(id, bad, "waited for, then reclaimed");
        } else {
            self.report(id, bad, "not due until repaired; blocks its stream");
        }
    }

    /// In-flight nodes whose unreadable lease has been seen twice and
    /// waited out: the claim may take them. Forgets the sightings not
    /// renewed for as long as the wait (a minute at least).
    fn reclaimable(&self) -> Vec<String> {
        let wait = self.config.unreadable_lease_wait;
        let mut u = self.unreadable.lock().unwrap();
        u.retain(|_, s| s.last.elapsed() < wait.max(Duration::from_secs(60)));
        u.iter()
            .filter(|((_, prop), s)| {
                prop == "lease-expires-at" && s.times >= 2 && s.first.elapsed() >= wait
            })
            .map(|((id, _), _)| id.clone())
            .collect()
    }

    /// The queries in use.
    pub fn queries(&self) -> &Queries {
        &self.queries
    }

    /// The driver's pool (tests write nodes through it).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    async fn timed<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, neo4rs::Error>>,
    ) -> Result<T, OutboxError> {
        match tokio::time::timeout(self.config.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(OutboxError::Neo4j { what, source }),
            Err(_) => Err(OutboxError::Timeout {
                what,
                timeout: self.config.timeout,
            }),
        }
    }

    /// Run `q` (auto-commit, retried by the driver on transient errors) and
    /// return its rows.
    async fn rows(
        &self,
        what: &'static str,
        q: Query,
        read: bool,
    ) -> Result<Vec<neo4rs::Row>, OutboxError> {
        self.timed(what, async {
            let mut stream = if read {
                self.graph.execute_read(q).await?
            } else {
                self.graph.execute(q).await?
            };
            let mut rows = Vec::new();
            while let Some(row) = stream.next().await? {
                rows.push(row);
            }
            Ok(rows)
        })
        .await
    }

    /// Create the indexes the relay's queries use (`IF NOT EXISTS`) and
    /// wait until they are online.
    pub async fn ensure_indexes(&self) -> Result<(), OutboxError> {
        for statement in &self.queries.indexes {
            self.timed("create index", self.graph.run(query(statement)))
                .await?;
        }
        let wait = format!(
            "CALL db.awaitIndexes({})",
            self.config.timeout.as_secs().max(1)
        );
        self.timed("await indexes", self.graph.run(query(&wait)))
            .await?;
        Ok(())
    }

    /// Read-only: up to `limit` event ids of due heads of streams, found
    /// three ways, in this order:
    ///
    /// 1. the heads of the streams this relay last finished
    ///    ([`Outbox::note_finished`]; one index seek per stream and live
    ///    status), leaving the others a quarter of `limit` (at least one);
    /// 2. the lanes (pending, failed and due, expired leases), keyset-paged
    ///    from each lane's cursor, at most `max-pages` pages per lane — one
    ///    page when the finished streams gave half of `limit` or more. A
    ///    lane stops after a full page in which fewer than a quarter of the
    ///    nodes were heads;
    /// 3. when the lanes saw due nodes behind their stream's head and there
    ///    is room left, the walk: stream by stream in stream order from its
    ///    cursor ([`Queries::walk`], one seek per stream), each stream's
    ///    head asked like the finished ones, until the claim is full or
    ///    `2 × limit` streams were asked.
    ///
    /// Why all three: a lane page finds one head per `pending ÷ streams`
    /// nodes it reads (one in five pages of 200 with 1,000 pending per
    /// stream), so a deep backlog relayed by lanes alone crawls
    /// (bench/results/history.md, "The Neo4j outbox relay"), while a stream's head is one seek away once the
    /// stream is known — from a finish or from the walk. The lanes still
    /// find the streams the walk would reach late (few live streams among
    /// many finished ones). The lanes keep a quarter of every claim (one of
    /// a claim of 1: the finished streams then take no place) and never
    /// skip a head they had no room for (the cursor stops before it), and
    /// the walk goes round every stream, so every stream is reached however
    /// busy the finished ones are. The claim re-checks every id under its
    /// lock, so a stale id costs only its seek.
    pub async fn shortlist(&self, limit: usize) -> Result<Vec<String>, OutboxError> {
        let mut found: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        let lanes_keep = (limit / 4).max(1);
        let finished: Vec<String> = {
            let mut finished = self.successors.lock().unwrap();
            let n = limit.saturating_sub(lanes_keep).min(finished.order.len());
            let taken: Vec<String> = finished.order.drain(..n).collect();
            for stream in &taken {
                finished.kept.remove(stream);
            }
            taken
        };
        let asked: HashSet<String> = finished.iter().cloned().collect();
        self.heads_of(finished, limit, &mut found, &mut seen)
            .await?;
        let pages = if !found.is_empty() && found.len() >= limit / 2 {
            1
        } else {
            self.config.max_pages
        };
        let mut behind = false;
        let reclaim = self.reclaimable();
        for (lane, (_, text)) in self.queries.shortlist.iter().enumerate() {
            let mut after = self.cursors.lock().unwrap()[lane].clone();
            'pages: for _ in 0..pages {
                if found.len() >= limit {
                    break;
                }
                let q = query(text)
                    .param("after", after.clone())
                    .param("page", self.config.page_size as i64)
                    .param("reclaim", reclaim.clone());
                let rows = self.rows("shortlist", q, true).await?;
                let full = rows.len() >= self.config.page_size as usize;
                let mut heads = 0;
                for row in &rows {
                    let shape = |e: neo4rs::DeError| OutboxError::Shape {
                        what: "shortlist",
                        detail: e.to_string(),
                    };
                    let id: String = row.get("id").map_err(shape)?;
                    let due: Option<bool> = row.get("due").map_err(shape)?;
                    let head: Option<bool> = row.get("head").map_err(shape)?;
                    let bad: Option<String> = row.get("bad").map_err(shape)?;
                    if let Some(bad) = &bad {
                        self.note_bad(&id, bad);
                    }
                    match (due.unwrap_or(false), head.unwrap_or(false)) {
                        (true, true) if !seen.contains(&id) => {
                            if found.len() >= limit {
                                // No room: the next cycle starts at this head.
                                break 'pages;
                            }
                            heads += 1;
                            seen.insert(id.clone());
                            found.push(id.clone());
                        }
                        (true, false) => behind = true,
                        _ => {}
                    }
                    after = id;
                }
                if !full {
                    after = String::new();
                    break;
                }
                if heads * 4 < rows.len() {
                    // Mostly nodes behind their heads: the walk finds
                    // heads for less than the next page costs.
                    break;
                }
            }
            self.cursors.lock().unwrap()[lane] = after;
        }
        if behind {
            self.walk(limit, &asked, &mut found, &mut seen).await?;
        }
        Ok(found)
    }

    /// Remember the streams of nodes this relay just finished (delivered
    /// or dead): the next [`Outbox::shortlist`] seeks their next heads.
    pub fn note_finished(&self, streams: impl IntoIterator<Item = String>) {
        let mut finished = self.successors.lock().unwrap();
        for stream in streams {
            if finished.kept.insert(stream.clone()) {
                finished.order.push_back(stream);
            }
        }
        while finished.order.len() > SUCCESSORS_KEPT {
            if let Some(old) = finished.order.pop_front() {
                finished.kept.remove(&old);
            }
        }
    }

    /// The walk of [`Outbox::shortlist`]: the streams after the walk's
    /// cursor, never more at a time than there are places left in `found`
    /// (up to `limit`), and their due heads, until `found` is full or
    /// `2 × limit` streams were asked about (streams with nothing due: in
    /// flight with another relay, finished, failed and waiting). The
    /// streams in `asked_already` (this claim's finished streams, whose
    /// heads were just sought) are stepped over, not asked again. Past the
    /// last stream it goes on from the first, once per call.
    async fn walk(
        &self,
        limit: usize,
        asked_already: &HashSet<String>,
        found: &mut Vec<String>,
        seen: &mut HashSet<String>,
    ) -> Result<(), OutboxError> {
        let mut after = self.walked.lock().unwrap().clone();
        let mut wrapped = after.is_empty();
        let most = limit.saturating_mul(2);
        let mut asked = 0;
        while found.len() < limit && asked < most {
            let q = query(&self.queries.walk).param("after", after.clone());
            let rows = self.rows("walk", q, true).await?;
            let streams: Vec<String> = match rows.first() {
                Some(row) => row.get("streams").map_err(|e| OutboxError::Shape {
                    what: "walk",
                    detail: e.to_string(),
                })?,
                None => Vec::new(),
            };
            let to_the_end = streams.len() < WALK_STEPS;
            let room = (limit - found.len()).min(most - asked);
            let mut fresh = Vec::with_capacity(room);
            let mut stepped = 0;
            for stream in &streams {
                if fresh.len() == room {
                    break;
                }
                stepped += 1;
                if !asked_already.contains(stream) {
                    fresh.push(stream.clone());
                }
            }
            asked += fresh.len();
            after = if to_the_end && stepped == streams.len() {
                String::new()
            } else {
                streams[stepped - 1].clone()
            };
            self.heads_of(fresh, limit, found, seen).await?;
            if after.is_empty() {
                if wrapped {
                    break;
                }
                wrapped = true;
            }
        }
        *self.walked.lock().unwrap() = after;
        Ok(())
    }

    /// The due heads of `streams` ([`Queries::successors`]), added to
    /// `found` while it holds fewer than `limit`.
    async fn heads_of(
        &self,
        streams: Vec<String>,
        limit: usize,
        found: &mut Vec<String>,
        seen: &mut HashSet<String>,
    ) -> Result<(), OutboxError> {
        if streams.is_empty() || found.len() >= limit {
            return Ok(());
        }
        let q = query(&self.queries.successors)
            .param("streams", streams)
            .param("reclaim", self.reclaimable());
        for row in self.rows("successors", q, true).await? {
            let shape = |e: neo4rs::DeError| OutboxError::Shape {
                what: "successors",
                detail: e.to_string(),
            };
            let id: String = row.get("id").map_err(shape)?;
            let due: Option<bool> = row.get("due").map_err(shape)?;
            let bad: Option<String> = row.get("bad").map_err(shape)?;
            if let Some(bad) = &bad {
                self.note_bad(&id, bad);
            }
            if due.unwrap_or(false) && found.len() < limit && seen.insert(id.clone()) {
                found.push(id);
            }
        }
        Ok(())
    }

    /// The lock-first claim of `ids` (shortlisted) in a write transaction
    /// left open: each node is written first (taking its lock), then
    /// re-checked (eligible, no earlier live version of its stream), then
    /// leased for `lease` under a fresh token. Nodes that are no longer
    /// eligible are left as they are.
    pub async fn claim_open(&self, ids: &[String]) -> Result<OpenClaim, OutboxError> {
        let token = crate::store::new_lease_token();
        let mut ids = ids.to_vec();
        // One lock order for every relay: fewer deadlocks.
        ids.sort();
        ids.dedup();
        let what = "claim";
        let mut txn = self.timed(what, self.graph.start_txn()).await?;
        let q = query(&self.queries.claim)
            .param("ids", ids)
            .param("token", token.clone())
            .param("lease_ms", self.config.lease.as_millis() as i64)
            .param("reclaim", self.reclaimable())
            .param("owner", self.owner.clone());
        let rows = self
            .timed(what, async {
                let mut stream = txn.execute(q).await?;
                let mut rows = Vec::new();
                while let Some(row) = stream.next(txn.handle()).await? {
                    rows.push(row);
                }
                Ok(rows)
            })
            .await?;
        let mut nodes = Vec::with_capacity(rows.len());
        for row in rows {
            let shape = |e: neo4rs::DeError| OutboxError::Shape {
                what,
                detail: e.to_string(),
            };
            let keys: Vec<String> = row.get("prop_keys").map_err(shape)?;
            let values: Vec<Option<String>> = row.get("prop_values").map_err(shape)?;
            nodes.push(ClaimedNode {
                event_id: row.get("id").map_err(shape)?,
                lease_token: token.clone(),
                attempts: row.get("attempts").map_err(shape)?,
                stream: row.get("stream").map_err(shape)?,
                stream_text: row.get("stream_text").map_err(shape)?,
                version: row.get("version").map_err(shape)?,
                version_text: row.get("version_text").map_err(shape)?,
                ty: row.get("type").map_err(shape)?,
                source: row.get("source").map_err(shape)?,
                subject: row.get("subject").map_err(shape)?,
                reclaimed: row.get("reclaimed").map_err(shape)?,
                time: row.get("time").map_err(shape)?,
                has_time: row.get("has_time").map_err(shape)?,
                data: row.get("data").map_err(shape)?,
                has_data: row.get("has_data").map_err(shape)?,
                properties: keys.into_iter().zip(values).collect(),
            });
        }
        {
            let mut u = self.unreadable.lock().unwrap();
            for node in &nodes {
                u.remove(&(node.event_id.clone(), "lease-expires-at".to_string()));
                u.remove(&(node.event_id.clone(), "next-attempt-at".to_string()));
            }
        }
        Ok(OpenClaim {
            txn,
            nodes,
            timeout: self.config.timeout,
        })
    }

    /// Shortlist and claim up to `limit` nodes, committed. A claim
    /// transaction that fails with a transient error (deadlock with another
    /// relay, lock timeout) is retried a few times.
    pub async fn claim(&self, limit: usize) -> Result<Vec<ClaimedNode>, OutboxError> {
        let ids = self.shortlist(limit).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tries = 0;
        loop {
            let result = match self.claim_open(&ids).await {
                Ok(open) => open.commit().await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.transient() && tries < CLAIM_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(
                        rand::random_range(5..50u64) * tries as u64,
                    ))
                    .await;
                }
                other => return other,
            }
        }
    }

    async fn finish(
        &self,
        what: &'static str,
        text: &str,
        token: &str,
        ids: Vec<String>,
        extra: impl FnOnce(Query) -> Query,
    ) -> Result<u64, OutboxError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let tokens = vec![token.to_string(); ids.len()];
        let q = extra(query(text).param("ids", ids).param("tokens", tokens));
        let rows = self.rows(what, q, false).await?;
        let kept: i64 = match rows.first() {
            Some(row) => row.get("kept").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(kept.max(0) as u64)
    }

    /// Mark `ids` (claimed under `token`) delivered, with the time.
    /// Returns how many still held the lease (the rest changed nothing).
    pub async fn finish_delivered(
        &self,
        token: &str,
        ids: Vec<String>,
    ) -> Result<u64, OutboxError> {
        self.finish(
            "finish delivered",
            &self.queries.finish_delivered,
            token,
            ids,
            |q| q,
        )
        .await
    }

    /// Mark nodes failed: tried again after each one's delay, with its
    /// reason. Returns how many still held the lease.
    pub async fn finish_failed(
        &self,
        token: &str,
        items: Vec<(String, Duration, String)>,
    ) -> Result<u64, OutboxError> {
        let mut ids = Vec::new();
        let mut delays = Vec::new();
        let mut reasons = Vec::new();
        for (id, delay, reason) in items {
            ids.push(id);
            delays.push(delay.as_millis() as i64);
            reasons.push(reason);
        }
        self.finish(
            "finish failed",
            &self.queries.finish_failed,
            token,
            ids,
            |q| q.param("delays", delays).param("reasons", reasons),
        )
        .await
    }

    /// Mark nodes refused for good, with their reasons: the owner's dead
    /// word, or — it has none — failed, due again after `retry-cap`.
    /// Returns how many still held the lease.
    pub async fn finish_dead(
        &self,
        token: &str,
        items: Vec<(String, String)>,
    ) -> Result<u64, OutboxError> {
        let (ids, reasons): (Vec<String>, Vec<String>) = items.into_iter().unzip();
        let delays = vec![self.config.retry_cap.as_millis() as i64; ids.len()];
        self.finish("finish dead", &self.queries.finish_dead, token, ids, |q| {
            q.param("reasons", reasons).param("delays", delays)
        })
        .await
    }

    /// Extend by `lease` the leases of `ids`, claimed under `token`, that
    /// still hold it. Returns the ids whose lease was extended.
    pub async fn renew(&self, token: &str, ids: Vec<String>) -> Result<Vec<String>, OutboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let what = "renew lease";
        let tokens = vec![token.to_string(); ids.len()];
        let q = query(&self.queries.renew)
            .param("ids", ids)
            .param("tokens", tokens)
            .param("lease_ms", self.config.lease.as_millis() as i64);
        let rows = self.rows(what, q, false).await?;
        match rows.first() {
            Some(row) => row.get("kept").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            }),
            None => Ok(Vec::new()),
        }
    }

    /// Up to `limit` nodes whose status is a string but none of the
    /// configured words, reported as [`Malformed`] (never ingested).
    pub async fn sweep_unknown_statuses(&self, limit: i64) -> Result<usize, OutboxError> {
        let what = "unknown status";
        let q = query(&self.queries.unknown_status).param("limit", limit);
        let rows = self.rows(what, q, true).await?;
        for row in &rows {
            let id: Option<String> = row.get("id").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?;
            self.report(
                id.as_deref().unwrap_or("<none>"),
                "status",
                "none of the configured words: never relayed",
            );
        }
        Ok(rows.len())
    }

    /// Delete up to `limit` delivered nodes older than `older_than`.
    pub async fn purge_delivered(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, OutboxError> {
        let what = "retention";
        let q = query(&self.queries.retention)
            .param("older_ms", older_than.as_millis() as i64)
            .param("limit", limit as i64);
        let rows = self.rows(what, q, false).await?;
        let deleted: i64 = match rows.first() {
            Some(row) => row.get("deleted").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(deleted.max(0) as u64)
    }

    /// Mark dead up to `limit` waiting nodes whose event id is missing or
    /// not a string, with a reason naming the property. Returns how many.
    /// (No claim can hold such a node, so no lock-first is needed.)
    pub async fn mark_missing_ids(&self, limit: i64) -> Result<u64, OutboxError> {
        let what = "missing id";
        let reason = format!(
            "property `{}` (the event id) is missing or not a string",
            self.config.properties.event_id
        );
        let q = query(&self.queries.missing_id)
            .param("limit", limit)
            .param("reason", reason)
            .param("delay_ms", self.config.retry_cap.as_millis() as i64);
        let rows = self.rows(what, q, false).await?;
        let dead: i64 = match rows.first() {
            Some(row) => row.get("dead").map_err(|e| OutboxError::Shape {
                what,
                detail: e.to_string(),
            })?,
            None => 0,
        };
        Ok(dead.max(0) as u64)
    }

    /// Age of the oldest waiting node (by its creation time), if any.
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        let what = "oldest pending";
        let rows = self
            .rows(what, query(&self.queries.oldest_pending), true)
            .await?;
        match rows.first() {
            Some(row) => {
                let ms: i64 = row.get("age_ms").map_err(|e| OutboxError::Shape {
                    what,
                    detail: e.to_string(),
                })?;
                Ok(Some(Duration::from_millis(ms.max(0) as u64)))
            }
            None => Ok(None),
        }
    }
}
