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

/// Time kept back from a batch's deadline when the host waits on a broker's
/// confirms or on an HTTP response for the guest, so the guest still gets
/// the answer (or the failure) and turns it into outcomes before it is
/// interrupted; the webhook sink needs well under 10 ms for that.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

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

// ---- ingest and sources -----------------------------------------------

// ---- operations (admin, CLI, readiness, metrics) ----------------------
