//! The settings of tracing, as `outboxd.toml` writes them: `[otel]`
//! ([`OtelConfig`]). `crate::config` gathers them with every other room's
//! settings; the standard `OTEL_*` environment variables are read over
//! them when the exporter starts (`super::export::Resolved`).
//!
//! Must never: import `crate::config` (it imports these), or show a header
//! value (an API key) in its `Debug` or serialised form.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How spans travel to the collector (OTLP, `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies, to `<endpoint>/v1/traces` (port 4318).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC (port 4317).
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The name `OTEL_EXPORTER_OTLP_PROTOCOL` uses, or `None`.
    pub fn parse(name: &str) -> Option<OtlpProtocol> {
        match name.trim() {
            "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            "grpc" => Some(OtlpProtocol::Grpc),
            _ => None,
        }
    }
}

/// `[otel]`: OpenTelemetry traces, exported over OTLP. Off unless
/// `enabled = true` (or `OTEL_TRACES_EXPORTER=otlp`); off, no span is
/// made and nothing is exported.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct OtelConfig {
    /// Export traces. Default false.
    pub enabled: bool,
    /// The collector's base URL, e.g. `http://127.0.0.1:4318` (HTTP; the
    /// path `/v1/traces` is added) or `http://127.0.0.1:4317` (gRPC).
    /// Unset: `OTEL_EXPORTER_OTLP_ENDPOINT`, else the OTLP default
    /// `http://localhost:4318` (HTTP) or `http://localhost:4317` (gRPC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: OtlpProtocol,
    /// Headers sent with every export, e.g. an API key of a hosted
    /// collector; write values as `${VAR}`. Never logged; `config show`
    /// prints `***`.
    pub headers: BTreeMap<String, String>,
    /// Fraction of new traces sampled, 0.0 to 1.0 (a trace the producer
    /// already sampled or dropped keeps that decision: parent-based).
    /// Default 1.0.
    pub sampling_ratio: f64,
    /// `service.name` of the resource. Default `outboxd`.
    pub service_name: String,
    /// How long finished spans wait to be exported together (the batch
    /// span processor's scheduled delay). Default 5 s.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// How long one export may take before it is abandoned. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            enabled: false,
            endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            headers: BTreeMap::new(),
            sampling_ratio: 1.0,
            service_name: "outboxd".to_string(),
            export_interval: Duration::from_secs(5),
            export_timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for OtelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: BTreeMap<&str, &str> =
            self.headers.keys().map(|k| (k.as_str(), "***")).collect();
        f.debug_struct("OtelConfig")
            .field("enabled", &self.enabled)
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &headers)
            .field("sampling_ratio", &self.sampling_ratio)
            .field("service_name", &self.service_name)
            .field("export_interval", &self.export_interval)
            .field("export_timeout", &self.export_timeout)
            .finish()
    }
}

impl OtelConfig {
    /// Check what types cannot: `Err((key, problem))` names the key under
    /// `[otel]`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err((
                "sampling-ratio".into(),
                format!(
                    "is {}: give a fraction from 0.0 to 1.0",
                    self.sampling_ratio
                ),
            ));
        }
        if let Some(endpoint) = &self.endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err((
                    "endpoint".into(),
                    format!("{endpoint:?} is not an http:// or https:// URL"),
                ));
            }
        }
        if self.service_name.is_empty() {
            return Err(("service-name".into(), "must not be empty".into()));
        }
        if self.export_interval.is_zero() || self.export_timeout.is_zero() {
            return Err((
                "export-interval".into(),
                "export-interval and export-timeout must be greater than 0".into(),
            ));
        }
        Ok(())
    }

    /// This configuration with header values hidden, for `config show`.
    pub fn redacted(&self) -> OtelConfig {
        let mut shown = self.clone();
        for value in shown.headers.values_mut() {
            *value = "***".to_string();
        }
        shown
    }
}
