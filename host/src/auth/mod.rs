//! Producer authentication: who may post events over HTTP, which events,
//! and how fast.
//!
//! A producer is a named caller with its own bearer token (`obx_…`,
//! [`token`]), stored only as a digest, optionally scoped to `source`
//! prefixes, types and streams ([`producer::Scope`]) and limited in events
//! and bytes per second. Every HTTP ingest request passes the [`gate`]
//! before anything of it is stored, and the producer's name is stored
//! with each event it posts.
//!
//! Owns: tokens, the stored producer record, the gate and its refusals,
//! the `[producers]` settings. The admin actions that create, list,
//! revoke and rotate producers are `crate::ops::producers`.
//!
//! Must never: keep or log a token; answer a refusal in a way that says
//! which part of a token was wrong; let anything through when the
//! producers cannot be read.

pub mod gate;
pub mod producer;
pub mod settings;
pub mod token;

pub use gate::{Gate, Principal, Refusal};
pub use producer::{Producer, Scope};
pub use settings::{ProducerAuth, ProducersConfig};
