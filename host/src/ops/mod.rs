//! Operations endpoints.
//!
//! Owns: `/health` (the process serves requests) and `/ready` (the database
//! answers, no migration is pending, and the configured plugins loaded).
//!
//! Must never: run an unbounded query on a probe path — a probe that times
//! out under a backlog is worse than none.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::store::Store;

/// Longest a readiness check may wait for the database.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the probes look at.
#[derive(Clone)]
pub struct OpsState {
    pub store: Arc<dyn Store>,
    /// Sinks that loaded, and plugins refused at load (file: reason).
    pub sinks: Vec<String>,
    pub plugin_failures: Vec<String>,
}

/// The ops routes.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({ "status": "ok" })) }))
        .route("/ready", get(ready))
        .with_state(state)
}

async fn ready(State(state): State<OpsState>) -> Response {
    let database = match tokio::time::timeout(PROBE_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    };
    let migrations = match &database {
        Ok(()) => match tokio::time::timeout(PROBE_TIMEOUT, state.store.pending_migrations()).await {
            Ok(Ok(p)) if p.is_empty() => Ok(()),
            Ok(Ok(p)) => Err(format!("pending: {}", p.join(", "))),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        },
        Err(_) => Err("database unavailable".to_string()),
    };
    let plugins: Result<(), String> = if state.plugin_failures.is_empty() {
        Ok(())
    } else {
        Err(state.plugin_failures.join("; "))
    };
    let ok = database.is_ok() && migrations.is_ok() && plugins.is_ok();
    let show = |r: &Result<(), String>| match r {
        Ok(()) => json!({ "ok": true }),
        Err(e) => json!({ "ok": false, "error": e }),
    };
    let body = json!({
        "ready": ok,
        "checks": {
            "database": show(&database),
            "migrations": show(&migrations),
            "plugins": { "ok": plugins.is_ok(), "loaded": state.sinks, "refused": state.plugin_failures },
        }
    });
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}
