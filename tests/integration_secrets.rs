//! Secrets at rest: destination secrets are stored sealed under the
//! operator's key on both stores — never in a dump of the database —
//! still sign every delivery, are resealed under a new key while events
//! flow without losing one, are sealed when an older database with plain
//! secrets first starts with a key, and are refused on PostgreSQL without
//! a key, naming the setting.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use common::{
    event, eventually, new_secret, verify_signature, Backend, PluginsDir, Receiver, TestDaemon,
    TestDb,
};
use serde_json::{json, Value};

/// The webhook sink `webhook`, allowed to reach each receiver; its
/// manifest's own target `fallback`.
fn plugins(fallback: &Receiver, receivers: &[&Receiver]) -> PluginsDir {
    let plugins = PluginsDir::new();
    let mut allow: Vec<String> = receivers.iter().map(|r| r.origin()).collect();
    allow.push(fallback.origin());
    plugins.add_webhook("webhook", &fallback.url(), &allow, &new_secret(), "");
    plugins
}

/// A daemon on `db`; `adjust` changes its configuration last (the
/// harness gives every test daemon `common::TEST_SECRETS_KEY`).
async fn start(
    plugins: &PluginsDir,
    db: &TestDb,
    adjust: impl FnOnce(&mut outboxd::config::Config),
) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        adjust(c);
    })
    .await
}

/// No key configured: the embedded store generates one in its data
/// folder, PostgreSQL has none.
fn no_key(c: &mut outboxd::config::Config) {
    c.secrets.key = None;
    c.secrets.key_file = None;
}

async fn api(d: &TestDaemon, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}{path}", d.base);
    let mut req = d
        .http
        .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Create destination `name` of the webhook sink posting to `r`, signing
/// with `secret`.
async fn create(d: &TestDaemon, name: &str, r: &Receiver, secret: &str) {
    let body =
        json!({ "name": name, "sink": "webhook", "config": { "url": r.url() }, "secret": secret });
    let (status, answer) = api(d, "POST", "/v1/admin/destinations", Some(body)).await;
    assert_eq!(status, 201, "create {name}: {answer}");
}

/// The stored record of destination `name` and its revision, read
/// straight from the database.
async fn stored(db: &TestDb, name: &str) -> (Value, i64) {
    let store = db.store().await;
    let row = store
        .destinations()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no stored destination {name}"));
    (serde_json::from_str(&row.record).unwrap(), row.revision)
}

/// Every byte of the database as an operator could copy it: `pg_dump` of
/// the test's database, or the SQLite file with its `-wal` and `-shm`.
fn dump(db: &TestDb) -> Vec<u8> {
    if let Some(path) = db.url.strip_prefix("sqlite://") {
        let mut bytes = Vec::new();
        for suffix in ["", "-wal", "-shm"] {
            if let Ok(b) = std::fs::read(format!("{path}{suffix}")) {
                bytes.extend(b);
            }
        }
        assert!(!bytes.is_empty(), "no SQLite file at {path}");
        bytes
    } else {
        let out = std::process::Command::new("pg_dump")
            .arg(&db.url)
            .output()
            .expect("pg_dump (PostgreSQL's client tools)");
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every form of a `whsec_` secret a grep could find: the whole value, its
/// base64 part, and its raw bytes.
fn forms(secret: &str) -> Vec<(String, Vec<u8>)> {
    let b64 = secret.trim_start_matches("whsec_");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    vec![
        ("the whsec_ value".into(), secret.as_bytes().to_vec()),
        ("its base64".into(), b64.as_bytes().to_vec()),
        ("its bytes".into(), raw),
    ]
}

fn assert_nowhere(bytes: &[u8], secret: &str, what: &str) {
    for (form, needle) in forms(secret) {
        assert!(
            !contains(bytes, &needle),
            "{what} holds {form} of a destination secret"
        );
    }
}

/// A key file of this test's own holding `lines`, mode 0600.
fn key_file(dir: &Path, lines: &[&str]) -> PathBuf {
    let path = dir.join("keys");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

fn key_line(id: &str) -> String {
    format!(
        "{id} {}",
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    )
}

/// Ids of the events `r` received.
fn ids(r: &Receiver) -> Vec<String> {
    let mut ids: Vec<String> = r.with_seen(|seen| {
        seen.iter()
            .map(|x| x.header("ce-id").expect("ce-id header"))
            .collect()
    });
    ids.sort();
    ids.dedup();
    ids
}

use common::both_stores;

both_stores!(
    a_secret_signs_every_delivery_and_no_dump_of_the_database_holds_it,
    rotating_the_key_while_events_flow_loses_nothing_and_leaves_nothing_under_the_old_key,
    a_database_with_plain_secrets_is_sealed_on_its_first_start_with_a_key,
    a_destination_under_a_missing_key_is_still_routed_and_delivers_once_the_key_is_added,
);

async fn a_secret_signs_every_delivery_and_no_dump_of_the_database_holds_it(backend: Backend) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    // SQLite: the embedded default, no key configured (it generates one).
    let d = start(&plugins, &db, |c| {
        if backend == Backend::Sqlite {
            no_key(c)
        }
    })
    .await;
    if backend == Backend::Sqlite {
        let key_file = d.data.path().join("secrets.key");
        let mode = std::fs::metadata(&key_file)
            .expect("the embedded default generates <data-dir>/secrets.key")
            .permissions();
        #[cfg(unix)]
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }
    let secret = new_secret();
    create(&d, "signed", &target, &secret).await;
    // A secret generated by outboxd, and one rotated away (kept as the
    // previous secret).
    let body = json!({ "name": "generated", "sink": "webhook", "config": { "url": target.url() } });
    let (status, answer) = api(&d, "POST", "/v1/admin/destinations", Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let generated = answer["secret"].as_str().unwrap().to_string();
    let (status, rotated) = api(
        &d,
        "POST",
        "/v1/admin/destinations/generated/rotate-secret",
        Some(json!({ "grace": "1h" })),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let rotated = rotated["secret"].as_str().unwrap().to_string();
    let events: Vec<Value> = (0..20)
        .map(|n| {
            event(
                &format!("e{n}"),
                &format!("s{}", n % 3),
                "t",
                json!({ "n": n }),
            )
        })
        .collect();
    d.post_batch(&events).await;
    assert!(
        eventually(Duration::from_secs(20), || target.count() >= 40).await,
        "{} of 40 deliveries arrived",
        target.count()
    );
    target.with_seen(|seen| {
        for x in seen {
            let signed = verify_signature(&secret, x)
                || (verify_signature(&rotated, x) && verify_signature(&generated, x));
            assert!(
                signed,
                "a delivery not signed with its destination's secrets"
            );
        }
    });
    let signed_by_given =
        target.with_seen(|s| s.iter().filter(|x| verify_signature(&secret, x)).count());
    assert_eq!(signed_by_given, 20);
    // The views never show them.
    let (_, list) = api(&d, "GET", "/v1/admin/destinations", None).await;
    for s in [&secret, &generated, &rotated] {
        assert_nowhere(list.to_string().as_bytes(), s, "the admin view");
    }
    assert!(!list.to_string().contains("enc:"), "{list}");
    let (status, keys) = api(&d, "GET", "/v1/admin/secrets", None).await;
    assert_eq!(status, 200, "{keys}");
    assert_eq!(keys["plain"], 0, "{keys}");
    let under: u64 = keys["by_key"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        under, 3,
        "secret, generated secret and its previous: {keys}"
    );
    d.stop().await;
    // A plain dump of the database: sealed records, and no form of any
    // secret.
    let bytes = dump(&db);
    assert!(contains(&bytes, b"enc:v1:"), "no sealed value in the dump");
    for s in [&secret, &generated, &rotated] {
        assert_nowhere(&bytes, s, "the database dump");
    }
    db.cleanup().await;
}

async fn rotating_the_key_while_events_flow_loses_nothing_and_leaves_nothing_under_the_old_key(
    backend: Backend,
) {
    const EVENTS: usize = 300;
    let receivers = [
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    ];
    let fallback = Receiver::start().await;
    let plugins = plugins(&fallback, &receivers.iter().collect::<Vec<_>>());
    let db = TestDb::new(backend).await;
    let keys = tempfile::tempdir().unwrap();
    let file = key_file(keys.path(), &[&key_line("old")]);
    let d = start(&plugins, &db, {
        let file = file.clone();
        move |c| {
            no_key(c);
            c.secrets.key_file = Some(file);
        }
    })
    .await;
    let mut secrets = Vec::new();
    for (i, r) in receivers.iter().enumerate() {
        let s = new_secret();
        create(&d, &format!("d{i}"), r, &s).await;
        secrets.push(s);
    }
    // d0's secret rotated: its previous secret is stored too.
    let (status, answer) = api(
        &d,
        "POST",
        "/v1/admin/destinations/d0/rotate-secret",
        Some(json!({ "grace": "1h" })),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    secrets[0] = answer["secret"].as_str().unwrap().to_string();
    let (_, before) = api(&d, "GET", "/v1/admin/secrets", None).await;
    assert_eq!(before["by_key"], json!({ "old": 4 }), "{before}");

    // Events flow from another task while the key rotates.
    let producer = {
        let (http, base) = (d.http.clone(), d.base.clone());
        tokio::spawn(async move {
            for chunk in 0..EVENTS / 10 {
                let batch: Vec<Value> = (chunk * 10..chunk * 10 + 10)
                    .map(|n| {
                        event(
                            &format!("e{n:03}"),
                            &format!("s{}", n % 7),
                            "t",
                            json!({ "n": n }),
                        )
                    })
                    .collect();
                let r = http
                    .post(format!("{base}/v1/events"))
                    .header("content-type", "application/cloudevents-batch+json")
                    .body(serde_json::to_vec(&batch).unwrap())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 201);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    assert!(eventually(Duration::from_secs(20), || receivers[0].count() >= 30).await);
    // Through the CLI, as an operator would.
    let listen = d.base.trim_start_matches("http://").to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["--listen", &listen, "secrets", "rotate-key", "--generate"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rotate-key: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let delivered_at_rotation = ids(&receivers[0]).len();
    let rotated: Value = serde_json::from_str(&stdout).unwrap();
    let new_key = rotated["key_id"].as_str().unwrap().to_string();
    assert_ne!(new_key, "old");
    assert_eq!(rotated["generated"], new_key.as_str(), "{rotated}");
    assert_eq!(rotated["resealed"], 4, "{rotated}");
    assert_eq!(rotated["failed"], json!([]), "{rotated}");
    producer.await.unwrap();

    // Again: nothing left to reseal.
    let (status, again) = api(&d, "POST", "/v1/admin/secrets/rotate-key", None).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["resealed"], 0, "{again}");
    assert_eq!(again["already_current"], 4, "{again}");

    let all = eventually(Duration::from_secs(60), || {
        receivers.iter().all(|r| ids(r).len() == EVENTS)
    })
    .await;
    let counts: Vec<usize> = receivers.iter().map(|r| ids(r).len()).collect();
    assert!(
        all,
        "deliveries lost across the key rotation: {counts:?} of {EVENTS} each"
    );
    assert!(
        delivered_at_rotation < EVENTS,
        "the rotation ended after every event was delivered: nothing flowed across it"
    );
    for (i, r) in receivers.iter().enumerate() {
        r.with_seen(|seen| {
            for x in seen {
                assert!(
                    verify_signature(&secrets[i], x),
                    "d{i}: not signed with its secret"
                );
            }
        });
    }
    let listen = d.base.trim_start_matches("http://").to_string();
    // Off the runtime's threads: the daemon answering it runs on them.
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["--listen", &listen, "secrets", "status"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.status.success(), "secrets status failed");
    let after: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(after["by_key"], json!({ new_key.clone(): 4 }), "{after}");
    assert_eq!(after["plain"], 0, "{after}");
    assert_eq!(after["key_ids"], json!(["old", new_key]), "{after}");
    d.stop().await;
    if backend == Backend::Postgres {
        // (A SQLite file may keep old bytes in free pages; its records are
        // read below.)
        assert!(
            !contains(&dump(&db), b"enc:v1:old:"),
            "a ciphertext under the old key is still in the database"
        );
    }
    for (i, _) in receivers.iter().enumerate() {
        let (record, _) = stored(&db, &format!("d{i}")).await;
        assert!(
            record["secret"]
                .as_str()
                .unwrap()
                .starts_with(&format!("enc:v1:{new_key}:")),
            "{record}"
        );
    }
    db.cleanup().await;
}

async fn a_database_with_plain_secrets_is_sealed_on_its_first_start_with_a_key(backend: Backend) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    // Written as outboxd wrote destinations before secrets were sealed:
    // the record's JSON, secrets in the clear.
    let (secret, previous) = (new_secret(), new_secret());
    let old = outboxd::destinations::Destination {
        name: "legacy".into(),
        sink: "webhook".into(),
        config: [("url".to_string(), target.url())].into(),
        filter: Default::default(),
        retry: None,
        rate_per_second: None,
        max_in_flight: None,
        state: Default::default(),
        state_reason: None,
        secret: Some(secret.clone()),
        previous_secret: Some(previous.clone()),
        previous_until_ms: Some(outboxd::destinations::now_ms() + 3_600_000),
        created_at_ms: outboxd::destinations::now_ms(),
        managed_by: None,
    };
    let store = db.store().await;
    store
        .put_destination(
            "legacy",
            "webhook",
            &serde_json::to_string(&old).unwrap(),
            outboxd::store::PutMode::Create,
        )
        .await
        .unwrap()
        .unwrap();
    drop(store);

    if backend == Backend::Postgres {
        // Without a key PostgreSQL keeps delivering what it has.
        let d = start(&plugins, &db, no_key).await;
        d.post_event(&event("p1", "s", "t", json!({}))).await;
        assert!(eventually(Duration::from_secs(10), || target.count() == 1).await);
        d.stop().await;
        let (record, _) = stored(&db, "legacy").await;
        assert_eq!(record["secret"], secret.as_str(), "sealed without a key?");
    }
    // The first start with a key (SQLite: the one it generates into a
    // data folder kept across the restart below).
    let data = tempfile::tempdir().unwrap();
    let embedded = |dir: PathBuf| {
        move |c: &mut outboxd::config::Config| {
            if backend == Backend::Sqlite {
                no_key(c);
                c.data_dir = dir;
            }
        }
    };
    let d = start(&plugins, &db, embedded(data.path().to_path_buf())).await;
    let (record, revision) = stored(&db, "legacy").await;
    for field in ["secret", "previous_secret"] {
        let value = record[field].as_str().unwrap();
        assert!(value.starts_with("enc:v1:"), "{field} not sealed: {record}");
    }
    assert_nowhere(record.to_string().as_bytes(), &secret, "the sealed record");
    assert_nowhere(
        record.to_string().as_bytes(),
        &previous,
        "the sealed record",
    );
    d.post_event(&event("p2", "s", "t", json!({}))).await;
    let before = target.count();
    assert!(eventually(Duration::from_secs(10), || target.count() > before).await);
    let last = target.seen().last().cloned().unwrap();
    assert!(
        verify_signature(&secret, &last) && verify_signature(&previous, &last),
        "not signed with the migrated secrets"
    );
    // Idempotent: the next start writes nothing.
    d.stop().await;
    let d = start(&plugins, &db, embedded(data.path().to_path_buf())).await;
    let (again, revision_again) = stored(&db, "legacy").await;
    assert_eq!(revision_again, revision, "resealed again on the next start");
    assert_eq!(again, record);
    d.stop().await;
    db.cleanup().await;
}

async fn a_destination_under_a_missing_key_is_still_routed_and_delivers_once_the_key_is_added(
    backend: Backend,
) {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(backend).await;
    let keys = tempfile::tempdir().unwrap();
    let (first, second) = (key_line("first"), key_line("second"));
    let file = key_file(keys.path(), &[&first]);
    let with_file = |file: PathBuf| {
        move |c: &mut outboxd::config::Config| {
            no_key(c);
            c.secrets.key_file = Some(file);
        }
    };
    let d = start(&plugins, &db, with_file(file.clone())).await;
    let secret = new_secret();
    create(&d, "held", &target, &secret).await;
    d.stop().await;
    // The key it is sealed under leaves the file.
    key_file(keys.path(), &[&second]);
    let d = start(&plugins, &db, with_file(file.clone())).await;
    d.post_event(&event("m1", "s", "t", json!({}))).await;
    // Routed all the same: its delivery waits.
    let delivery = d.delivery("m1", "held").await;
    assert!(delivery.is_some(), "the destination was skipped at routing");
    // Its health says why, naming the destination and the key id (the
    // health record is written by a task of its own: look for a while).
    let mut last_error = String::new();
    for _ in 0..100 {
        let (_, shown) = api(&d, "GET", "/v1/admin/destinations/held", None).await;
        last_error = shown["health"]["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if last_error.contains("\"first\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last_error.contains("\"first\"") && last_error.contains("held"),
        "the error names neither the key id nor the destination: {last_error:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(target.count(), 0);
    // The key comes back (earlier line: `second` stays current); the
    // daemon reads the file again by itself.
    key_file(keys.path(), &[&first, &second]);
    assert!(
        eventually(Duration::from_secs(15), || target.count() == 1).await,
        "not delivered after the key was added to the file"
    );
    assert!(target.with_seen(|s| verify_signature(&secret, &s[0])));
    d.stop().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_without_a_key_refuses_to_store_a_secret_naming_the_setting() {
    let (target, fallback) = (Receiver::start().await, Receiver::start().await);
    let plugins = plugins(&fallback, &[&target]);
    let db = TestDb::new(Backend::Postgres).await;
    let d = start(&plugins, &db, no_key).await;
    for body in [
        json!({ "name": "a", "sink": "webhook", "config": { "url": target.url() } }),
        json!({ "name": "a", "sink": "webhook", "config": { "url": target.url() }, "secret": new_secret() }),
    ] {
        let (status, refused) = api(&d, "POST", "/v1/admin/destinations", Some(body)).await;
        assert_eq!(status, 400, "{refused}");
        let message = refused["error"].as_str().unwrap();
        assert!(
            message.contains("secrets.key-file") && message.contains("OUTBOXD_SECRETS__KEY"),
            "{message}"
        );
        assert_eq!(refused["field"], "secret", "{refused}");
    }
    let (_, list) = api(&d, "GET", "/v1/admin/destinations", None).await;
    assert_eq!(
        list["destinations"],
        json!([]),
        "something was stored: {list}"
    );
    // Without a secret it is stored; a secret for it is refused.
    let body =
        json!({ "name": "a", "sink": "webhook", "config": { "url": target.url() }, "secret": "" });
    let (status, answer) = api(&d, "POST", "/v1/admin/destinations", Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let (status, refused) = api(&d, "POST", "/v1/admin/destinations/a/rotate-secret", None).await;
    assert_eq!(status, 400, "{refused}");
    let (_, shown) = api(&d, "GET", "/v1/admin/destinations/a", None).await;
    assert_eq!(shown["has_secret"], false, "{shown}");
    let (status, refused) = api(&d, "POST", "/v1/admin/secrets/rotate-key", None).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("secrets.key-file"),
        "{refused}"
    );
    d.stop().await;
    db.cleanup().await;
}

#[test]
fn config_show_never_prints_the_key() {
    let key = key_line("k1");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["config", "show"])
        .env("OUTBOXD_SECRETS__KEY", format!("{key},{}", key_line("k2")))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("[secrets]\nkey = \"***\""), "{shown}");
    let material = key.split(' ').nth(1).unwrap();
    assert!(!shown.contains(material), "{shown}");
}
