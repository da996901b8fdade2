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

/// Kept so the `Duration` import is used while sections are empty.
const _DURATION: Duration = Duration::ZERO;
