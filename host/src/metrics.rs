//! The metric families, on the ground floor so every part may record.
//!
//! Owns: one registry per daemon with every `outboxd_*` family and the
//! OpenTelemetry messaging semantic-convention ones (documented
//! in docs/reference/metrics.md, checked by tests/integration_docs.rs),
//! and the label sets. Counters and histograms are recorded where things
//! happen; gauges of the queue are filled from the
//! store at scrape time by `ops`.
//!
//! Must never: import anything of ours (it is the ground floor), or take a
//! lock that a scrape could hold while a delivery waits.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::{Metric, Registry};

/// Every `outcome` label of `outboxd_events_ingested_total`, created at 0
/// when the registry is made so that `rate()` and alerts see the series on a
/// fresh daemon (Prometheus' instrumentation guidance: initialise the label
/// values known in advance).
pub const INGEST_OUTCOMES: [&str; 4] = ["stored", "duplicate", "conflict", "rejected"];

/// Every `outcome` label of `outboxd_deliveries_total`, created at 0 for
/// each sink loaded at start, and for a sink loaded later when its
/// delivery loop starts ([`Metrics::sink_started`]).
pub const DELIVERY_OUTCOMES: [&str; 5] = ["delivered", "retry", "dead", "lease_lost", "released"];

/// Every `fill` label of `outboxd_claims_total`: a claim that found
/// nothing due, one that came back with fewer deliveries than it asked for,
/// and one that came back full. Created at 0 with [`DELIVERY_OUTCOMES`].
pub const CLAIM_FILLS: [&str; 3] = ["empty", "short", "full"];

/// Per sink and claim fill ([`CLAIM_FILLS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkFillLabel {
    /// The sink (plugin) name.
    pub sink: String,
    /// `empty`, `short` or `full`.
    pub fill: String,
}

/// `outcome` of an ingested event: `stored`, `duplicate`, `conflict`,
/// `rejected` (bad input).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `stored` or `duplicate`.
    pub outcome: String,
}

/// Per sink.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabel {
    /// The sink (plugin) name; never a destination's.
    pub sink: String,
}

/// Per sink and outcome (`delivered`, `retry`, `dead`, `lease_lost`,
/// `released`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkOutcomeLabel {
    /// The sink (plugin) name.
    pub sink: String,
    /// `delivered`, `retry`, `dead`, `released` or `lease_lost`.
    pub outcome: String,
}

/// Per sink and delivery status (`pending`, `retrying`, `leased`, `dead`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkStatusLabel {
    /// The sink (plugin) name.
    pub sink: String,
    /// The state counted (see `store::plan::RowState`).
    pub status: String,
}

/// Per plugin and trap kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrapLabel {
    /// The plugin's name.
    pub plugin: String,
    /// The kind of trap, as the plugin host names it.
    pub kind: String,
}

/// Per plugin.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabel {
    /// The plugin's name.
    pub plugin: String,
}

/// Per configured source (`[sources.NAME]`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// The `[sources.NAME]` name.
    pub source: String,
}

/// Per source and entry outcome: `relayed` (stored as a new event),
/// `duplicate` (found again, already stored), `already_published`,
/// `malformed`, `conflict` (its event id is stored with other content, or
/// its sequence does not advance the stream).
/// The neo4j relay also counts `failed` (retried later), `dead` (refused for
/// good, reason on the node) and `lease_lost` (a finish whose lease token no
/// longer matched: nothing changed).
/// An `amqp` source's messages: `consumed`, `stored`, `duplicate`,
/// `dead_lettered`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceOutcomeLabel {
    /// The `[sources.NAME]` name.
    pub source: String,
    /// What became of the entry.
    pub outcome: String,
}

/// Per HTTP endpoint and refusal reason: which requests were refused
/// before anything of them was stored (`crate::auth::Refusal::code`:
/// `missing-token`, `invalid-token`, `scope`, `rate-limited`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// `events` (`POST /v1/events`), `awareness` (`POST /ingest`),
    /// `admin` (`/v1/admin/`) or `metrics`.
    pub endpoint: String,
    /// The stable error code the answer carried.
    pub reason: String,
}

/// Per producer (`crate::auth`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProducerLabel {
    /// The producer's name.
    pub producer: String,
}

/// The OpenTelemetry messaging semantic conventions' attributes of a
/// `messaging_*` family, as Prometheus labels (dots become underscores,
/// the OTLP-to-Prometheus naming rule). An empty value is an attribute
/// left out (Prometheus reads `error_type=""` as no label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessagingLabel {
    /// `messaging.system`: always `outboxd`, as on the spans.
    pub messaging_system: String,
    /// `messaging.operation.name`: `send` (ingest storing events),
    /// `receive` (a sink's claim) or `process` (a plugin's batch call).
    pub messaging_operation_name: String,
    /// `messaging.destination.name`: the sink; empty for `send`, whose
    /// events go to every sink their routes name.
    pub messaging_destination_name: String,
    /// `error.type`: why the operation failed (`store`, a trap kind,
    /// `init_refused`); empty when it did not.
    pub error_type: String,
}

impl MessagingLabel {
    fn new(operation: &str, destination: &str, error_type: Option<&str>) -> MessagingLabel {
        MessagingLabel {
            messaging_system: "outboxd".into(),
            messaging_operation_name: operation.into(),
            messaging_destination_name: destination.into(),
            error_type: error_type.unwrap_or_default().into(),
        }
    }
}

/// The bucket boundaries, in seconds, the messaging semantic conventions
/// advise for `messaging.client.operation.duration` and
/// `messaging.process.duration`.
const MESSAGING_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

fn messaging_histogram() -> Histogram {
    Histogram::new(MESSAGING_BUCKETS)
}

fn latency_histogram() -> Histogram {
    // 1 ms … ~9 h, ×2 per bucket.
    Histogram::new(exponential_buckets(0.001, 2.0, 25))
}

/// One registered family as a scrape names it: `outboxd_deliveries`,
/// `messaging_client_sent_messages` (a counter's samples add `_total`) and
/// its OpenMetrics type (`counter`,
/// `gauge`, `histogram`). The list is what `docs/reference/metrics.md` is
/// checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyInfo {
    /// The family's full name (`outboxd_…`, or a semantic-convention
    /// `messaging_…` one).
    pub name: String,
    /// Its OpenMetrics type.
    pub kind: &'static str,
}

/// The registry being filled, and each family put in it: an empty family
/// is left out of the exposition, so the list is kept as they are
/// registered.
struct Registering {
    registry: Registry,
    families: Vec<FamilyInfo>,
}

impl Registering {
    /// As [`Registry::register`] for an `outboxd_` family (`name` without
    /// the prefix), recording the family.
    fn register<M: Metric + TypedMetric>(&mut self, name: &str, help: &str, metric: M) {
        self.register_unprefixed(&format!("outboxd_{name}"), help, metric);
    }

    /// A family named exactly `name` (the semantic-convention ones),
    /// recorded like the others.
    fn register_unprefixed<M: Metric + TypedMetric>(&mut self, name: &str, help: &str, metric: M) {
        let kind = match M::TYPE {
            prometheus_client::metrics::MetricType::Counter => "counter",
            prometheus_client::metrics::MetricType::Gauge => "gauge",
            prometheus_client::metrics::MetricType::Histogram => "histogram",
            prometheus_client::metrics::MetricType::Info => "info",
            prometheus_client::metrics::MetricType::Unknown => "unknown",
        };
        self.families.push(FamilyInfo {
            name: name.to_string(),
            kind,
        });
        self.registry.register(name, help, metric);
    }
}

/// Every metric of the daemon.
pub struct Metrics {
    registry: Registry,
    /// Every family registered, in order.
    families: Vec<FamilyInfo>,
    /// `outboxd_events_ingested_total{outcome}`.
    pub events_ingested: Family<OutcomeLabel, Counter>,
    /// `outboxd_requests_refused_total{endpoint, reason}`: requests
    /// refused for who sent them or how much (authentication, scope, rate),
    /// nothing of them stored.
    pub requests_refused: Family<RefusalLabel, Counter>,
    /// `outboxd_producer_events_total{producer}`: events stored for each
    /// authenticated producer (duplicates not counted).
    pub producer_events: Family<ProducerLabel, Counter>,
    /// `outboxd_deliveries_total{sink, outcome}`.
    pub deliveries: Family<SinkOutcomeLabel, Counter>,
    /// Deliveries acknowledged since start, every sink together: the sum of
    /// `deliveries{outcome="delivered"}`, read by the console's rate graph
    /// (a family cannot be summed without encoding it).
    pub delivered_total: std::sync::atomic::AtomicU64,
    /// `outboxd_claims_total{sink, fill}`: claims made, by how full they
    /// came back. Many `short` claims beside a backlog mean the workers
    /// (replicas, batches in flight) outnumber the due stream heads.
    pub claims: Family<SinkFillLabel, Counter>,
    /// `outboxd_delivery_latency_seconds{sink}`: ingest commit to acknowledged.
    pub delivery_latency: Family<SinkLabel, Histogram, fn() -> Histogram>,
    /// `outboxd_attempt_duration_seconds{sink}`: one plugin call.
    pub attempt_duration: Family<SinkLabel, Histogram, fn() -> Histogram>,
    /// `outboxd_queue_depth{sink, status}`, counted at scrape up to a cap.
    pub queue_depth: Family<SinkStatusLabel, Gauge>,
    /// `outboxd_oldest_due_age_seconds{sink}`.
    pub oldest_due_age: Family<SinkLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `outboxd_leases_active`.
    pub leases_active: Gauge,
    /// `outboxd_leases_expired`: leased, but run out unfinished.
    pub leases_expired: Gauge,
    /// `outboxd_worker_heartbeat_age_seconds{sink}`.
    pub heartbeat_age: Family<SinkLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `outboxd_worker_consecutive_failures{sink}`.
    pub consecutive_failures: Family<SinkLabel, Gauge>,
    /// `outboxd_plugin_traps_total{plugin, kind}`.
    pub plugin_traps: Family<TrapLabel, Counter>,
    /// `outboxd_plugin_quarantines_total{plugin}`.
    pub plugin_quarantines: Family<PluginLabel, Counter>,
    /// `outboxd_plugin_loads_total{plugin}`.
    pub plugin_loads: Family<PluginLabel, Counter>,
    /// `outboxd_plugin_load_failures_total{plugin}`.
    pub plugin_load_failures: Family<PluginLabel, Counter>,
    /// `outboxd_plugin_pool_slots`: slots of the plugin instance pool (0:
    /// no pool, every batch instantiated on demand).
    pub plugin_pool_slots: Gauge,
    /// `outboxd_plugin_pool_instances`: batches running in a slot of the
    /// pool now; at `plugin_pool_slots`, further batches are instantiated
    /// on demand.
    pub plugin_pool_instances: Gauge,
    /// `outboxd_source_entries_total{source, outcome}`.
    pub source_entries: Family<SourceOutcomeLabel, Counter>,
    /// `outboxd_source_checkpoint_lag_seconds{source}`.
    pub source_checkpoint_lag: Family<SourceLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `outboxd_source_oldest_pending_age_seconds{source}`.
    pub source_oldest_pending_age: Family<SourceLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `outboxd_source_cycle_duration_seconds{source}`.
    pub source_cycle_duration: Family<SourceLabel, Histogram, fn() -> Histogram>,
    /// `outboxd_source_ready{source}`: 1 when the source is following.
    pub source_ready: Family<SourceLabel, Gauge>,
    /// `outboxd_source_messages_total{source, outcome}`.
    pub source_messages: Family<SourceOutcomeLabel, Counter>,
    /// `outboxd_source_unacked{source}`: messages a source holds and has
    /// not yet acknowledged (or dead-lettered).
    pub source_unacked: Family<SourceLabel, Gauge>,
    /// `outboxd_sink_serving_replicas{sink}`: replicas that reported
    /// serving a registered sink within the last 30 s (0: registered,
    /// served by no replica; its deliveries wait).
    pub sink_serving_replicas: Family<SinkLabel, Gauge>,
    /// `messaging_client_operation_duration_seconds{…}` (semantic
    /// conventions, [`MessagingLabel`]): ingest's store call (`send`) and
    /// a sink's claim (`receive`).
    pub messaging_operation_duration: Family<MessagingLabel, Histogram, fn() -> Histogram>,
    /// `messaging_process_duration_seconds{…}`: a plugin's batch call.
    pub messaging_process_duration: Family<MessagingLabel, Histogram, fn() -> Histogram>,
    /// `messaging_client_sent_messages_total{…}`: events stored by ingest
    /// (duplicates not counted).
    pub messaging_sent: Family<MessagingLabel, Counter>,
    /// `messaging_client_consumed_messages_total{…}`: deliveries claimed,
    /// by sink.
    pub messaging_consumed: Family<MessagingLabel, Counter>,
}

impl Metrics {
    /// A fresh registry with every family registered, and the series of
    /// the label values known in advance created at 0.
    pub fn new() -> Arc<Metrics> {
        let m = Metrics::unregistered();
        let mut registry = Registering {
            registry: Registry::default(),
            families: Vec::new(),
        };
        m.register_delivery(&mut registry);
        m.register_plugins(&mut registry);
        m.register_sources(&mut registry);
        m.register_messaging(&mut registry);
        let Registering { registry, families } = registry;
        for outcome in INGEST_OUTCOMES {
            drop(m.events_ingested.get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            }));
        }
        Arc::new(Metrics {
            registry,
            families,
            ..m
        })
    }

    /// Every family empty, none registered yet.
    fn unregistered() -> Metrics {
        Metrics {
            events_ingested: Family::default(),
            requests_refused: Family::default(),
            producer_events: Family::default(),
            deliveries: Family::default(),
            claims: Family::default(),
            delivery_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            attempt_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            queue_depth: Family::default(),
            oldest_due_age: Family::default(),
            leases_active: Gauge::default(),
            leases_expired: Gauge::default(),
            heartbeat_age: Family::default(),
            consecutive_failures: Family::default(),
            plugin_traps: Family::default(),
            plugin_quarantines: Family::default(),
            plugin_loads: Family::default(),
            plugin_load_failures: Family::default(),
            plugin_pool_slots: Gauge::default(),
            plugin_pool_instances: Gauge::default(),
            source_entries: Family::default(),
            source_checkpoint_lag: Family::default(),
            source_oldest_pending_age: Family::default(),
            source_cycle_duration: Family::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            ),
            source_ready: Family::default(),
            sink_serving_replicas: Family::default(),
            delivered_total: Default::default(),
            source_messages: Family::default(),
            source_unacked: Family::default(),
            messaging_operation_duration: Family::new_with_constructor(
                messaging_histogram as fn() -> Histogram,
            ),
            messaging_process_duration: Family::new_with_constructor(
                messaging_histogram as fn() -> Histogram,
            ),
            messaging_sent: Family::default(),
            messaging_consumed: Family::default(),
            registry: Registry::default(),
            families: Vec::new(),
        }
    }

    /// Ingest, delivery, queue, lease, worker and fleet families.
    fn register_delivery(&self, registry: &mut Registering) {
        registry.register(
            "events_ingested",
            "Events received by ingest, by outcome",
            self.events_ingested.clone(),
        );
        registry.register(
            "requests_refused",
            "HTTP requests refused before storing anything, by endpoint and reason",
            self.requests_refused.clone(),
        );
        registry.register(
            "producer_events",
            "Events stored for each authenticated producer",
            self.producer_events.clone(),
        );
        registry.register(
            "deliveries",
            "Delivery attempts finished, by sink and outcome",
            self.deliveries.clone(),
        );
        registry.register(
            "claims",
            "Claims of due deliveries, by sink and how full they came back",
            self.claims.clone(),
        );
        registry.register(
            "delivery_latency_seconds",
            "Time from ingest commit to delivered, by sink",
            self.delivery_latency.clone(),
        );
        registry.register(
            "attempt_duration_seconds",
            "Duration of one plugin batch call, by sink",
            self.attempt_duration.clone(),
        );
        registry.register(
            "queue_depth",
            "Live deliveries by sink and status (counted up to a cap at scrape)",
            self.queue_depth.clone(),
        );
        registry.register(
            "oldest_due_age_seconds",
            "Age of the oldest due head of a stream, by sink",
            self.oldest_due_age.clone(),
        );
        registry.register(
            "leases_active",
            "Deliveries under a live lease",
            self.leases_active.clone(),
        );
        registry.register(
            "leases_expired",
            "Deliveries whose lease expired unfinished",
            self.leases_expired.clone(),
        );
        registry.register(
            "worker_heartbeat_age_seconds",
            "Time since the delivery loop of a sink last finished a turn",
            self.heartbeat_age.clone(),
        );
        registry.register(
            "worker_consecutive_failures",
            "Delivery turns in a row that failed, by sink",
            self.consecutive_failures.clone(),
        );
        registry.register(
            "sink_serving_replicas",
            "Replicas serving a registered sink (0: its deliveries wait for one), by sink",
            self.sink_serving_replicas.clone(),
        );
    }

    /// Plugin load, trap and quarantine families.
    fn register_plugins(&self, registry: &mut Registering) {
        registry.register(
            "plugin_traps",
            "Plugin traps, by plugin and kind",
            self.plugin_traps.clone(),
        );
        registry.register(
            "plugin_quarantines",
            "Times a plugin was quarantined after consecutive traps",
            self.plugin_quarantines.clone(),
        );
        registry.register("plugin_loads", "Plugins loaded", self.plugin_loads.clone());
        registry.register(
            "plugin_load_failures",
            "Plugins refused at load or reload",
            self.plugin_load_failures.clone(),
        );
        registry.register(
            "plugin_pool_slots",
            "Slots of the plugin instance pool (0: every batch is instantiated on demand)",
            self.plugin_pool_slots.clone(),
        );
        registry.register(
            "plugin_pool_instances",
            "Plugin batches running in a slot of the instance pool now",
            self.plugin_pool_instances.clone(),
        );
    }

    /// Source (outbox relay and consumer) families.
    fn register_sources(&self, registry: &mut Registering) {
        registry.register(
            "source_entries",
            "Outbox entries a source found, by source and outcome",
            self.source_entries.clone(),
        );
        registry.register(
            "source_checkpoint_lag_seconds",
            "Time since a source's change feed was last caught up with its database",
            self.source_checkpoint_lag.clone(),
        );
        registry.register(
            "source_oldest_pending_age_seconds",
            "Age of the oldest entry still pending in a source's database, as of its last scan",
            self.source_oldest_pending_age.clone(),
        );
        registry.register(
            "source_cycle_duration_seconds",
            "Duration of one relay cycle (claim, ingest, finish), by source",
            self.source_cycle_duration.clone(),
        );
        registry.register(
            "source_ready",
            "1 when a source is ready (no error on its last run, every check ok and fresh)",
            self.source_ready.clone(),
        );
        registry.register(
            "source_messages",
            "Messages taken by a source, by source and outcome (consumed, stored, duplicate, dead_lettered)",
            self.source_messages.clone(),
        );
        registry.register(
            "source_unacked",
            "Messages a source holds and has not yet acknowledged, by source",
            self.source_unacked.clone(),
        );
    }

    /// The OpenTelemetry messaging semantic-convention families, beside
    /// the `outboxd_*` ones and without their prefix, named as an OTLP
    /// collector's Prometheus exporter names them.
    fn register_messaging(&self, registry: &mut Registering) {
        registry.register_unprefixed(
            "messaging_client_operation_duration_seconds",
            "Duration of a messaging operation: ingest storing events (send), a sink's claim (receive)",
            self.messaging_operation_duration.clone(),
        );
        registry.register_unprefixed(
            "messaging_process_duration_seconds",
            "Duration of a plugin's batch call (process), by sink",
            self.messaging_process_duration.clone(),
        );
        registry.register_unprefixed(
            "messaging_client_sent_messages",
            "Events stored by ingest",
            self.messaging_sent.clone(),
        );
        registry.register_unprefixed(
            "messaging_client_consumed_messages",
            "Deliveries claimed, by sink",
            self.messaging_consumed.clone(),
        );
    }

    /// Record ingest's store call of `seconds`: failed (`error.type`
    /// `store`) or storing `stored` new events.
    pub fn sent(&self, seconds: f64, failed: bool, stored: u64) {
        let label = MessagingLabel::new("send", "", failed.then_some("store"));
        self.messaging_operation_duration
            .get_or_create(&label)
            .observe(seconds);
        if stored > 0 {
            self.messaging_sent.get_or_create(&label).inc_by(stored);
        }
    }

    /// Record `sink`'s claim of `seconds` that returned `claimed`
    /// deliveries.
    pub fn received(&self, sink: &str, seconds: f64, claimed: usize) {
        let label = MessagingLabel::new("receive", sink, None);
        self.messaging_operation_duration
            .get_or_create(&label)
            .observe(seconds);
        if claimed > 0 {
            self.messaging_consumed
                .get_or_create(&label)
                .inc_by(claimed as u64);
        }
    }

    /// Record `sink`'s plugin batch call of `seconds`, failed as a whole
    /// with `error_type` or not.
    pub fn processed(&self, sink: &str, seconds: f64, error_type: Option<&str>) {
        self.messaging_process_duration
            .get_or_create(&MessagingLabel::new("process", sink, error_type))
            .observe(seconds);
    }

    /// Every family registered, each once, whether or not it has a series
    /// yet (the text format leaves out a family with none).
    pub fn families(&self) -> &[FamilyInfo] {
        &self.families
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }

    /// Create `sink`'s series of `outboxd_deliveries_total` at 0, one per
    /// [`DELIVERY_OUTCOMES`] label (a series already counting is kept).
    pub fn sink_started(&self, sink: &str) {
        for outcome in DELIVERY_OUTCOMES {
            drop(self.deliveries.get_or_create(&SinkOutcomeLabel {
                sink: sink.to_string(),
                outcome: outcome.to_string(),
            }));
        }
        for fill in CLAIM_FILLS {
            drop(self.claims.get_or_create(&SinkFillLabel {
                sink: sink.to_string(),
                fill: fill.to_string(),
            }));
        }
    }

    /// Count one claim of `sink` that asked for `limit` deliveries and got
    /// `got`.
    pub fn claimed(&self, sink: &str, got: usize, limit: u32) {
        let fill = match got {
            0 => "empty",
            n if n < limit as usize => "short",
            _ => "full",
        };
        self.claims
            .get_or_create(&SinkFillLabel {
                sink: sink.to_string(),
                fill: fill.to_string(),
            })
            .inc();
    }

    /// Count one request to `endpoint` refused with `reason` (see
    /// [`RefusalLabel`]).
    pub fn refused(&self, endpoint: &str, reason: &str) {
        self.requests_refused
            .get_or_create(&RefusalLabel {
                endpoint: endpoint.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Count an ingest outcome `n` times.
    pub fn ingested(&self, outcome: &str, n: u64) {
        self.events_ingested
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc_by(n);
    }

    /// Count `n` entries of `source` with `outcome` (see
    /// [`SourceOutcomeLabel`]).
    pub fn source_entries(&self, source: &str, outcome: &str, n: u64) {
        if n == 0 {
            return;
        }
        self.source_entries
            .get_or_create(&SourceOutcomeLabel {
                source: source.to_string(),
                outcome: outcome.to_string(),
            })
            .inc_by(n);
    }

    /// Count `n` messages of `source` with `outcome`.
    pub fn source_message(&self, source: &str, outcome: &str, n: u64) {
        if n == 0 {
            return;
        }
        self.source_messages
            .get_or_create(&SourceOutcomeLabel {
                source: source.to_string(),
                outcome: outcome.to_string(),
            })
            .inc_by(n);
    }

    /// Count a delivery outcome for `sink`.
    pub fn delivery(&self, sink: &str, outcome: &str) {
        if outcome == "delivered" {
            self.delivered_total
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.deliveries
            .get_or_create(&SinkOutcomeLabel {
                sink: sink.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }
}
