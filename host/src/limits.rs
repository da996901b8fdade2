//! The fixed limits (not configuration keys) of the store's connections,
//! the plugin host's sandbox and HTTP/AMQP clients, and the operator
//! surfaces (admin API, CLI, probes): durations, counts and sizes, each
//! typed and documented here with the reason for its value (a spec, a
//! measured figure in docs/measurements.md, or the configuration key it is
//! tied to), and the defaults of manifest keys.
//!
//! Not every internal limit is here. One that bounds a single mechanism
//! stays a documented constant beside the code it bounds, where its reader
//! needs it: the delivery loop's failure backoff and pause re-check
//! (`delivery::sink_loop`), the finish retries (`delivery::turn`), the
//! longest quarantine (`delivery::quarantine`), the sources' restart and
//! ingest backoffs and their protocol bounds (`sources::*`), guest text and
//! log budgets (`plugin::guest_text`, `plugin::log_limit`), the
//! CloudEvents sizes (`event`) and a few in the store's backends.
//! `grep -rn "const [A-Z_]*: \(Duration\|u32\|u64\|usize\)" host/src`
//! lists them all.
//!
//! Owns: named constants only. Must never: read configuration, hold state,
//! or import anything of ours — it is on the ground floor, so every room
//! may use it.

use std::time::Duration;

// ---- store ------------------------------------------------------------

/// The server-side limit on any one PostgreSQL statement when no
/// `delivery.db-timeout` is given (the CLI's own connections): that key's
/// default, so no statement outlives the call that waits for it.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a free PostgreSQL connection (pool of
/// [`PG_POOL_SIZE`]) before a call fails as a database error.
pub const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections in the PostgreSQL pool of one process: two per core of the
/// machines measured (docs/measurements.md) plus the listener and probes'
/// headroom.
pub const PG_POOL_SIZE: u32 = 16;

/// Connections of the pool the delivery loops' claims, finishes and
/// due-time queries may hold at once; the other
/// `PG_POOL_SIZE − PG_DELIVERY_CONNECTIONS` stay free for ingest, probes,
/// sources and the admin API. Without the cap, 1,000 busy destinations'
/// loops (one claim or finish each in the pool's queue) kept an ingest
/// waiting past [`PG_ACQUIRE_TIMEOUT`] (`destinations_bench`, fan-out to
/// 1,000, 2026-12-02); two per core of the machines measured still feed
/// the loops.
pub const PG_DELIVERY_CONNECTIONS: usize = 12;

/// How long an SQLite statement waits for a lock held by another
/// connection of the file (the readers against the one writer) before it
/// fails as busy.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for the one SQLite writer connection: a burst of ingest
/// requests queues behind it for at most this long, then answers 503.
pub const SQLITE_WRITER_WAIT: Duration = Duration::from_secs(30);

/// Reader connections of the SQLite file (WAL: readers never block the
/// writer).
pub const SQLITE_READERS: u32 = 4;

/// First and longest wait before the PostgreSQL wake-up listener
/// (`LISTEN`) reconnects, doubling in between. A lost wake-up only delays
/// (every loop still polls).
pub const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(100);
/// See [`LISTEN_RETRY_FIRST`].
pub const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// How long a stream's head must be seen left behind, locked, by claim
/// after claim before `/ready` names it (PostgreSQL): far longer than the
/// milliseconds another worker's claim holds a head, so only a lock that
/// stays (a transaction left idle) is reported.
pub const LOCKED_HEAD_CONFIRM: Duration = Duration::from_secs(2);

/// How often, at most, a sink's claims look for a head left behind locked
/// (one indexed `LIMIT 1` query): often enough to confirm one within
/// [`LOCKED_HEAD_CONFIRM`], rare enough that a loop whose claims come back
/// short (most claims at a low rate) does not pay a second query each.
pub const LOCKED_HEAD_LOOK_EVERY: Duration = Duration::from_millis(500);

// ---- plugin host ------------------------------------------------------

/// Time kept back from a batch's deadline when the host waits on a broker's
/// confirms or on an HTTP response for the guest, so the guest still gets
/// the answer (or the failure) and turns it into outcomes before it is
/// interrupted; the webhook sink needs well under 10 ms for that.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Default of manifest `limits.deadline`: the wall-clock time of one batch
/// (instantiate, `init`, `deliver`). Room for a slow receiver within one
/// batch, while `delivery.lease`, which must be at least 2 × this + 5 s
/// (docs/plugins.md), stays about a minute.
pub const DEFAULT_BATCH_DEADLINE: Duration = Duration::from_secs(30);

/// Default of manifest `retry.base`: the delay after a first failure,
/// long enough for a receiver's momentary hiccup to pass.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(1);

/// Default of manifest `retry.cap`: the longest delay between two
/// attempts, so a receiver back from an outage is tried again within
/// 10 minutes.
pub const DEFAULT_RETRY_CAP: Duration = Duration::from_secs(600);

/// Default of manifest `retry.window`: how long retries go on before a
/// delivery is dead-lettered; a day covers an outage over a night.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Default of manifest `limits.first-byte-timeout`: the longest a plugin's
/// HTTP request waits for the first byte of its response. The value the
/// host had as a fixed ceiling before it was configurable; a receiver that
/// takes longer than this to begin answering is treated as down.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of manifest `limits.between-bytes-timeout`: the longest silence
/// between two bytes of a response once it has begun (head or body). A
/// healthy receiver on a slow link still sends a TCP segment within a few
/// round trips; 10 s of nothing is a stalled peer.
pub const BETWEEN_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a TCP connect of a plugin's HTTP request may take (each
/// resolved address), whatever the guest asks: a SYN retransmitted three
/// times (1 s, 2 s, 4 s under Linux's defaults) and answered.
pub const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a plugin's HTTP connection may sit idle in its client's pool
/// before it is closed: long enough to carry a keep-alive connection from
/// one batch to the next under a steady load (batches start every poll
/// interval, 1 s at most by default), short enough not to hold sockets a
/// receiver has long forgotten (most servers close idle ones at 60 s).
pub const HTTP_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest the host reads the request body of a refused request, so the
/// guest's body write completes and it sees the refusal on the response;
/// a guest streaming a body slower than this sees a write error instead.
pub const REFUSED_BODY_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait for a new broker connection: TCP, TLS and the AMQP
/// handshake (a broker on the same network answers within milliseconds; a
/// batch must not spend its deadline on one that does not).
pub const AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Wait before the second attempt to connect to a broker after a failure;
/// it doubles with each further failure, up to
/// [`AMQP_RECONNECT_BACKOFF_MAX`]. The first attempt after a lost
/// connection is immediate.
pub const AMQP_RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(200);

/// Longest wait between two attempts to connect to a broker: a broker back
/// from a restart is in use again within this.
pub const AMQP_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Longest a `publish-batch` waits for its confirms when the caller has no
/// batch deadline of its own (the default batch deadline).
pub const AMQP_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the engine's epoch ticks; a guest's deadline is checked, and
/// a spinning guest gives its thread back, at this grain (10 ms: well under
/// any deadline, and the ticker costs nothing measurable).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Quiet time after the last change in the plugins directory before a
/// rescan: copying a component is many writes, and one rescan after the
/// last is enough.
pub const PLUGIN_RESCAN_DEBOUNCE: Duration = Duration::from_millis(300);

/// Shortest time between two summary lines of a plugin's dropped log lines.
pub const LOG_SUMMARY_EVERY: Duration = Duration::from_secs(1);

/// Most live host resources (HTTP requests, bodies, pollables, ...) per
/// batch; the webhook sink at 32 requests in flight holds about 300.
pub const MAX_RESOURCES: usize = 10_000;

/// Most bytes one `wasi:random` call may ask for.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// Most table elements per table (guards host memory).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Most instances, memories and tables per store (a component
/// instantiates a few core modules).
pub const MAX_INSTANCES: usize = 100;

// ---- operations (admin, CLI, readiness, metrics) ----------------------

/// Longest `/health`, `/ready` and `/metrics` wait for one database call
/// (or a broker probe). Kept under the 5 s probe timeout Kubernetes and
/// most load balancers use by default, so a slow database makes a probe
/// answer "not ready" rather than time out. The store bounds each query
/// of its queue figures by it too (PostgreSQL `SET LOCAL
/// statement_timeout`), so a huge backlog makes them late, never hung.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest the CLI waits for the running daemon on a read or a plain
/// change (`sinks list`, `sources list`, a destination pause): an answer
/// served from memory on loopback takes milliseconds; more means no daemon
/// is there to ask.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest the CLI waits for the daemon on an action that may scan the
/// event table (`backfill`, a destination create with `--backfill-since`):
/// a backfill pages through every past event (500 a page), far longer than
/// a read; two minutes still ends a CLI that waits on a stalled daemon.
pub const ADMIN_WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// Dead letters `GET /v1/admin/dead` and `outboxd dead list` show when no
/// `limit` is given: a screenful to read, newest first.
pub const DEAD_LIST_DEFAULT: u32 = 100;

/// Most dead letters one admin request lists, replays or purges (and the
/// default of replay and purge): bounds the rows one statement touches so
/// a large dead-letter table is worked through in steps, not one long
/// transaction. A larger `limit` is refused, naming the cap.
pub const DEAD_PAGE_MAX: u32 = 10_000;

/// Failed attempts kept per delivery (the newest; the store drops older
/// ones in the transaction that records a new one). With the default
/// retry policy (1 s base, doubling, capped at 10 min with equal jitter, a
/// 24 h window) a delivery that never succeeds fails about 200 times; the
/// newest 50 rows hold its last six hours or so, while the delivery's
/// own row keeps the full count (`attempts`). Bounds the `attempts` table
/// at 50 rows per failing delivery however long it retries.
pub const ATTEMPTS_KEPT: u32 = 50;

/// Failed attempts `GET /v1/admin/attempts`, `outboxd attempts list` and
/// the console's attempts page show when no `limit` is given: a screenful,
/// newest first.
pub const ATTEMPTS_LIST_DEFAULT: u32 = 100;

/// Most failed attempts one admin request lists: a page an operator reads,
/// bounded so one request never walks the whole table. A larger `limit`
/// is refused, naming the cap.
pub const ATTEMPTS_PAGE_MAX: u32 = 1_000;
