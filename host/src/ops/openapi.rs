//! `GET /v1/openapi.json`: the OpenAPI 3.1 description of the whole HTTP
//! API (ingest, probes, the admin API), kept by hand in `openapi.json`
//! beside this file and compiled into the binary.
//!
//! Owns: serving that document, open like `/health` (it describes the API,
//! never the daemon's state, so it needs no token even beyond loopback).
//!
//! Must never: go out of step with the routes: `tests/integration_openapi.rs`
//! fails when a route in the code is missing from the document, or the
//! document names a path and method a real daemon does not answer; and it
//! validates the document against the OpenAPI 3.1 schema.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The document, as served (JSON, OpenAPI 3.1.0).
pub const DOCUMENT: &str = include_str!("openapi.json");

/// Where the daemon serves [`DOCUMENT`].
pub const PATH: &str = "/v1/openapi.json";

/// The route of the document (no state, no token). The path is written
/// out (not [`PATH`]) so the route check of the document reads it.
pub fn router() -> Router {
    Router::new().route("/v1/openapi.json", get(document))
}

async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_is_json_of_openapi_3_1() {
        let doc: serde_json::Value = serde_json::from_str(super::DOCUMENT).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["paths"][super::PATH]["get"].is_object());
    }
}
