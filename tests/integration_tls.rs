//! TLS on the listener, exercised by real clients: reqwest with rustls
//! (HTTP/1.1) and curl (HTTP/2 by ALPN), a plain-HTTP client refused, and
//! a renewed certificate put in force without a restart.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{event, eventually, Harness};
use outboxd::tls::TlsConfig;

/// A self-signed certificate for 127.0.0.1 and localhost: PEM cert, PEM key.
fn self_signed() -> (String, String) {
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    (made.cert.pem(), made.signing_key.serialize_pem())
}

fn client_trusting(cert_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// POST one event over HTTPS with `client`: the status, or the error text.
async fn post(client: &reqwest::Client, base: &str, id: &str) -> Result<u16, String> {
    client
        .post(format!("{base}/v1/events"))
        .header("content-type", "application/cloudevents+json")
        .body(event(id, "s", "t", serde_json::json!({})).to_string())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// `curl --http2` POSTing the file `body` as one CloudEvent to `base`,
/// trusting `cert`, with `authorization` when given: "HTTP-version status",
/// and curl's error after it when curl failed.
fn curl_post(cert: &Path, base: &str, body: &Path, authorization: Option<&str>) -> String {
    let mut curl = std::process::Command::new("curl");
    curl.args(["-sS", "--http2", "--cacert"])
        .arg(cert)
        .args(["-o", "/dev/null", "-w", "%{http_version} %{http_code}"])
        .args(["-H", "content-type: application/cloudevents+json"]);
    if let Some(authorization) = authorization {
        curl.args(["-H", &format!("authorization: {authorization}")]);
    }
    let out = curl
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(format!("{base}/v1/events"))
        .output()
        .expect("curl runs");
    let answer = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        answer
    } else {
        format!("{answer} {}", String::from_utf8_lossy(&out.stderr))
    }
}

fn write_pair(dir: &Path, (cert, key): &(String, String)) {
    // The key first: the watcher reloads when either changed, and a
    // half-written pair is retried at the next change.
    std::fs::write(dir.join("key.pem"), key).unwrap();
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn https_serves_http1_and_http2_and_puts_a_renewed_certificate_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let first = self_signed();
    write_pair(dir.path(), &first);
    let tls = TlsConfig {
        cert_file: dir.path().join("cert.pem"),
        key_file: dir.path().join("key.pem"),
        reload_interval: Duration::from_millis(200),
    };
    let h = Harness::new()
        .webhook("hook", "")
        .config(move |c| c.tls = Some(tls))
        .start()
        .await;
    let port = h.daemon.base.rsplit(':').next().unwrap().to_string();
    let base = format!("https://127.0.0.1:{port}");

    // reqwest with rustls, trusting the certificate: HTTP/1.1 over TLS.
    assert_eq!(post(&client_trusting(&first.0), &base, "e1").await, Ok(201));
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.map(|r| r.status().as_u16() != 200).unwrap_or(true));

    // curl, HTTP/2 negotiated by ALPN.
    let cert = dir.path().join("cert.pem");
    let body_file = dir.path().join("e2.json");
    std::fs::write(
        &body_file,
        event("e2", "s", "t", serde_json::json!({})).to_string(),
    )
    .unwrap();
    assert_eq!(curl_post(&cert, &base, &body_file, None), "2 201");

    // A refusal over HTTP/2 reaches the client whole, even with a body it
    // never reads (an answer before the body would reset the stream).
    let big = event(
        "big",
        "s",
        "t",
        serde_json::json!({"pad": "x".repeat(200_000)}),
    );
    let body_file = dir.path().join("big.json");
    std::fs::write(&body_file, big.to_string()).unwrap();
    for _ in 0..5 {
        let wrong = Some("Bearer obx_000000000000_wrong");
        assert_eq!(curl_post(&cert, &base, &body_file, wrong), "2 401");
    }

    // The CLI reaches its daemon over TLS, trusting the configured
    // certificate (and no other: a different one on disk is refused).
    let cli = |cert: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args([
                "producers",
                "list",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("OUTBOXD_TLS__CERT_FILE", cert)
            .env("OUTBOXD_TLS__KEY_FILE", dir.path().join("key.pem"))
            .output()
            .expect("outboxd runs")
    };
    let out = cli(&dir.path().join("cert.pem"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"producers\""));
    let stranger = dir.path().join("stranger.pem");
    std::fs::write(&stranger, self_signed().0).unwrap();
    let out = cli(&stranger);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A renewed pair on disk is in force within the reload interval, with
    // no restart: a client trusting only the new certificate gets in, one
    // trusting only the old one no longer does.
    let second = self_signed();
    write_pair(dir.path(), &second);
    let renewed = client_trusting(&second.0);
    let mut n = 0;
    let mut last = Err(String::new());
    let took = eventually(Duration::from_secs(10), || {
        n += 1;
        let id = format!("r{n}");
        let (client, base) = (renewed.clone(), base.clone());
        last = std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async { post(&client, &base, &id).await })
        })
        .join()
        .unwrap();
        last == Ok(201)
    })
    .await;
    assert!(
        took,
        "the renewed certificate was not put in force: {last:?}"
    );
    assert!(post(&client_trusting(&first.0), &base, "old")
        .await
        .is_err());

    // Every accepted event is delivered as usual.
    let hook = &h.hook("hook").receiver;
    assert!(eventually(Duration::from_secs(20), || hook.count() >= 3).await);
    h.daemon.stop().await;
}

#[test]
fn a_broken_pair_is_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = self_signed();
    let (_, other_key) = self_signed();
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), "not a key").unwrap();
    let mut tls = TlsConfig {
        cert_file: dir.path().join("cert.pem"),
        key_file: dir.path().join("key.pem"),
        reload_interval: Duration::from_secs(1),
    };
    let e = outboxd::tls::server_config(&tls).unwrap_err().to_string();
    assert!(e.contains("key.pem"), "{e}");
    std::fs::write(dir.path().join("key.pem"), other_key).unwrap();
    let e = outboxd::tls::server_config(&tls).unwrap_err().to_string();
    assert!(e.contains("cert.pem") && e.contains("key.pem"), "{e}");
    tls.cert_file = dir.path().join("missing.pem");
    let e = outboxd::tls::server_config(&tls).unwrap_err().to_string();
    assert!(e.contains("missing.pem"), "{e}");
}
