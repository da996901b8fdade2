//! The operator console in a real browser: Debian's Chromium driven over
//! WebDriver (chromedriver, `fantoccini`) against a real daemon with a
//! real webhook sink and receiver on loopback, on both stores — log in (a
//! wrong token refused), find an event and its state per destination,
//! replay dead letters by filter after a dry run and see them delivered in
//! order, create and pause a destination, see why a stream does not move, see a
//! failing destination's attempts with the receiver's status;
//! and, over plain HTTP, that a form without its CSRF token, an expired
//! session and a read-only console change nothing.
//!
//! Each page the browser visits is written as a screenshot to
//! `target/test-logs/console/<store>/`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{event, Backend, PluginsDir, Receiver, TestDaemon, TestDb};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const TOKEN: &str = "console-test-admin-token";

/// chromedriver and the browser session it drives; on drop the driver is
/// killed, and so is every Chromium process of the session's profile.
struct Browser {
    client: Client,
    driver: Child,
    /// The session's own Chromium profile (`--user-data-dir`): what names
    /// its processes, which a killed chromedriver leaves running.
    profile: tempfile::TempDir,
    shots: PathBuf,
    taken: usize,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        kill_processes_naming(self.profile.path());
    }
}

/// Kill (SIGKILL) every process whose command line contains `path`.
fn kill_processes_naming(path: &std::path::Path) {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            // A positive process id only: never a group or -1.
            let _ = Command::new("kill")
                .args(["-s", "KILL", &pid.to_string()])
                .status();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Start chromedriver on a free port and a headless Chromium session.
    async fn start(store: &str) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/setup.sh installs it)");
        let url = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir().unwrap();
        let caps: fantoccini::wd::Capabilities = serde_json::from_value(json!({
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1360,1000",
                         format!("--user-data-dir={}", profile.path().display())],
            }
        }))
        .unwrap();
        let mut last = None;
        for _ in 0..100 {
            // chromedriver listens on loopback: plain HTTP, no TLS stack.
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    let shots = common::repo_root()
                        .join("target/test-logs/console")
                        .join(store);
                    std::fs::create_dir_all(&shots).unwrap();
                    return Browser {
                        client,
                        driver,
                        profile,
                        shots,
                        taken: 0,
                    };
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no WebDriver session from chromedriver on {url}: {last:?}");
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap(),
            Err(e) => {
                let error = match self.client.find(Locator::Css("#error")).await {
                    Ok(shown) => shown.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                panic!(
                    "no {css} on {} (error shown: {error:?}): {e}",
                    self.url().await
                )
            }
        }
    }

    async fn has(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    async fn fill(&self, css: &str, value: &str) {
        let e = self.client.find(Locator::Css(css)).await.unwrap();
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    /// Click `css` (a link or a submit button: every click in these pages
    /// loads a page) and wait until the next page has loaded.
    async fn click(&self, css: &str) {
        self.client
            .execute("window.__before_click = true; return true;", vec![])
            .await
            .unwrap();
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} to click: {e}"))
            .click()
            .await
            .unwrap();
        for _ in 0..400 {
            let loaded = self
                .client
                .execute(
                    "return window.__before_click === undefined && document.readyState === 'complete';",
                    vec![],
                )
                .await;
            if matches!(loaded, Ok(serde_json::Value::Bool(true))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("clicking {css} loaded no page within 10 s");
    }

    async fn url(&self) -> String {
        self.client.current_url().await.unwrap().to_string()
    }

    /// Write the page as `NN-name.png`.
    async fn shot(&mut self, name: &str) {
        self.taken += 1;
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(
            self.shots.join(format!("{:02}-{name}.png", self.taken)),
            png,
        )
        .unwrap();
    }
}

/// A webhook sink `hook` whose manifest target is `receiver`.
fn plugins(receiver: &Receiver) -> PluginsDir {
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("hook", receiver);
    plugins
}

/// The trace id of the producer's context of event `ok-1`.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

async fn start(
    plugins: &PluginsDir,
    db: &TestDb,
    adjust: impl FnOnce(&mut outboxd::config::Config),
) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        c.admin.token = Some(TOKEN.into());
        adjust(c);
    })
    .await
}

/// Ids of the events `r` received, in arrival order.
fn ids(r: &Receiver) -> Vec<String> {
    r.with_seen(|seen| {
        seen.iter()
            .map(|x| x.header("ce-id").expect("ce-id header"))
            .collect()
    })
}

/// A plain HTTP client that keeps redirects as answers.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `GET {base}{path}` with the admin token: the answer's JSON, whatever
/// its status.
async fn admin_json(base: &str, path: &str) -> serde_json::Value {
    http()
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Log in over plain HTTP; the session cookie (`name=value`).
async fn login(base: &str, token: &str) -> (u16, Option<String>) {
    let r = http()
        .post(format!("{base}/console/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    let cookie = r
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_string());
    if let Some(c) = &cookie {
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/console"),
            "{c}"
        );
        assert!(!c.contains(TOKEN), "the cookie carries the token: {c}");
    }
    (
        r.status().as_u16(),
        cookie.map(|c| c.split(';').next().unwrap().to_string()),
    )
}

async fn get(base: &str, path: &str, cookie: &str) -> (u16, String) {
    let r = http()
        .get(format!("{base}{path}"))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post(base: &str, path: &str, cookie: &str, form: &[(&str, &str)]) -> (u16, String) {
    let r = http()
        .post(format!("{base}{path}"))
        .header(reqwest::header::COOKIE, cookie)
        .form(form)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The CSRF token in a page's forms.
fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    html[at..at + 64].to_string()
}

async fn the_console_finds_replays_and_manages_in_a_browser(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = plugins(&receiver);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |c| {
        c.console.trace_url = Some("http://traces.example/trace/{trace_id}".into());
    })
    .await;
    let base = d.base.clone();
    let store = format!("{backend:?}").to_lowercase();

    // Three events of stream s1 refused for good (400: dead letters), then
    // one delivered.
    for _ in 0..3 {
        receiver.script(400, &[], "not today");
    }
    for i in 1..=3 {
        d.post_event(&event(
            &format!("s1-{i}"),
            "s1",
            "order.paid",
            json!({"n": i}),
        ))
        .await;
        d.wait_delivery(&format!("s1-{i}"), Duration::from_secs(20), |x| {
            x["status"] == "dead"
        })
        .await;
    }
    // Posted in a producer's trace: its page links the trace.
    let mut traced = event("ok-1", "s2", "order.shipped", json!({"n": 4}));
    traced["traceparent"] = json!(format!("00-{TRACE_ID}-00f067aa0ba902b7-01"));
    d.post_event(&traced).await;
    d.wait_delivery("ok-1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;

    let mut b = Browser::start(&store).await;

    // Not logged in: sent to the login page. A wrong token is refused and
    // starts no session.
    b.goto(&format!("{base}/console/overview")).await;
    assert!(
        b.url().await.contains("/console/login"),
        "{}",
        b.url().await
    );
    b.fill("#token", "not-the-token").await;
    b.click("#login").await;
    assert!(b.text("#error").await.contains("wrong admin token"));
    b.shot("login-refused").await;
    assert!(b.client.get_all_cookies().await.unwrap().is_empty());
    b.goto(&format!("{base}/console/overview")).await;
    assert!(b.url().await.contains("/console/login"));

    b.fill("#token", TOKEN).await;
    b.click("#login").await;
    assert!(
        b.url().await.ends_with("/console/overview"),
        "{}",
        b.url().await
    );
    assert!(b.text("#sinks").await.contains("hook"));
    b.shot("overview").await;

    // An event's page links its trace in the operator's trace UI.
    b.goto(&format!("{base}/console/events/ok-1")).await;
    let link = b
        .client
        .find(Locator::Css("#trace a"))
        .await
        .expect("a trace link on the event page")
        .attr("href")
        .await
        .unwrap();
    assert_eq!(
        link.as_deref(),
        Some(format!("http://traces.example/trace/{TRACE_ID}").as_str())
    );

    // Find an event by id and see its state per destination.
    b.goto(&format!("{base}/console/events")).await;
    b.fill("#q-id", "s1-2").await;
    b.click("#search-go").await;
    assert!(b.url().await.contains("id=s1-2"), "filters in the URL");
    let found = b.text("#events").await;
    assert!(found.contains("s1-2") && !found.contains("s1-1"), "{found}");
    b.shot("events-search").await;
    b.click("a.event-link").await;
    assert!(b.url().await.ends_with("/console/events/s1-2"));
    let row = b.text("tr.delivery[data-key='hook']").await;
    assert!(row.contains("dead") && row.contains("not today"), "{row}");
    assert!(b.text("#data").await.contains("\"n\":2"));
    b.shot("event-dead").await;

    // Dead letters by filter: a dry run counts them, the confirmation
    // replays them, and they are delivered in stream order.
    b.goto(&format!("{base}/console/dead")).await;
    b.fill("#f-stream", "s1").await;
    b.click("#dead-go").await;
    assert_eq!(
        b.client
            .find_all(Locator::Css("#dead tr"))
            .await
            .unwrap()
            .len(),
        4,
        "a header and three dead letters"
    );
    b.shot("dead-letters").await;
    b.click("#replay").await;
    assert_eq!(b.text("#count").await, "3");
    assert!(b.text("#dry-run").await.contains("s1"));
    assert_eq!(receiver.count(), 4, "a dry run changes nothing");
    b.shot("dead-replay-dry-run").await;
    b.click("#confirm").await;
    assert!(b.text("#notice").await.contains("Replayed 3 dead letters"));
    b.shot("dead-replayed").await;
    assert!(
        common::eventually(Duration::from_secs(20), || receiver.count() == 7).await,
        "replayed letters delivered: {:?}",
        ids(&receiver)
    );
    assert_eq!(
        ids(&receiver)[4..],
        ["s1-1", "s1-2", "s1-3"],
        "in stream order"
    );
    b.goto(&format!("{base}/console/events/s1-2")).await;
    let row = b.text("tr.delivery[data-key='hook']").await;
    assert!(row.contains("delivered"), "{row}");
    b.shot("event-delivered").await;

    // Create a destination (its secret shown once), then pause it.
    b.goto(&format!("{base}/console/destinations")).await;
    b.fill("#d-name", "east").await;
    b.fill("#d-config", &format!("url = {}", receiver.url()))
        .await;
    b.click("#d-create").await;
    assert!(b.text("#notice").await.contains("Created destination east"));
    assert!(b.text("#secret").await.contains("whsec_"));
    b.shot("destination-created").await;
    b.click("tr.destination[data-name='east'] button.pause")
        .await;
    assert!(b.text("#notice").await.contains("Paused destination east"));
    assert!(b
        .text("tr.destination[data-name='east'] td.state")
        .await
        .contains("paused"));
    assert!(!b.has("#secret").await, "the secret is shown once");
    b.shot("destination-paused").await;

    // Edit it: a bad duration is refused naming its field and the form
    // keeps what was typed; then saved, the rest (URL, secret, pause) kept.
    b.click("tr.destination[data-name='east'] a.edit").await;
    assert!(b.text("#e-config").await.contains(&receiver.url()));
    b.fill("#e-types", "order.*").await;
    b.fill("#e-rate", "5").await;
    b.fill("#e-retry-base", "soon").await;
    b.click("#e-save").await;
    let error = b.text("#error").await;
    assert!(
        error.contains("retry.base") && error.contains("soon"),
        "{error}"
    );
    assert_eq!(
        b.client
            .find(Locator::Css("#e-types"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap()
            .as_deref(),
        Some("order.*"),
        "the refused form keeps what was typed"
    );
    b.shot("destination-edit-refused").await;
    b.fill("#e-retry-base", "500ms").await;
    b.click("#e-save").await;
    assert!(b.text("#notice").await.contains("Saved destination east"));
    let east = admin_json(&base, "/v1/admin/destinations/east").await;
    assert_eq!(east["filter"]["types"], json!(["order.*"]), "{east}");
    assert_eq!(east["rate_per_second"], 5, "{east}");
    assert_eq!(east["retry"]["base"], "500ms", "{east}");
    assert_eq!(east["config"]["url"], receiver.url(), "{east}");
    assert_eq!(east["has_secret"], true, "{east}");
    assert_eq!(east["state"], "paused", "{east}");

    // An event for the paused destination: its stream's head says why it
    // does not move.
    d.post_event(&event("s3-1", "s3", "order.paid", json!({"n": 5})))
        .await;
    b.goto(&format!("{base}/console/streams?stream=s3")).await;
    let why = b.text("#heads").await;
    assert!(
        why.contains("east") && why.contains("destination paused"),
        "{why}"
    );
    b.shot("stream-paused").await;
    b.goto(&format!("{base}/console/streams?stream=s1")).await;
    assert!(b.has("#caught-up").await);

    // The admin API gives the same answers the pages show.
    let heads = admin_json(&base, "/v1/admin/streams/s3").await;
    assert_eq!(heads["heads"][0]["sink"], "east", "{heads}");
    assert_eq!(
        heads["heads"][0]["why"]["kind"], "destination_held",
        "{heads}"
    );
    let found = admin_json(&base, "/v1/admin/events?stream=s1&state=delivered").await;
    let found: Vec<&str> = found["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(found, ["s1-3", "s1-2", "s1-1"], "by stream: newest first");
    let refused = http()
        .get(format!("{base}/v1/admin/events?state=lost"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400);
    let refused: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(refused["field"], "state");

    b.goto(&format!("{base}/console/plugins")).await;
    assert!(b.text("#plugins").await.contains("hook"));
    b.shot("plugins").await;
    b.goto(&format!("{base}/console/overview")).await;
    assert!(b.text("#destinations").await.contains("east"));
    b.shot("overview-with-destination").await;
    b.goto(&format!("{base}/console/events/s1-2")).await;
    let east = b.text("tr.delivery[data-key='east']").await;
    assert!(east.contains("filtered out"), "{east}");
    b.shot("event-two-destinations").await;

    // Logging out ends the session.
    b.click("#logout").await;
    b.goto(&format!("{base}/console/destinations")).await;
    assert!(b.url().await.contains("/console/login"));

    // Plain HTTP: a form without or with a wrong CSRF token is refused
    // and changes nothing; with it, it acts.
    let (status, none) = login(&base, "wrong").await;
    assert_eq!(
        (status, none),
        (401, None),
        "a wrong token starts no session"
    );
    let (status, cookie) = login(&base, TOKEN).await;
    assert_eq!(status, 303);
    let cookie = cookie.unwrap();
    let (_, page) = get(&base, "/console/destinations", &cookie).await;
    let csrf = csrf_of(&page);
    // Every form of the console, each with what it would otherwise act on.
    let forms: [(&str, &[(&str, &str)]); 10] = [
        ("/console/destinations/east/resume", &[]),
        (
            "/console/destinations/east/edit",
            &[("rate_per_second", "9")],
        ),
        ("/console/destinations/east/pause", &[]),
        ("/console/destinations/east/rotate", &[]),
        ("/console/destinations/east/delete", &[("pending", "purge")]),
        (
            "/console/destinations",
            &[("name", "west"), ("sink", "hook")],
        ),
        ("/console/dead/replay", &[]),
        ("/console/dead/purge", &[]),
        ("/console/logout", &[]),
        ("/console/destinations/east/resume", &[("csrf", "")]),
    ];
    let wrong = "0".repeat(64);
    for (path, fields) in forms {
        for csrf in [None, Some(wrong.as_str())] {
            let mut form = fields.to_vec();
            form.extend(csrf.map(|c| ("csrf", c)));
            let (status, body) = post(&base, path, &cookie, &form).await;
            assert_eq!(status, 403, "{path} {form:?}: {body}");
            assert!(body.contains("CSRF"), "{path}: {body}");
        }
    }
    let (status, page) = get(&base, "/console/destinations", &cookie).await;
    assert_eq!(status, 200, "still logged in");
    assert!(
        page.contains("paused") && !page.contains("west"),
        "nothing changed"
    );
    let (status, body) = post(
        &base,
        "/console/destinations/east/resume",
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Resumed destination east"));

    // Resumed, east delivers s3-1; its last hour shows it.
    let east = || admin_json(&base, "/v1/admin/destinations/east");
    let start = std::time::Instant::now();
    loop {
        let east = east().await;
        let delivered: u64 = east["health"]["minutes"].as_array().map_or(0, |m| {
            m.iter().map(|m| m["delivered"].as_u64().unwrap()).sum()
        });
        if delivered >= 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "east's health counts no delivery: {east}; s3-1: {:?}",
            d.deliveries("s3-1").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, page) = get(&base, "/console/destinations", &cookie).await;
    let row = &page[page.find("data-name=\"east\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("data-delivered=\"1\"") && row.contains("<svg class=\"spark pair\""),
        "{row}"
    );

    drop(b);
    d.stop().await;
    db.cleanup().await;
}

async fn an_expired_session_and_a_read_only_console_change_nothing(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = plugins(&receiver);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |c| {
        c.console.session_ttl = Duration::from_millis(1500);
        c.console.read_only = true;
    })
    .await;
    let base = d.base.clone();
    let (status, cookie) = login(&base, TOKEN).await;
    assert_eq!(status, 303);
    let cookie = cookie.unwrap();
    let (status, page) = get(&base, "/console/destinations", &cookie).await;
    assert_eq!(status, 200);
    assert!(page.contains("read-only") && !page.contains("id=\"create\""));
    let csrf = csrf_of(&page);
    let (status, body) = post(
        &base,
        "/console/destinations",
        &cookie,
        &[("csrf", &csrf), ("name", "west"), ("sink", "hook")],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only"));
    let (_, page) = get(&base, "/console/destinations", &cookie).await;
    assert!(!page.contains("west"), "nothing created");

    tokio::time::sleep(Duration::from_millis(1700)).await;
    let r = http()
        .get(format!("{base}/console/overview"))
        .header(reqwest::header::COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        303,
        "an expired session is sent to log in"
    );
    assert!(r.headers()[reqwest::header::LOCATION]
        .to_str()
        .unwrap()
        .starts_with("/console/login"));
    let (status, _) = post(&base, "/console/logout", &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(status, 403, "an expired session acts on nothing");

    d.stop().await;
    db.cleanup().await;
}

async fn a_blocked_stream_names_the_dead_letter_that_holds_it(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = plugins(&receiver);
    let manifest = plugins.path().join("hook.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("[retry]\n", "[retry]\non-dead = \"block\"\n"),
    )
    .unwrap();
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let base = d.base.clone();
    receiver.script(400, &[], "not today");
    for id in ["b1", "b2"] {
        d.post_event(&event(id, "blocked", "order.paid", json!({})))
            .await;
    }
    d.wait_delivery("b1", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;

    let (_, cookie) = login(&base, TOKEN).await;
    let cookie = cookie.unwrap();
    let (status, page) = get(&base, "/console/streams?stream=blocked", &cookie).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("blocked by dead letter b1") && page.contains("not today"),
        "{page}"
    );
    let (_, page) = get(&base, "/console/events/b2", &cookie).await;
    assert!(page.contains(">pending<"), "b2 waits behind b1: {page}");
    let heads = admin_json(&base, "/v1/admin/streams/blocked").await;
    assert_eq!(
        heads["heads"][0]["why"]["kind"], "blocked_by_dead",
        "{heads}"
    );
    assert_eq!(heads["heads"][0]["why"]["event_id"], "b1", "{heads}");

    d.stop().await;
    db.cleanup().await;
}

/// `outboxd ARGS` as a user types it against `d` (its listen address and
/// the admin token from the environment), off the async runtime: exit
/// status and stdout.
async fn cli(d: &TestDaemon, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OUTBOXD_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .args(["--listen", d.base.trim_start_matches("http://")])
        .env("OUTBOXD_ADMIN__TOKEN", TOKEN)
        .env("RUST_LOG", "error");
    let out = tokio::task::spawn_blocking(move || command.output().expect("run outboxd"))
        .await
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            if out.status.success() {
                String::new()
            } else {
                String::from_utf8_lossy(&out.stderr).into_owned()
            }
        ),
    )
}

/// The values of attribute `name` in `html`, in order.
fn attributes(html: &str, name: &str) -> Vec<String> {
    let key = format!("{name}=\"");
    html.match_indices(&key)
        .map(|(at, _)| {
            let rest = &html[at + key.len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// The CLI, the admin API and the console are three faces of one admin
/// layer: on the same data they list the same dead letters in the same
/// order and the same event states, and what one does the others see.
async fn the_cli_the_api_and_the_console_agree(backend: Backend) {
    let receiver = Receiver::start().await;
    let plugins = plugins(&receiver);
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let base = d.base.clone();
    for id in ["a1", "a2", "a3"] {
        receiver.script(400, &[], "not today");
        d.post_event(&event(id, "agree", "order.paid", json!({})))
            .await;
        d.wait_delivery(id, Duration::from_secs(20), |x| x["status"] == "dead")
            .await;
    }
    d.post_event(&event("a4", "other", "order.paid", json!({})))
        .await;
    d.wait_delivery("a4", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let (_, cookie) = login(&base, TOKEN).await;
    let cookie = cookie.unwrap();
    let api = |path: &'static str| admin_json(&base, path);

    // Dead letters: the same, in the same order.
    let by_api: Vec<(String, String)> = api("/v1/admin/dead").await["dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["event_id"].as_str().unwrap().to_string(),
                x["sink"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(by_api.len(), 3, "{by_api:?}");
    let (ok, listed) = cli(&d, &["dead", "list"]).await;
    assert!(ok, "{listed}");
    let by_cli: Vec<(String, String)> = listed
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            (f.next().unwrap().into(), f.next().unwrap().into())
        })
        .collect();
    let (_, page) = get(&base, "/console/dead", &cookie).await;
    let by_console: Vec<(String, String)> = attributes(&page, "data-event")
        .into_iter()
        .zip(attributes(&page, "data-key"))
        .collect();
    assert_eq!(by_cli, by_api, "CLI and API");
    assert_eq!(by_console, by_api, "console and API");

    // One event: the same states per destination.
    let event = api("/v1/admin/events/a4").await;
    let (ok, shown) = cli(&d, &["events", "show", "a4"]).await;
    assert!(ok, "{shown}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
        event
    );
    let (_, page) = get(&base, "/console/events/a4", &cookie).await;
    for delivery in event["deliveries"].as_array().unwrap() {
        let key = delivery["sink"].as_str().unwrap();
        let row = &page[page.find(&format!("data-key=\"{key}\"")).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(delivery["status"].as_str().unwrap()),
            "{key}: {row} against {delivery}"
        );
    }

    // What the CLI does, the API and the console see; what the console
    // does, the CLI and the API see.
    let (ok, out) = cli(&d, &["sinks", "pause", "hook"]).await;
    assert!(ok, "{out}");
    let sinks = api("/v1/admin/sinks").await;
    assert_eq!(sinks["sinks"][0]["paused"], true, "{sinks}");
    let (_, page) = get(&base, "/console/overview", &cookie).await;
    assert_eq!(
        attributes(&page, "data-paused"),
        ["true"],
        "the console sees the pause"
    );
    let (ok, out) = cli(&d, &["sinks", "resume", "hook"]).await;
    assert!(ok, "{out}");
    let (_, page) = get(
        &base,
        "/console/dead/confirm?action=purge&event_id=a2",
        &cookie,
    )
    .await;
    let csrf = csrf_of(&page);
    let (status, body) = post(
        &base,
        "/console/dead/purge",
        &cookie,
        &[("csrf", &csrf), ("event_id", "a2")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (ok, listed) = cli(&d, &["dead", "list"]).await;
    assert!(ok, "{listed}");
    assert!(
        !listed.contains("a2\t") && listed.contains("a1\t"),
        "{listed}"
    );
    let left: Vec<String> = api("/v1/admin/dead").await["dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.iter().any(|e| e == "a2"), "{left:?}");

    d.stop().await;
    db.cleanup().await;
}

/// A head another session holds locked (an application's transaction left
/// open on it) is named with that session; when the transaction ends, the
/// event is delivered. PostgreSQL only: SQLite has no row locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_held_by_a_row_lock_names_the_session() {
    let receiver = Receiver::start().await;
    let plugins = plugins(&receiver);
    let db = TestDb::new(Backend::Postgres).await;
    let d = start(&plugins, &db, |_| {}).await;
    let base = d.base.clone();
    let post = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let r = http().post(url).bearer_auth(TOKEN).send().await.unwrap();
            assert!(r.status().is_success(), "{r:?}");
        }
    };
    post("/v1/admin/sinks/hook/pause").await;
    // Each process reads the paused sinks at most once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.post_event(&event("h1", "held", "order.paid", json!({})))
        .await;
    let held = common::HeldLocks::take(
        &db.url,
        "SET application_name = 'billing-job'; \
         SELECT 1 FROM outboxd.heads WHERE stream = 'held' FOR UPDATE",
    )
    .await;
    post("/v1/admin/sinks/hook/resume").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(ids(&receiver).is_empty(), "a locked head is skipped");
    let heads = admin_json(&base, "/v1/admin/streams/held").await;
    let why = &heads["heads"][0]["why"];
    assert_eq!(why["kind"], "held_by_lock", "{heads}");
    assert_eq!(why["holder"]["application"], "billing-job", "{heads}");
    assert_eq!(why["holder"]["state"], "idle in transaction", "{heads}");
    let (_, cookie) = login(&base, TOKEN).await;
    let (status, page) = get(&base, "/console/streams?stream=held", &cookie.unwrap()).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("held by a lock") && page.contains("billing-job"),
        "{page}"
    );

    held.release().await;
    d.wait_delivery("h1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;
    let heads = admin_json(&base, "/v1/admin/streams/held").await;
    assert_eq!(heads["heads"], json!([]), "{heads}");

    d.stop().await;
    db.cleanup().await;
}

async fn a_failing_destinations_attempts_show_the_receivers_status(backend: Backend) {
    let receiver = Receiver::start().await;
    // A second receiver, for a destination created on the page.
    let other = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook(
        "hook",
        &receiver.url(),
        &[receiver.origin(), other.origin()],
        &common::new_secret(),
        "",
    );
    let db = TestDb::new(backend).await;
    let d = start(&plugins, &db, |_| {}).await;
    let base = d.base.clone();
    let store = format!("{backend:?}").to_lowercase();

    // Two 503s, then delivered.
    receiver.script(503, &[], "busy");
    receiver.script(503, &[], "busy");
    d.post_event(&event("f-1", "f", "order.paid", json!({"n": 1})))
        .await;
    d.wait_delivery("f-1", Duration::from_secs(20), |x| {
        x["status"] == "delivered"
    })
    .await;

    let mut b = Browser::start(&format!("{store}-attempts")).await;
    b.goto(&format!("{base}/console/login")).await;
    b.fill("#token", TOKEN).await;
    b.click("#login").await;

    // From the event's page, per destination, to its failed attempts.
    b.goto(&format!("{base}/console/events/f-1")).await;
    b.click("tr.delivery[data-key='hook'] a.attempts-link")
        .await;
    let url = b.url().await;
    assert!(
        url.contains("/console/attempts?")
            && url.contains("event_id=f-1")
            && url.contains("sink=hook"),
        "{url}"
    );
    let rows = b
        .client
        .find_all(Locator::Css("#attempts tr.attempt"))
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        2,
        "two failures; the delivered attempt is not one"
    );
    for row in &rows {
        let status = row.find(Locator::Css("td.status")).await.unwrap();
        assert_eq!(status.text().await.unwrap(), "503");
        let reason = row.find(Locator::Css("td.reason")).await.unwrap();
        assert_eq!(reason.text().await.unwrap(), "HTTP 503");
        let outcome = row.find(Locator::Css("td.outcome")).await.unwrap();
        assert_eq!(outcome.text().await.unwrap(), "retry");
    }
    b.shot("attempts-of-event").await;

    // A destination whose receiver refuses once: from its row on the
    // destinations page to its attempts.
    other.script(503, &[], "");
    b.goto(&format!("{base}/console/destinations")).await;
    b.fill("#d-name", "west").await;
    b.fill("#d-config", &format!("url = {}", other.url())).await;
    b.click("#d-create").await;
    assert!(b.text("#notice").await.contains("Created destination west"));
    d.post_event(&event("f-2", "f", "order.paid", json!({"n": 2})))
        .await;
    assert!(
        common::eventually(Duration::from_secs(20), || other.count() >= 2).await,
        "west refused once, then took it"
    );
    b.goto(&format!("{base}/console/destinations")).await;
    b.click("tr.destination[data-name='west'] a.attempts-link")
        .await;
    assert!(b.url().await.contains("sink=west"), "{}", b.url().await);
    let table = b.text("#attempts").await;
    assert!(
        table.contains("f-2") && table.contains("503") && !table.contains("f-1"),
        "{table}"
    );
    b.shot("attempts-of-destination").await;

    // From the navigation, filtered in the URL.
    b.click("nav a[href$='/attempts']").await;
    b.fill("#a-event", "f-1").await;
    b.click("#attempts-go").await;
    assert!(b.url().await.contains("event_id=f-1"), "filters in the URL");
    assert_eq!(
        b.client
            .find_all(Locator::Css("#attempts tr.attempt"))
            .await
            .unwrap()
            .len(),
        2
    );
    b.goto(&format!("{base}/console/attempts?since=yesterday"))
        .await;
    assert!(
        b.text("#error").await.contains("since"),
        "a bad time is named"
    );

    drop(b);
    d.stop().await;
    db.cleanup().await;
}

use common::both_stores;

both_stores!(
    a_failing_destinations_attempts_show_the_receivers_status,
    the_console_finds_replays_and_manages_in_a_browser,
    an_expired_session_and_a_read_only_console_change_nothing,
    a_blocked_stream_names_the_dead_letter_that_holds_it,
    the_cli_the_api_and_the_console_agree,
);
