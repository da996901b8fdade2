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

// ---- plugin host ------------------------------------------------------

// ---- ingest and sources -----------------------------------------------

// ---- operations (admin, CLI, readiness, metrics) ----------------------

/// Longest `/health`, `/ready` and `/metrics` wait for one database call
/// (or a broker probe). Kept under the 5 s probe timeout Kubernetes and
/// most load balancers use by default, so a slow database makes a probe
/// answer "not ready" rather than time out.
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
