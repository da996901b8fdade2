//! Traces: one trace from the producer to the receiver, across the wait
//! in the outbox (OpenTelemetry, exported over OTLP).
//!
//! Owns: the W3C context as events carry it ([`context`]), the `[otel]`
//! settings ([`settings`]), the exporter ([`export`]), and [`Telemetry`],
//! the one handle through which every room makes its spans, named and
//! attributed by the OpenTelemetry messaging semantic conventions
//! (`messaging.system`, `messaging.operation.type`,
//! `messaging.destination.name`, ...):
//!
//! | span | kind | parent | links |
//! | --- | --- | --- | --- |
//! | `send outboxd` (an ingest request) | PRODUCER | the request's `traceparent`, else a lone event's own context | each event's own context |
//! | `claim {destination}` | INTERNAL | none | |
//! | `process {destination}` (one event's attempt) | CONSUMER | the event's creation context | the same context |
//! | `finish {destination}` | INTERNAL | none | each attempt of the batch |
//! | `POST` (a plugin's outbound request) | CLIENT | the attempt (the `traceparent` the plugin set) | |
//!
//! An attempt is parented by the event's creation context, so the
//! receiver's trace id is the producer's; it also links it, as the
//! conventions ask of a consumer.
//!
//! Off (the default), [`Telemetry`] holds nothing: every span method
//! answers `None` before looking at its arguments, nothing is exported and
//! no task runs. Must never: change an event's stored context, hold up a
//! delivery or an ingest on an export, or let a span outlive what it
//! measures by more than a drop.

pub mod context;
pub mod export;
pub mod settings;

use std::sync::Arc;

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use context::TraceContext;
pub use settings::OtelConfig;

/// `messaging.system` of every span: outboxd is the messaging system.
pub const MESSAGING_SYSTEM: &str = "outboxd";

/// The daemon's tracer: off, or a provider exporting over OTLP. Cheap to
/// clone (an `Arc`).
#[derive(Clone, Default)]
pub struct Telemetry {
    on: Option<Arc<On>>,
}

struct On {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Drop for On {
    /// The SDK flushes on the last drop of its provider by blocking on the
    /// processor's task, which runs on this runtime: from a runtime thread
    /// (a current-thread runtime above all) that would wait forever, so the
    /// flush runs on a blocking thread. Outside a runtime the task is gone
    /// and the flush returns at once.
    fn drop(&mut self) {
        let provider = self.provider.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || provider.shutdown());
            }
            Err(_) => {
                let _ = provider.shutdown();
            }
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.on.is_some() {
            "Telemetry(on)"
        } else {
            "Telemetry(off)"
        })
    }
}

impl Telemetry {
    /// No spans, no exporter.
    pub fn off() -> Telemetry {
        Telemetry { on: None }
    }

    /// Start from `config` and the process's `OTEL_*` variables
    /// ([`export::Resolved`]): off unless enabled. An `https://` collector
    /// is trusted as `tls` says (the webpki roots and `egress.ca-file`,
    /// [`crate::plugin::egress::client_tls`]). Must be called inside the
    /// daemon's Tokio runtime.
    pub fn start(
        config: &OtelConfig,
        tls: &rustls::ClientConfig,
    ) -> Result<Telemetry, export::ExportError> {
        let resolved = export::Resolved::new(config, |name| std::env::var(name).ok())?;
        if !resolved.enabled {
            return Ok(Telemetry::off());
        }
        let provider = export::start(config, &resolved, tls)?;
        tracing::info!(
            endpoint = %crate::redact::redact_url(&resolved.endpoint),
            protocol = ?resolved.protocol,
            sampling_ratio = resolved.ratio,
            "exporting traces over OTLP"
        );
        let tracer = provider.tracer("outboxd");
        Ok(Telemetry {
            on: Some(Arc::new(On { provider, tracer })),
        })
    }

    /// Whether spans are made.
    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// Export what is queued and stop the exporter (at shutdown).
    pub async fn shutdown(&self) {
        if let Some(on) = &self.on {
            let provider = on.provider.clone();
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }

    /// The span of one ingest request at `endpoint` (`/v1/events`,
    /// `/ingest`, `source:NAME`) carrying `events` (id and own context):
    /// a child of the transport's context, linked to each event's.
    pub fn ingest(
        &self,
        endpoint: &str,
        transport: Option<&TraceContext>,
        events: &[(&str, Option<TraceContext>)],
    ) -> Option<SpanHandle> {
        let on = self.on.as_ref()?;
        let mut attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "send"),
            KeyValue::new("outboxd.ingest.endpoint", endpoint.to_string()),
            KeyValue::new("messaging.batch.message_count", events.len() as i64),
        ];
        if let [(id, _)] = events {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        let links = events
            .iter()
            .filter_map(|(_, c)| c.as_ref()?.span_context())
            .filter(|c| transport.and_then(TraceContext::span_context).as_ref() != Some(c))
            .map(Link::with_context)
            .collect();
        // Without a transport context, a lone event's own context is the
        // request's parent (a message from a broker, a structured event).
        let parent = match (transport, events) {
            (Some(t), _) => remote_parent(Some(t)),
            (None, [(_, own)]) => remote_parent(own.as_ref()),
            (None, _) => Context::new(),
        };
        Some(on.start(
            "send outboxd",
            SpanKind::Producer,
            attributes,
            links,
            &parent,
        ))
    }

    /// The span of one event's attempt at `destination`: a CONSUMER
    /// `process {destination}` span, child of and linked to the event's
    /// creation context.
    pub fn attempt(
        &self,
        destination: &str,
        event_id: &str,
        creation: Option<&TraceContext>,
        attempt: u32,
        batch_count: usize,
    ) -> Option<SpanHandle> {
        let on = self.on.as_ref()?;
        let attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", destination.to_string()),
            KeyValue::new("messaging.message.id", event_id.to_string()),
            KeyValue::new("messaging.batch.message_count", batch_count as i64),
            KeyValue::new("outboxd.attempt", attempt as i64),
        ];
        let links = creation
            .and_then(TraceContext::span_context)
            .map(|c| vec![Link::with_context(c)])
            .unwrap_or_default();
        let parent = remote_parent(creation);
        Some(on.start(
            &format!("process {destination}"),
            SpanKind::Consumer,
            attributes,
            links,
            &parent,
        ))
    }

    /// The span of a database call of a delivery turn: `claim` (the
    /// conventions' `receive`) or `finish` (`settle`) of `count` events at
    /// `destination`, linked to `links` (the batch's attempts).
    /// `started`, when given, is when the call began (a claim's span is
    /// made only once it returned events, so an idle poll makes none).
    pub fn turn_call(
        &self,
        call: TurnCall,
        destination: &str,
        count: usize,
        links: &[TraceContext],
        started: Option<std::time::SystemTime>,
    ) -> Option<SpanHandle> {
        let on = self.on.as_ref()?;
        let (name, operation) = match call {
            TurnCall::Claim => ("claim", "receive"),
            TurnCall::Finish => ("finish", "settle"),
        };
        let attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", operation),
            KeyValue::new("messaging.operation.name", name),
            KeyValue::new("messaging.destination.name", destination.to_string()),
            KeyValue::new("messaging.batch.message_count", count as i64),
        ];
        let links = links
            .iter()
            .filter_map(TraceContext::span_context)
            .map(Link::with_context)
            .collect();
        Some(on.start_at(
            &format!("{name} {destination}"),
            SpanKind::Internal,
            attributes,
            links,
            &Context::new(),
            started,
        ))
    }

    /// The CLIENT span of a plugin's outbound HTTP request, a child of
    /// `parent` (the attempt's context, as the plugin sent it).
    pub fn http_client(
        &self,
        plugin: &str,
        method: &str,
        url: &str,
        parent: &TraceContext,
    ) -> Option<SpanHandle> {
        let on = self.on.as_ref()?;
        let attributes = vec![
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("url.full", crate::redact::redact_url(url)),
            KeyValue::new("outboxd.plugin", plugin.to_string()),
        ];
        Some(on.start(
            method,
            SpanKind::Client,
            attributes,
            Vec::new(),
            &remote_parent(Some(parent)),
        ))
    }
}

/// A database call of a delivery turn that gets a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnCall {
    /// Taking the batch's leases.
    Claim,
    /// Recording the batch's outcomes.
    Finish,
}

impl On {
    fn start(
        &self,
        name: &str,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        links: Vec<Link>,
        parent: &Context,
    ) -> SpanHandle {
        self.start_at(name, kind, attributes, links, parent, None)
    }

    fn start_at(
        &self,
        name: &str,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        links: Vec<Link>,
        parent: &Context,
        started: Option<std::time::SystemTime>,
    ) -> SpanHandle {
        let mut builder = self
            .tracer
            .span_builder(name.to_string())
            .with_kind(kind)
            .with_attributes(attributes)
            .with_links(links);
        if let Some(started) = started {
            builder = builder.with_start_time(started);
        }
        SpanHandle {
            span: builder.start_with_context(&self.tracer, parent),
        }
    }
}

fn remote_parent(context: Option<&TraceContext>) -> Context {
    match context.and_then(TraceContext::span_context) {
        Some(c) => Context::new().with_remote_span_context(c),
        None => Context::new(),
    }
}

/// A started span; it ends when dropped (or at [`SpanHandle::end`]).
pub struct SpanHandle {
    span: opentelemetry_sdk::trace::Span,
}

impl SpanHandle {
    /// The span's own context, to propagate (`traceparent`).
    pub fn context(&self) -> TraceContext {
        TraceContext::of_span(self.span.span_context())
    }

    /// The span's context as OpenTelemetry has it.
    pub fn span_context(&self) -> SpanContext {
        self.span.span_context().clone()
    }

    /// Set one attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.span.set_attribute(KeyValue::new(key, value));
    }

    /// Mark the span failed: `error.type` and an error status with
    /// `message`.
    pub fn fail(&mut self, error_type: &str, message: &str) {
        self.span
            .set_attribute(KeyValue::new("error.type", error_type.to_string()));
        self.span.set_status(Status::error(message.to_string()));
    }

    /// End the span now.
    pub fn end(mut self) {
        self.span.end();
    }
}
