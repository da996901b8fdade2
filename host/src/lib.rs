//! outboxd: takes events from applications, keeps each one durably, and
//! delivers it to every sink that subscribes — at least once, in order per
//! stream, with fenced leases, retries inside a retry window and dead
//! letters. Sinks are sandboxed WebAssembly components.
//!
//! Layering (data flows one way: producers → ingest → store ← delivery →
//! plugin): the ground floor ([`config`], [`event`], [`limits`], [`redact`]) imports
//! nothing of ours; [`store`] and [`plugin`] import only the ground floor; [`delivery`]
//! and [`ingest`] sit above them; [`ops`] and [`daemon`] sit on top.

pub mod config;
pub mod daemon;
pub mod delivery;
pub mod destinations;
pub mod event;
pub mod fleet;
pub mod ingest;
pub mod limits;
pub mod metrics;
pub mod ops;
pub mod plugin;
pub mod redact;
pub mod sources;
pub mod store;
pub mod wakeups;
