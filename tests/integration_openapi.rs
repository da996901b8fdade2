//! `GET /v1/openapi.json` describes the whole HTTP API and nothing else:
//! the served document is valid OpenAPI 3.1 (checked by
//! openapi-spec-validator), every route the code declares (`.route(` in
//! host/src) is in it with each of its methods, and every path and method
//! it names is answered by a real daemon with something other than the
//! router's own 404 or 405.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use serde_json::Value;

const ADMIN_TOKEN: &str = "openapi-test-admin-token";
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

/// Routes whose path is not a literal in the code, with the path the
/// document gives them: the awareness ingest is mounted at
/// `ingest.awareness.path`, documented at its default.
const CONFIGURED_PATHS: &[(&str, &str)] = &[("&awareness.path", "/ingest")];

/// Folders of `host/src` whose routes are not the HTTP API: the operator
/// console's HTML pages and forms (under `console.prefix`, documented in
/// docs/console.md), which read and act through the admin API's own
/// actions — those are in the document.
const NOT_THE_API: &[&str] = &["console"];

/// A daemon on loopback with the admin token set and the awareness ingest
/// mounted, so every route of the document exists.
async fn daemon() -> Harness {
    std::env::set_var("OPENAPI_TEST_AWARENESS_SECRET", "s3cret");
    Harness::new()
        .webhook("webhook", "")
        .config(|c| {
            c.admin.token = Some(ADMIN_TOKEN.into());
            c.ingest.awareness = Some(outboxd::ingest::settings::AwarenessIngestConfig {
                enabled: true,
                secret: "${OPENAPI_TEST_AWARENESS_SECRET}".into(),
                path: outboxd::ingest::settings::DEFAULT_PATH.into(),
            });
        })
        .start()
        .await
}

/// `(path, method)` of every operation in `doc`, method in lower case.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (key, _) in item.as_object().expect("path item") {
            if METHODS.contains(&key.as_str()) {
                ops.insert((path.clone(), key.clone()));
            }
        }
    }
    ops
}

/// The text of the call's arguments after `.route(` at `start`, up to the
/// matching `)`.
fn call_arguments(source: &str, start: usize) -> &str {
    let mut depth = 1;
    for (i, c) in source[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &source[start..start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced .route( call");
}

/// `(path, method)` of every `.route(PATH, get(…).post(…))` in the Rust
/// files under `dir`, a non-literal path read through
/// [`CONFIGURED_PATHS`].
fn routes_in_code(dir: &Path, found: &mut BTreeSet<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !NOT_THE_API.iter().any(|dir| path.ends_with(dir)) {
                routes_in_code(&path, found);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let mut from = 0;
        while let Some(at) = source[from..].find(".route(") {
            let start = from + at + ".route(".len();
            from = start;
            // Not in a comment.
            let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
            if source[line_start..start].contains("//") {
                continue;
            }
            let args = call_arguments(&source, start);
            let (first, rest) = args.split_once(',').unwrap_or_else(|| {
                panic!(
                    "{}: a .route( call without a handler: {args}",
                    path.display()
                )
            });
            let first = first.trim();
            let route = if let Some(literal) = first.strip_prefix('"') {
                literal.trim_end_matches('"').to_string()
            } else {
                CONFIGURED_PATHS
                    .iter()
                    .find(|(expr, _)| *expr == first)
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: route path `{first}` is not a literal: add it to \
                             CONFIGURED_PATHS with the path the document gives it",
                            path.display()
                        )
                    })
                    .1
                    .to_string()
            };
            let mut methods = 0;
            for method in METHODS {
                let call = format!("{method}(");
                let mut at = 0;
                while let Some(i) = rest[at..].find(&call) {
                    let abs = at + i;
                    let before = rest[..abs].chars().last();
                    // `get(` standing alone or after `.`, not `budget(`.
                    if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
                        found.insert((route.clone(), method.to_string()));
                        methods += 1;
                        break;
                    }
                    at = abs + call.len();
                }
            }
            assert!(
                methods > 0,
                "{}: no method read from .route({args})",
                path.display()
            );
        }
    }
}

async fn served_document(base: &str) -> Value {
    let response = reqwest::get(format!("{base}/v1/openapi.json"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "no token asked, like /health");
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_served_document_is_valid_openapi_3_1() {
    let h = daemon().await;
    let doc = served_document(&h.daemon.base).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("No module named"),
        "the check needs openapi-spec-validator: pip install openapi-spec-validator ({said})"
    );
    assert!(out.status.success(), "not valid OpenAPI 3.1: {said}");
    // Every operation has a unique id and says who may call it.
    let mut ids = BTreeSet::new();
    for (path, method) in documented(&doc) {
        let op = &doc["paths"][&path][&method];
        let id = op["operationId"].as_str().unwrap_or_default().to_string();
        assert!(
            !id.is_empty() && ids.insert(id),
            "{method} {path}: operationId"
        );
        assert!(op["security"].is_array(), "{method} {path}: no security");
    }
}

#[test]
fn every_route_in_the_code_is_in_the_document_and_no_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut code = BTreeSet::new();
    routes_in_code(&src, &mut code);
    assert!(code.len() > 20, "too few routes read: {code:?}");
    let doc: Value = serde_json::from_str(outboxd::ops::openapi::DOCUMENT).unwrap();
    let documented = documented(&doc);
    let missing: Vec<_> = code.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes in the code but not in host/src/ops/openapi.json: {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&code).collect();
    assert!(
        extra.is_empty(),
        "operations in host/src/ops/openapi.json that no route declares: {extra:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_documented_operation_is_answered_by_a_real_daemon() {
    let h = daemon().await;
    let base = &h.daemon.base;
    let doc = served_document(base).await;
    let http = reqwest::Client::new();
    // Controls: the router's own answers carry no JSON `code`, so a 404
    // from a handler ("no such event") is told apart from "no such route".
    let none = http
        .get(format!("{base}/v1/no-such-route"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 404);
    assert!(none.text().await.unwrap().is_empty());
    let wrong = http.delete(format!("{base}/health")).send().await.unwrap();
    assert_eq!(wrong.status(), 405);

    for (path, method) in documented(&doc) {
        let url = format!(
            "{base}{}",
            path.replace("{id}", "no-such-event")
                .replace("{sink}", "webhook")
                .replace("{name}", "no-such-name")
        );
        let response = http
            .request(method.to_uppercase().parse().unwrap(), &url)
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_ne!(
            status, 405,
            "{method} {path}: the daemon has no such method"
        );
        if status == 404 {
            let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            assert!(
                answer["code"].is_string(),
                "{method} {path}: the daemon has no such route (404 {body:?})"
            );
        }
    }
}
