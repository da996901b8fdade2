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

/// The budget of each query of a readiness probe or an admin view of the
/// queues (`/ready`, `GET /v1/admin/sinks`): a huge backlog must make a
/// probe answer late with figures marked capped, never hang it.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Kept so the `Duration` import is used while sections are empty.
const _DURATION: Duration = Duration::ZERO;
