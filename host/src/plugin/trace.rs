//! The `trace` interface of the `outboxd:sink` world (since 0.1.1;
//! `traceparents`, the whole batch's in one call, since 0.1.5): the
//! trace context of each attempt of a batch, handed to the plugin that
//! asks for it, and the tracer its outbound requests' spans are made with.
//!
//! Owns: [`BatchTrace`], built by the delivery turn for one batch. Must
//! never: make a span itself (the attempt's is the turn's, the outbound
//! request's is `egress::hooks`'), or answer for an event of another batch.

use std::collections::HashMap;
use std::sync::Arc;

use crate::otel::Telemetry;

/// The trace contexts of one batch's attempts.
#[derive(Debug, Clone, Default)]
pub struct BatchTrace {
    /// The daemon's tracer (off: no outbound request gets a span).
    pub telemetry: Telemetry,
    /// Event id → the `traceparent` its attempt propagates: the attempt
    /// span's, or with tracing off the event's creation context. Shared:
    /// a batch that tries the instance pool first hands it to two stores.
    pub contexts: Arc<HashMap<String, String>>,
}

impl BatchTrace {
    /// The `traceparent` of the attempt delivering `event_id`.
    pub fn traceparent(&self, event_id: &str) -> Option<String> {
        self.contexts.get(event_id).cloned()
    }

    /// Every attempt's `traceparent`, as (event id, `traceparent`) pairs
    /// in no particular order (`trace.traceparents`, since 0.1.5).
    pub fn traceparents(&self) -> Vec<(String, String)> {
        self.contexts
            .iter()
            .map(|(id, context)| (id.clone(), context.clone()))
            .collect()
    }
}
