//! Where spans go: the OTLP exporter (HTTP/protobuf or gRPC), the batch
//! span processor on the daemon's Tokio runtime, the sampler, and the
//! standard `OTEL_*` environment variables read over `[otel]`.
//!
//! Owns: [`Resolved`] (what the exporter is started with, after the
//! environment), [`start`] and the HTTP client the OTLP/HTTP exporter
//! sends with ([`OtlpHttpClient`]: hyper with rustls and ring, the same
//! TLS stack as the rest of the daemon).
//!
//! Must never: block a delivery or an ingest on an export (spans wait in
//! the processor's queue and are dropped when it is full), or log a
//! header value.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracerProvider};

use super::settings::{OtelConfig, OtlpProtocol};

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An `OTEL_*` variable holds a value outboxd cannot use.
    #[error("{name}={value:?}: {problem}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value (never a header's).
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The OTLP exporter refused its configuration (a malformed endpoint).
    #[error("otel: the OTLP exporter cannot start: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The exporter's settings after the standard environment variables:
/// `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER`, `OTEL_SERVICE_NAME`,
/// `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `..._PROTOCOL`,
/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, each over the
/// `[otel]` key it names (environment over file, as for every setting).
/// `OTEL_EXPORTER_OTLP_HEADERS` and `..._TIMEOUT` are read by the exporter
/// itself.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Whether to export at all.
    pub enabled: bool,
    /// The traces URL: `.../v1/traces` for HTTP, the collector's for gRPC.
    pub endpoint: String,
    /// OTLP transport.
    pub protocol: OtlpProtocol,
    /// Fraction of new root traces sampled.
    pub ratio: f64,
    /// `service.name`.
    pub service_name: String,
}

impl Resolved {
    /// `config` with `env` (a variable's value by name) read over it.
    pub fn new(
        config: &OtelConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Resolved, ExportError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut enabled = config.enabled;
        if let Some(exporter) = var("OTEL_TRACES_EXPORTER") {
            enabled = exporter.split(',').any(|e| e.trim() == "otlp");
        }
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            enabled = false;
        }
        let mut protocol = config.protocol;
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = var(name) {
                protocol = OtlpProtocol::parse(&value).ok_or_else(|| ExportError::Env {
                    name: if name.contains("TRACES") {
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
                    } else {
                        "OTEL_EXPORTER_OTLP_PROTOCOL"
                    },
                    value: value.clone(),
                    problem: "outboxd exports `http/protobuf` or `grpc`".into(),
                })?;
                break;
            }
        }
        let base = |url: &str| match protocol {
            OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", url.trim_end_matches('/')),
            OtlpProtocol::Grpc => url.to_string(),
        };
        let endpoint = if let Some(url) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            url
        } else if let Some(url) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            base(&url)
        } else if let Some(url) = &config.endpoint {
            base(url)
        } else {
            match protocol {
                OtlpProtocol::HttpProtobuf => base("http://localhost:4318"),
                OtlpProtocol::Grpc => "http://localhost:4317".to_string(),
            }
        };
        let mut ratio = config.sampling_ratio;
        if let Some(sampler) = var("OTEL_TRACES_SAMPLER") {
            ratio = match sampler.trim() {
                "always_on" | "parentbased_always_on" => 1.0,
                "always_off" | "parentbased_always_off" => 0.0,
                "traceidratio" | "parentbased_traceidratio" => match var("OTEL_TRACES_SAMPLER_ARG")
                {
                    None => 1.0,
                    Some(arg) => arg
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .ok_or_else(|| ExportError::Env {
                            name: "OTEL_TRACES_SAMPLER_ARG",
                            value: arg.clone(),
                            problem: "give a fraction from 0.0 to 1.0".into(),
                        })?,
                },
                other => {
                    return Err(ExportError::Env {
                        name: "OTEL_TRACES_SAMPLER",
                        value: other.to_string(),
                        problem: "outboxd samples by `always_on`, `always_off` or `traceidratio` (each parent-based)".into(),
                    })
                }
            };
        }
        Ok(Resolved {
            enabled,
            endpoint,
            protocol,
            ratio,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| config.service_name.clone()),
        })
    }
}

/// Start the tracer provider: spans sampled parent-based by `resolved`'s
/// ratio, batched and exported every `config.export_interval` on the
/// current Tokio runtime. Must be called inside that runtime.
pub fn start(
    config: &OtelConfig,
    resolved: &Resolved,
    tls: &rustls::ClientConfig,
) -> Result<SdkTracerProvider, ExportError> {
    let exporter = match resolved.protocol {
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(OtlpHttpClient::new(config.export_timeout, tls))
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(resolved.endpoint.clone())
            .with_timeout(config.export_timeout)
            .with_headers(
                config
                    .headers
                    .clone()
                    .into_iter()
                    .collect::<HashMap<_, _>>(),
            )
            .build()?,
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(resolved.endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()?,
    };
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(config.export_interval)
                .build(),
        )
        .build();
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(resolved.ratio)));
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(resolved.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    // Touch the tracer once so a misconfiguration shows at start.
    let _ = provider.tracer("outboxd");
    Ok(provider)
}

/// The OTLP/HTTP exporter's client: hyper over rustls (`https://`,
/// trusting what the daemon's outbound HTTPS trusts: the webpki roots and
/// `egress.ca-file`), or plain TCP (`http://`); a response body is read
/// up to [`MAX_RESPONSE_BYTES`].
#[derive(Clone)]
pub struct OtlpHttpClient {
    client: Arc<
        hyper_util::client::legacy::Client<
            hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
            Full<Bytes>,
        >,
    >,
    timeout: Duration,
}

/// Largest collector answer read, in bytes (an OTLP answer is a small
/// protobuf; a partial-success message at most a few KiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

impl std::fmt::Debug for OtlpHttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtlpHttpClient")
    }
}

impl OtlpHttpClient {
    /// A client with its own connection pool, TLS as `tls` says; one
    /// request and its answer must take at most `timeout`.
    pub fn new(timeout: Duration, tls: &rustls::ClientConfig) -> OtlpHttpClient {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(https);
        OtlpHttpClient {
            client: Arc::new(client),
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpHttpClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer from the collector within {:?}", self.timeout).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(vars: &[(&str, &str)]) -> Resolved {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Resolved::new(&OtelConfig::default(), |name| env.get(name).cloned()).unwrap()
    }

    #[test]
    fn off_by_default_and_the_environment_over_the_file() {
        let r = resolve(&[]);
        assert!(!r.enabled);
        assert_eq!(r.endpoint, "http://localhost:4318/v1/traces");
        let r = resolve(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]);
        assert!(r.enabled);
        assert_eq!(r.protocol, OtlpProtocol::Grpc);
        assert_eq!(r.endpoint, "http://collector:4317");
        assert_eq!(r.ratio, 0.25);
        let r = resolve(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert!(!r.enabled);
    }
}
