//! The webhook sink's awareness payload mode and its Standard Webhooks secret
//! rotation, end to end: HTTP ingest → SQLite → the WebAssembly `webhook`
//! sink → receivers on loopback that verify as the receivers of the
//! awareness service and of Standard Webhooks do.
//!
//! The awareness receiver checks `x-aaas-signature` (lower-case hex
//! HMAC-SHA256 over the raw body, keyed with the secret string, compared in
//! constant time) and has Node.js check that `JSON.stringify(JSON.parse(body))`
//! gives the body back byte for byte, as a receiver that re-serializes the
//! parsed body before verifying needs. An event is not sent back to the
//! platform whose `requestingPlatform` has the target's origin.

mod common;

use std::io::Write as _;
use std::time::Duration;

use base64::Engine as _;
use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

/// A CloudEvent, written by hand so that its `data` text is exactly `data`.
fn mutation(id: &str, packet: &str, data: &str, extensions: &str) -> String {
    format!(
        r#"{{"specversion":"1.0","id":{id:?},"source":"neo4j://vault-1","type":"w3ds.metaenvelope.update","partitionkey":{packet:?},"datacontenttype":"application/json","data":{data}{extensions}}}"#
    )
}

/// Payloads that JavaScript and a naive serializer write differently:
/// number forms, integer-like keys, escapes, unicode, nesting.
const DATA: [&str; 6] = [
    r#"{"title":"Zoë \"quoted\" \\ back\/slash","emoji":"😀 \ud83d\ude00","ctl":"\u0001\u001f\b\f\n\r\t\u007f","seps":"\u2028\u2029"}"#,
    r#"{"n":[1.0,-0,1e21,1e20,123456789012345678901234,9007199254740993,0.0000001,0.000001,1.5E-7,5e-324,2.50]}"#,
    r#"{"b":1,"10":"ten","a":{"z":[{"deep":{"deeper":[null,true,false,{}]}}],"2":[]},"2":"two","01":"zero-one"}"#,
    r#"{"same":1,"other":2,"same":3}"#,
    r#"[]"#,
    r#""just a string""#,
];

const EXTENSIONS: &str = r#","w3id":"@owner-1","evaultpublickey":"z6Mk","schemaid":"550e8400-e29b-41d4-a716-446655440000","operation":"update","requestingplatform":"https://blabsy.example""#;

fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// A receiver's check of `x-aaas-signature`: recompute over the raw body
/// and compare in constant time.
fn verify_aaas_signature(secret: &str, r: &Received) -> bool {
    let Some(given) = r.header("x-aaas-signature") else {
        return false;
    };
    let expected = hmac_hex(secret.as_bytes(), &r.body);
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

/// Node.js's verdict on each body: `JSON.stringify(JSON.parse(body)) ===
/// body`. Returns the bodies it found different.
fn bodies_javascript_rewrites(bodies: &[Vec<u8>]) -> Vec<String> {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for body in bodies {
        writeln!(
            file,
            "{}",
            base64::engine::general_purpose::STANDARD.encode(body)
        )
        .unwrap();
    }
    let script = r#"
        const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean);
        let checked = 0;
        for (const line of lines) {
            const body = Buffer.from(line, "base64").toString("utf8");
            if (JSON.stringify(JSON.parse(body)) !== body) console.log("DIFFERS " + body);
            checked++;
        }
        console.log("CHECKED " + checked);
    "#;
    let out = std::process::Command::new("node")
        .args(["-e", script])
        .arg(file.path())
        .output()
        .expect("node must be installed (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!("CHECKED {}", bodies.len())),
        "node did not check every body: {text}"
    );
    text.lines()
        .filter_map(|l| l.strip_prefix("DIFFERS ").map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn awareness_bodies_are_what_json_stringify_writes_signed_and_never_echoed_to_their_platform()
{
    let signed = Receiver::start().await;
    let unsigned = Receiver::start().await;
    let secret = "platform-secret: not whsec, not base64 ✓";
    let (signed_url, signed_origin) = (signed.url(), signed.origin());
    let (unsigned_url, unsigned_origin) = (unsigned.url(), unsigned.origin());
    let (d, _plugins) = Harness::new()
        .plugins(move |plugins| {
            plugins.add_webhook(
                "platform-a",
                &signed_url,
                &[signed_origin],
                secret,
                "payload = \"awareness\"\n",
            );
            plugins.add_webhook(
                "platform-b",
                &unsigned_url,
                &[unsigned_origin],
                "",
                "payload = \"awareness\"\n",
            );
        })
        .start()
        .await
        .into_daemon();

    let mut ids = Vec::new();
    for (i, data) in DATA.iter().enumerate() {
        let id = format!("evt-{i}");
        let (status, body) = d
            .post(
                "application/cloudevents+json",
                mutation(&id, &format!("packet-{}", i % 2), data, EXTENSIONS),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        ids.push(id);
    }
    // An event without the optional packet fields.
    let (status, body) = d
        .post(
            "application/cloudevents+json",
            mutation("evt-bare", "packet-9", "{}", r#","schemaid":"s""#),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    ids.push("evt-bare".into());
    // A mutation platform-a made itself: never sent back to it (no echo),
    // sent to platform-b.
    let from_a = format!(
        r#","schemaid":"s","requestingplatform":"{}/api/graphql""#,
        signed.origin()
    );
    let (status, body) = d
        .post(
            "application/cloudevents+json",
            mutation("evt-echo", "packet-9", "{}", &from_a),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    assert!(
        eventually(Duration::from_secs(20), || signed.count() >= ids.len()
            && unsigned.count() > ids.len())
        .await,
        "not all delivered"
    );
    let echo = d
        .wait_sink("evt-echo", "platform-a", Duration::from_secs(20), |x| {
            x["status"] == "delivered"
        })
        .await;
    assert_eq!(echo["attempts"], 1, "{echo}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = signed.seen();
    assert_eq!(seen.len(), ids.len(), "each event once, the echo never");
    assert_eq!(unsigned.count(), ids.len() + 1);
    assert!(unsigned
        .seen()
        .iter()
        .any(|r| r.header("x-aaas-event-id").as_deref() == Some("evt-echo")));

    for r in &seen {
        assert!(
            verify_aaas_signature(secret, r),
            "signature: {:?}",
            r.headers
        );
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let id = body["eventId"].as_str().unwrap();
        assert_eq!(r.header("x-aaas-event-id").as_deref(), Some(id));
        let text = std::str::from_utf8(&r.body).unwrap();
        let keys = [
            "eventId",
            "id",
            "w3id",
            "evaultPublicKey",
            "data",
            "schemaId",
            "operation",
        ];
        let object = body.as_object().unwrap();
        assert_eq!(object.len(), keys.len(), "{text}");
        let at: Vec<usize> = keys
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "key order: {text}");
        assert!(text.starts_with("{\"eventId\":"), "{text}");
        if id == "evt-bare" {
            assert_eq!(body["w3id"], Value::Null);
            assert_eq!(body["evaultPublicKey"], Value::Null);
            assert_eq!(body["operation"], "create", "the service's default");
        } else {
            assert_eq!(body["w3id"], "@owner-1");
            assert_eq!(body["evaultPublicKey"], "z6Mk");
            assert_eq!(body["schemaId"], "550e8400-e29b-41d4-a716-446655440000");
            assert_eq!(body["operation"], "update");
            let i: usize = id.trim_start_matches("evt-").parse().unwrap();
            assert_eq!(body["id"], json!(format!("packet-{}", i % 2)));
            let sent: Value = serde_json::from_str(DATA[i]).unwrap();
            if i != 1 {
                // Numbers aside (JavaScript rounds them to doubles), the
                // data is the data that was sent.
                assert_eq!(body["data"], sent, "{text}");
            }
        }
    }
    let bodies: Vec<Vec<u8>> = seen.iter().map(|r| r.body.to_vec()).collect();
    let rewritten = bodies_javascript_rewrites(&bodies);
    assert!(
        rewritten.is_empty(),
        "JSON.stringify(JSON.parse(body)) differs for: {rewritten:#?}"
    );

    // Without a secret the service sends no signature, and so does the sink.
    for r in unsigned.seen() {
        assert_eq!(r.header("x-aaas-signature"), None);
        assert!(r.header("x-aaas-event-id").is_some());
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_previous_secret_both_signatures_verify_against_their_secrets() {
    let old = new_secret();
    let (
        d,
        Hook {
            receiver,
            secret: new,
            ..
        },
        _plugins,
    ) = Harness::new()
        .webhook("webhook", &format!("previous-secret = {old:?}\n"))
        .start()
        .await
        .single_hook();
    for i in 0..4 {
        d.post_event(&event(&format!("r-{i}"), "s", "t", json!({"i": i})))
            .await;
    }
    assert!(eventually(Duration::from_secs(20), || receiver.count() >= 4).await);
    let other = new_secret();
    for r in receiver.seen() {
        let header = r.header("webhook-signature").unwrap();
        assert_eq!(header.split(' ').count(), 2, "{header}");
        // Each entry verifies against its own secret, the new one first.
        let only = |entry: &str| {
            let mut one = r.clone();
            one.headers
                .insert("webhook-signature", entry.parse().unwrap());
            (verify_signature(&new, &one), verify_signature(&old, &one))
        };
        let entries: Vec<&str> = header.split(' ').collect();
        assert_eq!(only(entries[0]), (true, false), "{header}");
        assert_eq!(only(entries[1]), (false, true), "{header}");
        assert!(!verify_signature(&other, &r));
    }
    d.stop().await;
}
