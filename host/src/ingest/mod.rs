//! Ingest: events in from producers.
//!
//! Owns: the HTTP ingest and read API ([`http`]) and routing ([`routes`]).
//! The acknowledgement is sent only after the store committed.
//!
//! Must never: acknowledge before commit, store part of a refused request,
//! or answer bad input with a 5xx.

pub mod http;
pub mod routes;
