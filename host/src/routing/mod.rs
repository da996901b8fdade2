//! Routing: which delivery keys an event gets a delivery for, and the
//! model that decides it.
//!
//! Owns: the route table ([`routes`]: configured routes, the sinks seen,
//! the fleet's registry, expansion into destinations, backfill by the same
//! rule), its settings ([`settings`]: `[[routes]]`), the destination record
//! with its [`Filter`] ([`filter`]) and the [`Snapshot`] of destinations
//! every replica routes by ([`destination`]).
//!
//! Sits below ingest, sources, delivery and destinations, which import it;
//! it imports only the ground floor and the store (backfill pages).
//! Keeping the snapshot fresh is `crate::destinations::live`'s; managing
//! destinations is `crate::destinations`'.
//!
//! Must never: import the rooms above it, or look at anything but an
//! event's attributes (routing is decided once, at ingest, as input of the
//! ingest transaction).

pub mod destination;
pub mod filter;
pub mod routes;
pub mod settings;

pub use destination::{Destination, RetryOverride, Snapshot, State};
pub use filter::Filter;
pub use routes::{backfill, Router, UnknownSink};
pub use settings::Route;
