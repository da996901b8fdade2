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

/// How long a stream's head must be seen left behind, locked, by claim
/// after claim before `/ready` names it (PostgreSQL): far longer than the
/// milliseconds another worker's claim holds a head, so only a lock that
/// stays (a transaction left idle) is reported.
pub const LOCKED_HEAD_CONFIRM: Duration = Duration::from_secs(2);

// ---- plugin host ------------------------------------------------------

// ---- ingest and sources -----------------------------------------------

// ---- operations (admin, CLI, readiness, metrics) ----------------------

/// Kept so the `Duration` import is used while sections are empty.
const _DURATION: Duration = Duration::ZERO;
