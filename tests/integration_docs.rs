//! The manual cannot drift from the code: its links resolve, its
//! configuration reference lists exactly the keys the config types accept,
//! its metrics reference every family the registry has, its `/ready`
//! reference every field a running daemon reports, and its examples parse
//! (TOML) or run (`console` blocks).
//!
//! `scripts/test.sh` also builds the book with mdBook; these tests are what
//! fails when a page is wrong, since mdBook only warns.

mod common;
mod docs_check;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::repo_root;
use docs_check::blocks::{self, Block};
use docs_check::{config_keys, links, markdown_files};

/// The text of a repository file.
fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of every Markdown table in `markdown`: each row's cells,
/// trimmed, header and separator rows left out.
fn table_rows(markdown: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut previous_was_table = false;
    for line in markdown.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            previous_was_table = false;
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect();
        let separator = cells
            .iter()
            .all(|c| c.chars().all(|ch| "-: |".contains(ch)));
        if previous_was_table && !separator {
            rows.push(cells);
        }
        previous_was_table = true;
    }
    rows
}

/// The code spans (`` `x` ``) of `text`, in order.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A first cell that is one code span and nothing else: the key it names.
fn sole_code_span(cell: &str) -> Option<String> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then(|| inner.to_string())
}

// --- links -------------------------------------------------------------------

#[test]
fn every_internal_link_of_the_manual_and_readme_resolves() {
    let root = repo_root();
    let broken = links::check(&root, &markdown_files(&root));
    let list: Vec<String> = broken.iter().map(|b| b.to_string()).collect();
    assert!(list.is_empty(), "broken links:\n{}", list.join("\n"));
}

#[test]
fn the_link_check_fails_on_a_missing_file_and_a_missing_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs/guides")).unwrap();
    std::fs::write(
        root.join("docs/guides/a.md"),
        "# A page\n\n## Second `part`, here\n\n[fine](#second-part-here) [up](../b.md#b-title)\n\n\
         [missing file](../nowhere.md)\n[missing anchor](../b.md#no-such-heading)\n\
         ```sh\n[not a link](../inside-code.md)\n```\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/b.md"),
        "# B title\n\n[out](../../outside.md) [web](https://example.org/x.md)\n",
    )
    .unwrap();
    std::fs::write(
        root.join("README.md"),
        "[the a page](docs/guides/a.md#a-page)\n",
    )
    .unwrap();

    let broken = links::check(root, &markdown_files(root));
    let got: Vec<(String, usize, String)> = broken
        .iter()
        .map(|b| {
            let file = b.file.strip_prefix(root).unwrap().display().to_string();
            (file, b.line, b.link.clone())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("docs/b.md".to_string(), 3, "../../outside.md".to_string()),
            (
                "docs/guides/a.md".to_string(),
                7,
                "../nowhere.md".to_string()
            ),
            (
                "docs/guides/a.md".to_string(),
                8,
                "../b.md#no-such-heading".to_string()
            ),
        ],
        "{broken:#?}"
    );
}

#[test]
fn anchors_are_made_as_mdbook_and_github_make_them() {
    let page = "# Getting started\n## `kind = \"amqp\"`: a RabbitMQ queue\n## What's new?\n## What's new?\n";
    let anchors = links::anchors(page);
    for anchor in [
        "getting-started",
        "kind--amqp-a-rabbitmq-queue",
        "whats-new",
        "whats-new-1",
    ] {
        assert!(anchors.contains(anchor), "{anchor} not in {anchors:?}");
    }
}

#[test]
fn every_page_of_docs_is_in_the_books_table_of_contents() {
    let root = repo_root();
    let summary = read("docs/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links::links(&summary)
        .into_iter()
        .map(|(_, link)| root.join("docs").join(link.split('#').next().unwrap()))
        .collect();
    let missing: Vec<String> = markdown_files(&root)
        .into_iter()
        .filter(|f| f.starts_with(root.join("docs")) && !f.ends_with("docs/SUMMARY.md"))
        .filter(|f| !listed.contains(f))
        .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in docs/SUMMARY.md: {missing:?}"
    );
}

// --- configuration -------------------------------------------------------------

/// Every key the configuration reference documents: the first cell of
/// each table row, when it is one code span.
fn documented_config_keys() -> BTreeSet<String> {
    table_rows(&read("docs/reference/configuration.md"))
        .iter()
        .filter_map(|row| sole_code_span(&row[0]))
        .collect()
}

#[test]
fn the_configuration_reference_lists_exactly_the_keys_the_config_types_accept() {
    let accepted = config_keys::accepted_keys();
    assert!(
        accepted.len() > 50 && accepted.contains("delivery.lease"),
        "the probe found too little: {accepted:?}"
    );
    let documented = documented_config_keys();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/reference/configuration.md is out of step with the config types:\n\
         accepted by the code, not documented: {undocumented:?}\n\
         documented, not accepted by the code: {unknown:?}"
    );
}

// --- metrics and readiness -------------------------------------------------------

/// `(name as scraped, type)` of every family the daemon's registry holds,
/// counters with their `_total`.
fn registered_families() -> BTreeMap<String, String> {
    let metrics = outboxd::metrics::Metrics::new();
    let scraped = |name: &str, kind: &str| {
        if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        }
    };
    let families: BTreeMap<String, String> = metrics
        .families()
        .iter()
        .map(|f| (scraped(&f.name, f.kind), f.kind.to_string()))
        .collect();
    // The list is the registry's: every family the exposition shows is on it.
    for line in metrics.encode().lines() {
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) {
            assert_eq!(
                families.get(&scraped(name, kind)).map(String::as_str),
                Some(kind),
                "{name} is in the exposition but not in Metrics::families"
            );
        }
    }
    families
}

#[test]
fn the_metrics_reference_lists_every_family_the_registry_has() {
    let registered = registered_families();
    assert!(registered.len() > 20, "{registered:?}");
    let mut documented = BTreeMap::new();
    for row in table_rows(&read("docs/reference/metrics.md")) {
        for name in code_spans(&row[0]) {
            if name.starts_with("outboxd_") || name.starts_with("messaging_") {
                documented.insert(name, row.get(1).cloned().unwrap_or_default());
            }
        }
    }
    let mut problems = Vec::new();
    for (name, kind) in &registered {
        match documented.get(name) {
            None => problems.push(format!("{name} ({kind}) is registered but not documented")),
            Some(doc) if doc != kind => {
                problems.push(format!("{name} is a {kind}, documented as a {doc}"))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !registered.contains_key(name) {
            problems.push(format!("{name} is documented but not registered"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/reference/metrics.md:\n{}",
        problems.join("\n")
    );
}

/// The field paths of a `/ready` body: objects' keys dotted, a by-name map
/// (`checks.workers.sinks`, `checks.sources.sources`) written `SINK` /
/// `NAME`, arrays `[]`.
fn field_paths(value: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let key = match path {
                    "checks.workers.sinks" => "SINK",
                    "checks.sources.sources" => "NAME",
                    _ => key.as_str(),
                };
                let child_path = if path.is_empty() {
                    key.to_string()
                } else {
                    format!("{path}.{key}")
                };
                out.insert(child_path.clone());
                field_paths(child, &child_path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                field_paths(item, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// Whether `field` is documented by `rows` (field → meaning): a row names
/// it, or the row of the longest documented prefix mentions its next part
/// as a code span.
fn documented_field(field: &str, rows: &BTreeMap<String, String>) -> bool {
    if rows.contains_key(field) {
        return true;
    }
    let plain = field.replace("[]", "");
    let parts: Vec<&str> = plain.split('.').collect();
    for n in (1..parts.len()).rev() {
        let prefix = parts[..n].join(".");
        if let Some(meaning) = rows.get(&prefix) {
            return code_spans(meaning).iter().any(|s| s == parts[n]);
        }
    }
    false
}

/// The test broker (`OUTBOXD_TEST_AMQP`, default the local RabbitMQ).
fn amqp_url() -> String {
    std::env::var("OUTBOXD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Delete what an `amqp` source declared for `queue` on the test broker.
async fn delete_source_objects(queue: &str, exchange: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.to_string(), format!("{queue}.dead")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for x in [exchange.to_string(), format!("{queue}.dead-letter")] {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = conn.close(0, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ready_reference_lists_every_field_a_running_daemon_reports() {
    // One sink loaded and one source consuming the test broker, so the
    // per-sink, per-source and queue fields are there.
    let plugins = common::PluginsDir::new();
    plugins.add_component("ok", &common::test_component("ok"), "");
    let tag = hex::encode(rand::random::<[u8; 4]>());
    let (queue, exchange) = (
        format!("outboxd-docs-q-{tag}"),
        format!("outboxd-docs-x-{tag}"),
    );
    let source_toml = format!(
        "kind = \"amqp\"\nurl = {:?}\nqueue = {queue:?}\n\
         [[bindings]]\nexchange = {exchange:?}\nrouting-keys = [\"docs.#\"]\n",
        amqp_url()
    );
    let source: outboxd::sources::SourceConfig = toml::from_str(&source_toml).unwrap();
    let daemon = common::TestDaemon::start_with(plugins.path(), move |c| {
        c.sources.insert("docs".into(), source);
    })
    .await;
    let ready = || async {
        daemon
            .http
            .get(format!("{}/ready", daemon.base))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let start = std::time::Instant::now();
    let mut body = ready().await;
    while body["checks"]["sources"]["ok"] != true && start.elapsed().as_secs() < 30 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        body = ready().await;
    }
    delete_source_objects(&queue, &exchange).await;
    assert_eq!(body["ready"], true, "{body:#}");
    let mut reported = BTreeSet::new();
    field_paths(&body, "", &mut reported);
    assert!(
        reported.contains("checks.workers.sinks.SINK.heartbeat_age_ms"),
        "{body:#}"
    );

    let rows: BTreeMap<String, String> = table_rows(&read("docs/reference/metrics.md"))
        .into_iter()
        .filter_map(|row| Some((sole_code_span(&row[0])?, row.get(1)?.clone())))
        .filter(|(field, _)| !field.starts_with("outboxd_"))
        .collect();
    let undocumented: Vec<&String> = reported
        .iter()
        .filter(|f| !documented_field(f, &rows))
        .collect();
    // Every check the reference names is one the daemon reports.
    let checks = |fields: &mut dyn Iterator<Item = &String>| -> BTreeSet<String> {
        fields
            .filter_map(|f| f.strip_prefix("checks."))
            .map(|f| f.split('.').next().unwrap().to_string())
            .collect()
    };
    let reported_checks = checks(&mut reported.iter());
    let documented_checks = checks(&mut rows.keys());
    assert!(
        undocumented.is_empty() && reported_checks == documented_checks,
        "docs/reference/metrics.md is out of step with /ready:\n\
         reported, not documented: {undocumented:?}\n\
         checks reported: {reported_checks:?}\nchecks documented: {documented_checks:?}\n\
         body: {body:#}"
    );
}

// --- examples ----------------------------------------------------------------------

/// Every fenced block of the README and the manual, with its file.
fn every_block() -> Vec<(PathBuf, Block)> {
    let root = repo_root();
    markdown_files(&root)
        .into_iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            blocks::fenced(&text)
                .into_iter()
                .map(move |b| (file.clone(), b))
        })
        .collect()
}

/// `file:line` relative to the repository.
fn place(file: &Path, line: usize) -> String {
    let file = file.strip_prefix(repo_root()).unwrap_or(file);
    format!("{}:{line}", file.display())
}

/// Load `text` as `outboxd run` would, with the real binary: `outboxd
/// config show --config FILE` reads the file, merges the environment and
/// makes every check the start makes (types, unknown keys, values). A
/// `${VAR}` of the example is given a value as its deployment would
/// (`*_URL`: a broker URL; otherwise a secret), and so is the admin token
/// the deploy files take from `outboxd.env`.
fn check_config(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("outboxd.toml");
    std::fs::write(&file, text).unwrap();
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    run.arg("--config")
        .arg(&file)
        .args(["config", "show"])
        .current_dir(dir.path());
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") {
            run.env_remove(key);
        }
    }
    run.env("OUTBOXD_ADMIN__TOKEN", "example-admin-token");
    for reference in text.split("${").skip(1) {
        let name: String = reference
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let value = if name.ends_with("_URL") {
            "amqp://outboxd:example@127.0.0.1:5672/%2f"
        } else {
            "example-secret-value"
        };
        run.env(name, value);
    }
    let out = run.output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Parse `text` as a plugin manifest (a `${VAR}` the environment lacks is
/// allowed, as `outboxd plugin check` allows it).
fn check_manifest(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("example.toml");
    std::fs::write(&file, text).unwrap();
    outboxd::plugin::manifest::Manifest::load_unresolved(&file)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn every_toml_example_parses_as_outboxd_configuration_or_a_manifest() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (file, block) in every_block().into_iter().filter(|(_, b)| b.is("toml")) {
        let result = if block.tagged("manifest") {
            check_manifest(&block.text)
        } else {
            check_config(&block.text)
        };
        checked += 1;
        if let Err(e) = result {
            failures.push(format!("{}: {e}", place(&file, block.line)));
        }
    }
    // The deploy files the manual points to are examples too.
    let deploy = repo_root().join("deploy");
    for (path, manifest) in [
        ("embedded.toml", false),
        ("postgres.toml", false),
        ("replicas.toml", false),
        ("vault/outboxd.toml", false),
        ("couchdb-outbox/outboxd.toml", false),
        ("couchdb-outbox/amqp.toml", true),
        ("couchdb-outbox/couchdb-mark.toml", true),
    ] {
        let text = std::fs::read_to_string(deploy.join(path)).unwrap();
        let result = if manifest {
            check_manifest(&text)
        } else {
            check_config(&text)
        };
        checked += 1;
        if let Err(e) = result {
            failures.push(format!("deploy/{path}: {e}"));
        }
    }
    assert!(checked > 10, "only {checked} examples found");
    assert!(
        failures.is_empty(),
        "examples that do not parse:\n{}",
        failures.join("\n")
    );
}

/// The commands and expected output of a `console` block: each `$ ` line
/// is a command, a `> ` line right after it (the shell's prompt for more)
/// goes on with it, and the lines up to the next command are its standard
/// output.
fn console_steps(text: &str) -> Vec<(String, String)> {
    let mut steps: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push((command.to_string(), String::new()));
        } else if let Some((command, out)) = steps.last_mut() {
            match line.strip_prefix("> ") {
                Some(more) if out.is_empty() => {
                    command.push('\n');
                    command.push_str(more);
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    steps
}

/// Run a `console` example's command with bash in `dir`, `outboxd` being
/// the binary under test and no `OUTBOXD_*` of the test's environment
/// (the example shows what a new user sees). With `daemon`, the address
/// the examples use (`127.0.0.1:8080`) is the test daemon's, for `curl`
/// and for the CLI (`OUTBOXD_LISTEN`).
fn run_console_command(command: &str, dir: &Path, daemon: Option<&str>) -> std::process::Output {
    let binary = Path::new(env!("CARGO_BIN_EXE_outboxd"));
    let mut command = command.to_string();
    let mut run = std::process::Command::new("bash");
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") {
            run.env_remove(key);
        }
    }
    if let Some(addr) = daemon {
        command = command.replace("127.0.0.1:8080", addr);
        run.env("OUTBOXD_LISTEN", addr);
    }
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run.args(["-euo", "pipefail", "-c", &command])
        .env("PATH", path)
        .current_dir(dir);
    run.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_example_runs_and_prints_what_the_page_shows() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for (file, block) in every_block().into_iter().filter(|(_, b)| b.is("console")) {
        // A daemon of its own for the examples that talk to one; a fresh
        // folder for each block.
        let plugins = common::PluginsDir::new();
        let daemon = if block.tagged("daemon") {
            Some(common::TestDaemon::start(plugins.path()).await)
        } else {
            None
        };
        let addr = daemon
            .as_ref()
            .map(|d| d.base.trim_start_matches("http://").to_string());
        let dir = tempfile::tempdir().unwrap();
        for (command, expected) in console_steps(&block.text) {
            assert!(
                command.starts_with("outboxd ") || command.starts_with("curl "),
                "{}: a console example runs outboxd or curl: {command}",
                place(&file, block.line)
            );
            let (cmd, folder, at) = (command.clone(), dir.path().to_path_buf(), addr.clone());
            let out = tokio::task::spawn_blocking(move || {
                run_console_command(&cmd, &folder, at.as_deref())
            })
            .await
            .unwrap();
            ran += 1;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || stdout.trim_end() != expected.trim_end() {
                failures.push(format!(
                    "{}: `{command}` exited {} and printed:\n{stdout}{}\nthe page shows:\n{expected}",
                    place(&file, block.line),
                    out.status,
                    String::from_utf8_lossy(&out.stderr),
                ));
            }
        }
    }
    assert!(ran > 1, "no console example found");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Each SQL example calling `outboxd.enqueue` runs on a freshly migrated
/// PostgreSQL database of its own, beside the application's `orders` table
/// the examples update, and stores the event it shows (`order-42-paid` on
/// stream `orders/42`).
#[tokio::test]
async fn the_in_transaction_enqueue_examples_run_on_a_migrated_postgresql() {
    use sqlx::Connection;
    let examples: Vec<(PathBuf, Block)> = every_block()
        .into_iter()
        .filter(|(_, b)| b.is("sql") && b.text.contains("outboxd.enqueue("))
        .collect();
    assert!(!examples.is_empty(), "no SQL example calls outboxd.enqueue");
    for (file, block) in examples {
        let at = place(&file, block.line);
        let db = common::TestDb::new(common::Backend::Postgres).await;
        db.store().await;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (id int PRIMARY KEY, state text); \
             INSERT INTO orders VALUES (42, 'new')",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        if let Err(e) = sqlx::raw_sql(&block.text).execute(&mut conn).await {
            panic!("{at}: {e}");
        }
        let (stream, sequence): (String, i64) = sqlx::query_as(
            "SELECT stream, sequence FROM outboxd.events WHERE id = 'order-42-paid'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{at}: no event stored: {e}"));
        assert_eq!((stream.as_str(), sequence), ("orders/42", 1), "{at}");
        if block.text.contains("UPDATE orders") {
            let state: String = sqlx::query_scalar("SELECT state FROM orders WHERE id = 42")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert_eq!(state, "paid", "{at}");
        }
        conn.close().await.unwrap();
        db.cleanup().await;
    }
}
