//! One trace from the producer to the receiver: a producer's W3C trace
//! context goes in with the event (HTTP headers, `outboxd.enqueue` in an
//! application's transaction, a RabbitMQ message's headers), waits in the
//! store, and comes out in the webhook's `traceparent`; the spans outboxd
//! exports over OTLP/HTTP (and gRPC) form producer → ingest → attempt(s) →
//! HTTP client.
//!
//! The collector is a real HTTP server on loopback decoding the real OTLP
//! protobuf (`opentelemetry-proto`), or tonic's gRPC server for the same
//! service; the receivers are real HTTP servers;
//! PostgreSQL and RabbitMQ are the local ones (scripts/setup.sh).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use outboxd::config::Config;
use prost::Message as _;
use serde_json::json;

const T: Duration = Duration::from_secs(20);

/// One exported span, as the collector decoded it (ids as lower hex).
#[derive(Debug, Clone)]
struct Span {
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: BTreeMap<String, String>,
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
    /// `STATUS_CODE_ERROR` = 2.
    status_code: i32,
}

/// OTLP span kinds (trace.proto `SpanKind`).
const KIND_INTERNAL: i32 = 1;
const KIND_PRODUCER: i32 = 4;
const KIND_CONSUMER: i32 = 5;
const KIND_CLIENT: i32 = 3;

/// A test OTLP/HTTP collector: `POST /v1/traces` with
/// `application/x-protobuf` bodies, every span kept.
#[derive(Clone)]
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Collector { addr, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    fn named(&self, name: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }
}

async fn export(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> impl IntoResponse {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    keep(&spans, request);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([("content-type", "application/x-protobuf")], answer)
}

/// The same collector over OTLP/gRPC: tonic's server for the
/// `TraceService` that `opentelemetry-proto` generates.
struct GrpcTraces(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for GrpcTraces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// A collector answering OTLP over gRPC on a loopback port.
    async fn start_grpc() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(GrpcTraces(spans.clone()));
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap()
        });
        Collector { addr, spans }
    }
}

/// Decode `request`'s spans into `spans`.
fn keep(spans: &Mutex<Vec<Span>>, request: ExportTraceServiceRequest) {
    let mut seen = spans.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for s in scope.spans {
                let attributes = s
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(AnyValue::StringValue(v)) => v.clone(),
                            Some(AnyValue::IntValue(v)) => v.to_string(),
                            Some(AnyValue::BoolValue(v)) => v.to_string(),
                            Some(AnyValue::DoubleValue(v)) => v.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), value)
                    })
                    .collect();
                seen.push(Span {
                    name: s.name,
                    kind: s.kind,
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_span_id: hex::encode(&s.parent_span_id),
                    attributes,
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                    status_code: s.status.map(|st| st.code).unwrap_or(0),
                });
            }
        }
    }
}

/// A producer's trace: a new trace id and the producer span's id.
fn producer_context() -> (String, String, String) {
    let trace = hex::encode(rand::random::<[u8; 16]>());
    let span = hex::encode(rand::random::<[u8; 8]>());
    let traceparent = format!("00-{trace}-{span}-01");
    (trace, span, traceparent)
}

/// `traceparent`'s trace id and parent id.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_string(), parts[2].to_string())
}

/// Export traces to `collector` every 100 ms.
fn traced(collector: &Collector) -> impl FnOnce(&mut Config) + 'static {
    let endpoint = collector.endpoint();
    move |c: &mut Config| {
        c.otel.enabled = true;
        c.otel.endpoint = Some(endpoint);
        c.otel.export_interval = Duration::from_millis(100);
    }
}

/// The chain an attempt of event `id` at `sink` must show: a CONSUMER
/// `process {sink}` span in the producer's trace, child of and linked to
/// the producer span, with the messaging attributes; returns the attempts
/// by attempt number.
fn attempts(collector: &Collector, sink: &str, id: &str, trace: &str, producer: &str) -> Vec<Span> {
    let mut attempts: Vec<Span> = collector
        .named(&format!("process {sink}"))
        .into_iter()
        .filter(|s| s.attributes.get("messaging.message.id").map(String::as_str) == Some(id))
        .collect();
    attempts.sort_by_key(|s| s.attributes["outboxd.attempt"].parse::<u32>().unwrap());
    for a in &attempts {
        assert_eq!(a.kind, KIND_CONSUMER, "{a:?}");
        assert_eq!(a.trace_id, trace, "{a:?}");
        assert_eq!(a.parent_span_id, producer, "{a:?}");
        assert!(
            a.links.contains(&(trace.to_string(), producer.to_string())),
            "the attempt links the creation context: {a:?}"
        );
        assert_eq!(a.attributes["messaging.system"], "outboxd");
        assert_eq!(a.attributes["messaging.destination.name"], sink);
        assert_eq!(a.attributes["messaging.operation.type"], "process");
        assert!(a.attributes.contains_key("messaging.batch.message_count"));
    }
    attempts
}

#[tokio::test]
async fn a_traced_post_reaches_the_webhook_in_the_producers_trace_with_every_attempt_exported() {
    init_logs();
    let collector = Collector::start().await;
    let h = Harness::new()
        .webhook("hook", "")
        .config(traced(&collector))
        .start()
        .await;
    let hook = h.hook("hook");
    // The first attempt fails: the event is tried twice.
    hook.receiver.script(503, &[], "busy");

    let (trace, producer, traceparent) = producer_context();
    let response = h
        .daemon
        .http
        .post(format!("{}/v1/events", h.daemon.base))
        .header("content-type", "application/cloudevents+json")
        .header("traceparent", &traceparent)
        .header("tracestate", "shop=1")
        .body(event("t-1", "orders/1", "order.paid", json!({"n": 1})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(eventually(T, || hook.receiver.count() == 2).await);

    // The receiver sees the producer's trace: as the transport's
    // `traceparent` (a span of outboxd's in that trace) and, unchanged, as
    // the event's creation context (`ce-traceparent`).
    let seen = hook.receiver.seen();
    for r in &seen {
        let header = r.header("traceparent").expect("a traceparent header");
        assert_eq!(ids(&header).0, trace, "same trace id at the receiver");
        assert_ne!(ids(&header).1, producer, "the parent is outboxd's span");
        assert_eq!(
            r.header("ce-traceparent").as_deref(),
            Some(traceparent.as_str())
        );
        assert_eq!(r.header("ce-tracestate").as_deref(), Some("shop=1"));
    }

    // Spans: producer → ingest; producer → attempt 1 (retry), attempt 2
    // (delivered), each → its HTTP client request. Each attempt's batch is
    // finished by a span of its own, exported when that batch is done:
    // wait for the second attempt's, not only the first.
    assert!(
        eventually(T, || {
            let attempts = attempts(&collector, "hook", "t-1", &trace, &producer);
            attempts.len() == 2
                && collector.named("POST").len() == 2
                && collector.named("finish hook").iter().any(|f| {
                    f.links
                        .contains(&(trace.clone(), attempts[1].span_id.clone()))
                })
        })
        .await,
        "spans: {:#?}",
        collector.spans()
    );
    let ingest: Vec<Span> = collector
        .named("send outboxd")
        .into_iter()
        .filter(|s| s.trace_id == trace)
        .collect();
    assert_eq!(ingest.len(), 1, "{ingest:?}");
    assert_eq!(ingest[0].kind, KIND_PRODUCER);
    assert_eq!(ingest[0].parent_span_id, producer);
    assert_eq!(ingest[0].attributes["messaging.message.id"], "t-1");

    let attempts = attempts(&collector, "hook", "t-1", &trace, &producer);
    assert_eq!(attempts[0].attributes["outboxd.attempt"], "1");
    assert_eq!(attempts[0].attributes["outboxd.outcome"], "retry");
    assert_eq!(attempts[0].attributes["error.type"], "retryable");
    assert_eq!(attempts[0].status_code, 2);
    assert_eq!(attempts[1].attributes["outboxd.attempt"], "2");
    assert_eq!(attempts[1].attributes["outboxd.outcome"], "delivered");
    assert!(!attempts[1].attributes.contains_key("error.type"));

    let clients = collector.named("POST");
    for (attempt, request) in attempts.iter().zip(&seen) {
        let client = clients
            .iter()
            .find(|c| c.parent_span_id == attempt.span_id)
            .unwrap_or_else(|| panic!("no HTTP client span under {attempt:?}: {clients:?}"));
        assert_eq!(client.kind, KIND_CLIENT);
        assert_eq!(client.trace_id, trace);
        // The receiver's answer, as the HTTP client conventions name it: the
        // 503 of the first attempt is an error, the 200 of the second not.
        let status = &client.attributes["http.response.status_code"];
        match attempt.attributes["outboxd.attempt"].as_str() {
            "1" => {
                assert_eq!(status, "503", "{client:?}");
                assert_eq!(client.attributes["error.type"], "503");
                assert_eq!(client.status_code, 2);
            }
            _ => {
                assert_eq!(status, "200", "{client:?}");
                assert!(!client.attributes.contains_key("error.type"));
            }
        }
        // What the receiver got names the client span as its parent.
        let header = request.header("traceparent").unwrap();
        assert!(
            clients.iter().any(|c| c.span_id == ids(&header).1),
            "{header} names an exported client span"
        );
    }
    let claims = collector.named("claim hook");
    assert!(!claims.is_empty());
    assert!(claims.iter().all(|c| c.kind == KIND_INTERNAL));
    let finishes = collector.named("finish hook");
    assert!(finishes.iter().any(|f| f
        .links
        .contains(&(trace.clone(), attempts[1].span_id.clone()))));
}

#[tokio::test]
async fn with_tracing_off_the_webhook_still_carries_the_creation_context() {
    init_logs();
    let h = Harness::new().webhook("hook", "").start().await;
    let hook = h.hook("hook");
    let (trace, producer, traceparent) = producer_context();
    // The context inside a structured event, not in a header.
    let mut ev = event("off-1", "s", "t", json!({}));
    ev["traceparent"] = json!(traceparent);
    h.daemon.post_event(&ev).await;
    assert!(eventually(T, || hook.receiver.count() == 1).await);
    let r = &hook.receiver.seen()[0];
    assert_eq!(
        r.header("traceparent").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(
        r.header("ce-traceparent").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(ids(&traceparent), (trace, producer));
}

#[tokio::test]
async fn a_resent_event_from_another_trace_is_the_same_event() {
    init_logs();
    let h = Harness::new().webhook("hook", "").start().await;
    let (_, _, first) = producer_context();
    let (_, _, second) = producer_context();
    let mut ev = event("same-1", "s", "t", json!({"k": 1}));
    ev["traceparent"] = json!(first);
    h.daemon.post_event(&ev).await;
    ev["traceparent"] = json!(second);
    let (status, body) = h
        .daemon
        .post("application/cloudevents+json", ev.to_string())
        .await;
    assert_eq!(status, 200, "a duplicate, not a conflict: {body}");
}

#[tokio::test]
async fn enqueue_in_an_application_transaction_carries_its_trace_to_the_webhook() {
    init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let collector = Collector::start().await;
    let url = db.url.clone();
    let trace_to = traced(&collector);
    let h = Harness::new()
        .webhook("hook", "")
        .config(move |c| {
            c.database_url = Some(url);
            trace_to(c);
        })
        .start()
        .await;
    let hook = h.hook("hook");
    let (trace, producer, traceparent) = producer_context();

    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT outboxd.enqueue('enq-1', '/shop', 'order.paid', 'orders/7', '{\"n\": 1}'::jsonb, \
         p_traceparent => $1, p_tracestate => 'shop=7')",
    )
    .bind(&traceparent)
    .execute(&mut *tx)
    .await
    .unwrap();
    // The signature written before the trace context still works.
    sqlx::query(
        "SELECT outboxd.enqueue('enq-2', '/shop', 'order.paid', 'orders/7', '{\"n\": 2}'::jsonb)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // Idempotent whatever the trace: the same event from a new trace.
    let (_, _, other) = producer_context();
    sqlx::query("SELECT outboxd.enqueue('enq-1', '/shop', 'order.paid', 'orders/7', '{\"n\": 1}'::jsonb, NULL, 'application/json', $1)")
        .bind(&other)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    assert!(eventually(T, || hook.receiver.count() == 2).await);
    let seen = hook.receiver.seen();
    let first = seen
        .iter()
        .find(|r| r.header("ce-id").as_deref() == Some("enq-1"))
        .unwrap();
    assert_eq!(
        first.header("ce-traceparent").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(first.header("ce-tracestate").as_deref(), Some("shop=7"));
    assert_eq!(ids(&first.header("traceparent").unwrap()).0, trace);
    assert!(
        eventually(T, || attempts(
            &collector, "hook", "enq-1", &trace, &producer
        )
        .len()
            == 1)
        .await,
        "spans: {:#?}",
        collector.spans()
    );
    h.daemon.stop().await;
    db.cleanup().await;
}

/// The RabbitMQ source: a message's `traceparent` header is its event's
/// creation context.
#[tokio::test]
async fn a_rabbitmq_message_carries_its_trace_to_the_webhook() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
    use lapin::types::{AMQPValue, FieldTable, ShortString};
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    init_logs();
    let amqp = std::env::var("OUTBOXD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let suffix = hex::encode(rand::random::<[u8; 4]>());
    let (exchange, queue) = (
        format!("outboxd-trace-x-{suffix}"),
        format!("outboxd-trace-q-{suffix}"),
    );
    let source: outboxd::sources::SourceConfig = toml::from_str(&format!(
        "kind = \"amqp\"\nurl = {amqp:?}\nqueue = {queue:?}\n\
         [[bindings]]\nexchange = {exchange:?}\nrouting-keys = [\"orders.#\"]\n"
    ))
    .unwrap();
    let collector = Collector::start().await;
    let trace_to = traced(&collector);
    let h = Harness::new()
        .webhook("hook", "")
        .config(move |c| {
            c.sources.insert("orders".into(), source);
            trace_to(c);
        })
        .start()
        .await;
    let hook = h.hook("hook");
    // The source declares its exchange and queue once attached.
    let start = std::time::Instant::now();
    loop {
        let (_, body) = h.daemon.get("/ready").await;
        if body["checks"]["sources"]["sources"]["orders"]["checks"]["consumer_attached"]["ok"]
            == true
        {
            break;
        }
        assert!(start.elapsed() < T, "source not attached: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (trace, producer, traceparent) = producer_context();
    let conn = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .expect("RabbitMQ must run on 127.0.0.1:5672 (scripts/setup.sh starts it)");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(traceparent.clone().into()),
    );
    ch.basic_publish(
        exchange.as_str().into(),
        "orders.created".into(),
        BasicPublishOptions::default(),
        br#"{"order": 1}"#,
        BasicProperties::default()
            .with_message_id(ShortString::from("mq-1"))
            .with_content_type("application/json".into())
            .with_headers(headers),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    assert!(eventually(T, || hook.receiver.count() == 1).await);
    let r = &hook.receiver.seen()[0];
    assert_eq!(
        r.header("ce-traceparent").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(ids(&r.header("traceparent").unwrap()).0, trace);
    assert!(
        eventually(T, || attempts(
            &collector, "hook", "mq-1", &trace, &producer
        )
        .len()
            == 1
            && collector
                .named("send outboxd")
                .iter()
                .any(|s| s.trace_id == trace && s.parent_span_id == producer))
        .await,
        "spans: {:#?}",
        collector.spans()
    );
    for q in [queue.clone(), format!("{queue}.dead")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for x in [exchange.clone(), format!("{queue}.dead-letter")] {
        let _ = ch
            .exchange_delete(x.as_str().into(), Default::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
}

/// An outbox node written by the application's transaction with the
/// transaction's `traceparent` in a property of the application's naming
/// (`event.traceparent-property`): the Neo4j relay carries it
/// into the event, the webhook receives the producer's trace, and the
/// attempt span is in that trace, linked to the creation context.
#[tokio::test]
async fn a_neo4j_outbox_node_carries_its_trace_to_the_webhook() {
    use common::neo4j::{unique_label, Neo4jServer};

    init_logs();
    let label = unique_label();
    let graph = Neo4jServer::shared().graph();
    let (trace, producer, traceparent) = producer_context();
    // As the application writes it: the outbox node in its own
    // transaction, its trace context beside the payload.
    graph
        .run(
            neo4rs::query(&format!(
                "CREATE (:`{label}` {{eventId: 'graph-1', packetId: 'P', streamVersion: 1, \
                 status: 'pending', eventType: 'com.example.changed', payload: '{{\"n\": 1}}', \
                 createdAt: datetime(), txTrace: $tp}})"
            ))
            .param("tp", traceparent.clone()),
        )
        .await
        .unwrap();
    let source =
        outboxd::sources::SourceConfig::Neo4j(outboxd::sources::neo4j::Neo4jSourceConfig {
            url: Neo4jServer::shared().uri.clone(),
            label: label.clone(),
            poll_interval: Duration::from_millis(100),
            timeout: Duration::from_secs(30),
            event: outboxd::sources::neo4j::EventMapping {
                traceparent_property: "txTrace".into(),
                ..Default::default()
            },
            ..Default::default()
        });
    let collector = Collector::start().await;
    let trace_to = traced(&collector);
    let h = Harness::new()
        .webhook("hook", "")
        .config(move |c| {
            c.sources.insert("graph".into(), source);
            trace_to(c);
        })
        .start()
        .await;
    let hook = h.hook("hook");

    assert!(eventually(Duration::from_secs(60), || hook.receiver.count() == 1).await);
    let r = &hook.receiver.seen()[0];
    assert_eq!(
        r.header("ce-traceparent").as_deref(),
        Some(traceparent.as_str()),
        "the creation context, unchanged"
    );
    assert_eq!(ids(&r.header("traceparent").unwrap()).0, trace);
    assert!(
        eventually(T, || attempts(
            &collector, "hook", "graph-1", &trace, &producer
        )
        .len()
            == 1)
        .await,
        "spans: {:#?}",
        collector.spans()
    );
}

/// `protocol = "grpc"`: the same spans reach a collector over OTLP/gRPC.
#[tokio::test]
async fn spans_reach_a_grpc_collector() {
    init_logs();
    let collector = Collector::start_grpc().await;
    let endpoint = collector.endpoint();
    let h = Harness::new()
        .webhook("hook", "")
        .config(move |c: &mut Config| {
            c.otel.enabled = true;
            c.otel.protocol = outboxd::otel::settings::OtlpProtocol::Grpc;
            c.otel.endpoint = Some(endpoint);
            c.otel.export_interval = Duration::from_millis(100);
        })
        .start()
        .await;
    let hook = h.hook("hook");
    let (trace, producer, traceparent) = producer_context();
    let response = h
        .daemon
        .http
        .post(format!("{}/v1/events", h.daemon.base))
        .header("content-type", "application/cloudevents+json")
        .header("traceparent", &traceparent)
        .body(event("g-1", "orders/1", "order.paid", json!({"n": 1})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(eventually(T, || hook.receiver.count() == 1).await);
    assert!(
        eventually(T, || attempts(&collector, "hook", "g-1", &trace, &producer)
            .len()
            == 1
            && collector.named("POST").iter().any(|c| c.trace_id == trace))
        .await,
        "spans over gRPC: {:#?}",
        collector.spans()
    );
}

#[tokio::test]
async fn an_https_collector_under_a_private_ca_is_trusted_once_egress_ca_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = private_ca();
    let (addr, seen) = https_receiver(dir.path(), (&cert, &key)).await;
    let plugins = PluginsDir::new();
    let exporting = |c: &mut Config| {
        c.otel.enabled = true;
        c.otel.endpoint = Some(format!("https://{addr}"));
        c.otel.export_interval = Duration::from_millis(100);
    };

    // The webpki roots alone do not trust it: nothing is exported.
    let d = TestDaemon::start_with(plugins.path(), exporting).await;
    d.post_event(&event("t-1", "s", "t", serde_json::json!({})))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.stop().await;
    assert!(seen.lock().unwrap().is_empty(), "nothing gets past TLS");

    // Named by egress.ca-file: the spans arrive, as OTLP protobuf.
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let d = TestDaemon::start_with(plugins.path(), move |c| {
        exporting(c);
        c.egress.ca_file = Some(ca_file);
    })
    .await;
    d.post_event(&event("t-2", "s", "t", serde_json::json!({})))
        .await;
    let exported = eventually(Duration::from_secs(10), || !seen.lock().unwrap().is_empty()).await;
    d.stop().await;
    assert!(exported, "no export reached the collector");
    let (_, body) = seen.lock().unwrap()[0].clone();
    let request = ExportTraceServiceRequest::decode(body).unwrap();
    assert!(!request.resource_spans.is_empty());
}
