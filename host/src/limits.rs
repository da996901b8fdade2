//! Every internal limit of the daemon that is not a configuration key: the
//! fixed durations, counts and sizes the code is built around, each typed
//! and documented here with the reason for its value (a spec, a measured
//! figure in docs/measurements.md, or the configuration key it is tied to).
//!
//! Owns: named constants only. Must never: read configuration, hold state,
//! or import anything of ours — it is on the ground floor beside
//! [`crate::config`], so every room may use it.
#![allow(dead_code)]

use std::time::Duration;

// ---- delivery ---------------------------------------------------------

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

// ---- plugin host ------------------------------------------------------

// ---- ingest and sources -----------------------------------------------

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
