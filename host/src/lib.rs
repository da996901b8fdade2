//! outboxd: takes events from applications, keeps each one durably, and
//! delivers it to every sink that subscribes — at least once, in order per
//! stream, with fenced leases, retries inside a retry window and dead
//! letters. Sinks are sandboxed WebAssembly components.
//!
//! Layering (data flows one way: producers → ingest → store ← delivery →
//! plugin): the ground floor ([`backoff`], [`event`], [`interpolate`],
//! [`limits`], [`redact`], [`rfc3339`]) imports nothing of ours;
//! [`broker`] (AMQP connections, shared by the plugin host and the `amqp`
//! source) imports only the ground floor; [`store`], [`plugin`] and
//! [`secrets`] (the operator's keys, sealed values) import only the ground
//! floor; [`routing`] (the route table, the destination record, its filter
//! and the snapshot routed by) sits on the store; [`delivery`] and
//! [`ingest`] sit above them, [`sources`] and [`destinations`] above
//! those; [`config`] composes the settings each room defines; [`ops`] sits
//! above them, the operator [`console`] (pages over `ops`' admin actions)
//! above it, and [`daemon`] on top. No two modules import each other (`python3
//! scripts/house.py` counts it). docs/architecture.md draws it.

#![warn(missing_docs)]

pub mod auth;
pub mod backoff;
pub mod broker;
pub mod config;
pub mod console;
pub mod daemon;
pub mod delivery;
pub mod destinations;
pub mod event;
pub mod fleet;
pub mod ingest;
pub mod interpolate;
pub mod limits;
pub mod metrics;
pub mod ops;
pub mod otel;
pub mod plugin;
pub mod redact;
pub mod rfc3339;
pub mod routing;
pub mod secrets;
pub mod sources;
pub mod store;
pub mod tls;
pub mod wakeups;
