//! `outboxd plugin check`: the component's verdict apart from the
//! environment the daemon will need, run as a user runs it (the binary, on
//! the shipped plugins built from source).

mod common;

use std::path::Path;
use std::process::Output;

fn check(wasm: &Path, env: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    command.args(["plugin", "check"]).arg(wasm);
    for (k, v) in env {
        command.env(k, v);
    }
    for k in unset {
        command.env_remove(k);
    }
    command.output().expect("run outboxd plugin check")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn an_unset_secret_is_named_as_needed_at_start_not_a_refusal() {
    let plugins = common::built_plugins();
    let out = check(
        &plugins.join("webhook.wasm"),
        &[],
        &["OUTBOXD_WEBHOOK_SECRET"],
    );
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "check refused a sound component:\n{text}"
    );
    assert!(text.contains("verdict: ok"), "{text}");
    assert!(
        text.contains("imports:") && text.contains("exports:"),
        "{text}"
    );
    let needs = text
        .split_once("needs at start:")
        .unwrap_or_else(|| panic!("no `needs at start` section:\n{text}"))
        .1;
    assert!(
        needs.contains("OUTBOXD_WEBHOOK_SECRET (for config.secret)"),
        "{text}"
    );
}

#[test]
fn with_the_environment_set_nothing_is_needed() {
    let plugins = common::built_plugins();
    let out = check(
        &plugins.join("webhook.wasm"),
        &[(
            "OUTBOXD_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )],
        &[],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("verdict: ok"), "{text}");
    assert!(!text.contains("needs at start"), "{text}");
}

/// The SHA-256 `check` prints is the file's, as `sha256sum` prints it: what
/// `outboxd sinks list` shows for the version a daemon runs.
#[test]
fn the_components_sha256_is_printed_as_sha256sum_prints_it() {
    use sha2::Digest;
    let plugins = common::built_plugins();
    let wasm = plugins.join("webhook.wasm");
    let out = check(
        &wasm,
        &[(
            "OUTBOXD_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )],
        &[],
    );
    let text = stdout(&out);
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&wasm).unwrap()));
    assert!(text.contains(&format!("wasm_sha256: {sha}\n")), "{text}");
}

#[test]
fn a_broken_manifest_is_still_refused_with_the_key_named() {
    let plugins = common::built_plugins();
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("webhook.wasm");
    std::fs::copy(plugins.join("webhook.wasm"), &wasm).unwrap();
    std::fs::write(
        dir.path().join("webhook.toml"),
        "name = \"webhook\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n\
         [capabilities]\nhttp = [\"http://127.0.0.1:9\"]\n\
         [config]\nurl = \"${NOT A VARIABLE}\"\n",
    )
    .unwrap();
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verdict: refused"), "{text}");
    assert!(text.contains("config.url"), "{text}");
}

#[test]
fn a_file_that_is_not_a_component_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("junk.wasm");
    std::fs::write(&wasm, b"not wasm at all").unwrap();
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verdict: refused"), "{text}");
}

/// A plugins folder with the shipped webhook component and `manifest` as
/// its manifest.
fn webhook_with(manifest: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let plugins = common::built_plugins();
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("webhook.wasm");
    std::fs::copy(plugins.join("webhook.wasm"), &wasm).unwrap();
    std::fs::write(dir.path().join("webhook.toml"), manifest).unwrap();
    (dir, wasm)
}

const WEBHOOK_HEAD: &str = "name = \"webhook\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n";
const WEBHOOK_GRANTS: &str = "[capabilities]\nhttp = [\"http://127.0.0.1:9\"]\n";
const WEBHOOK_CONFIG: &str = "[config]\nurl = \"http://127.0.0.1:9/hook\"\n\
                              secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";

#[test]
fn a_deadline_the_configured_lease_cannot_cover_is_refused_as_the_daemon_would() {
    let (dir, wasm) = webhook_with(&format!(
        "{WEBHOOK_HEAD}[limits]\ndeadline = \"60s\"\n{WEBHOOK_GRANTS}{WEBHOOK_CONFIG}"
    ));
    // The default lease (70 s) cannot cover a 60 s deadline (2 × 60 s + 5 s).
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verdict: refused"), "{text}");
    assert!(
        text.contains("delivery.lease 1m 10s") && text.contains("at least 2m 5s"),
        "{text}"
    );
    // With the daemon's configuration giving a long enough lease, it passes:
    // the check reads the configured lease, not a constant.
    let config = dir.path().join("outboxd.toml");
    std::fs::write(&config, "[delivery]\nlease = \"3m\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["plugin", "check"])
        .arg(&wasm)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("verdict: ok"), "{text}");
}

#[test]
fn a_manifest_missing_a_key_init_requires_is_refused_with_inits_reason() {
    let (_dir, wasm) = webhook_with(&format!(
        "{WEBHOOK_HEAD}{WEBHOOK_GRANTS}[config]\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
    ));
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verdict: refused"), "{text}");
    assert!(
        text.contains("init refused the manifest's configuration: config key `url` is required"),
        "{text}"
    );
}

#[test]
fn a_complete_manifest_passes_init() {
    let (_dir, wasm) = webhook_with(&format!("{WEBHOOK_HEAD}{WEBHOOK_GRANTS}{WEBHOOK_CONFIG}"));
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("init: ok"), "{text}");
    assert!(text.contains("verdict: ok"), "{text}");
}

/// A component from component-model text, written to a `.wasm` file.
fn component_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, wat::parse_str(text).unwrap()).unwrap();
    path
}

#[test]
fn an_import_the_host_does_not_provide_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let made_up = component_file(
        dir.path(),
        "madeup",
        r#"(component (import "example:made-up/poke" (instance (export "poke" (func)))))"#,
    );
    let out = check(&made_up, &[], &[]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(
            "imports `example:made-up/poke` (its `poke`), which this host does not provide"
        ),
        "{text}"
    );
    // A known interface lacking a member: the member is named too.
    let lacking = component_file(
        dir.path(),
        "lacking",
        r#"(component (import "wasi:cli/environment@0.2.0" (instance (export "poke" (func)))))"#,
    );
    let text = stdout(&check(&lacking, &[], &[]));
    assert!(
        text.contains("`wasi:cli/environment@0.2.0` (its `poke`)"),
        "{text}"
    );
}

#[test]
fn a_component_importing_wasi_sockets_passes_with_a_note_that_sockets_are_denied() {
    let sockets = common::test_component("sockets");
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("sockets.wasm");
    std::fs::copy(&sockets, &wasm).unwrap();
    std::fs::write(
        dir.path().join("sockets.toml"),
        "name = \"sockets\"\nversion = \"0.1.0\"\ncomponent = \"sockets.wasm\"\nwit = \"outboxd:sink@0.1.0\"\n[config]\naddr = \"127.0.0.1:9\"\n",
    )
    .unwrap();
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("wasi:sockets/tcp"), "{text}");
    assert!(
        text.contains("(linked; every socket call is denied)"),
        "{text}"
    );
    assert!(
        text.contains(
            "note: it imports wasi:sockets, which is linked with every socket call denied"
        ),
        "{text}"
    );
}

/// `check` calls `init` only: a plugin's per-batch log lines (here
/// `logforge`'s, written from `deliver`) do not show, so nothing like an
/// unexplained `0 of 0 events delivered` appears.
#[test]
fn check_calls_init_without_deliver() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("logforge.wasm");
    std::fs::copy(common::test_component("logforge"), &wasm).unwrap();
    let out = check(&wasm, &[], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("init: ok"), "{text}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !log.contains("FORGED") && !log.contains("plugin="),
        "deliver ran during check:\n{log}"
    );
}

/// Log lines written to a pipe (not a terminal) carry no ANSI colour.
#[test]
fn logs_off_a_terminal_carry_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("ok.wasm");
    std::fs::copy(common::test_component("ok"), &wasm).unwrap();
    let out = check(&wasm, &[("RUST_LOG", "debug")], &[]);
    assert!(out.status.success(), "{}", stdout(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("DEBUG"), "no log line to look at:\n{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a pipe:\n{log:?}");
}

/// On a terminal (a pseudo-terminal from util-linux `script`) log lines are
/// coloured, unless `NO_COLOR` is set (<https://no-color.org>).
#[test]
fn on_a_terminal_logs_are_coloured_unless_no_color_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("ok.wasm");
    std::fs::copy(common::test_component("ok"), &wasm).unwrap();
    let on_a_terminal = |no_color: Option<&str>| {
        let mut command = std::process::Command::new("script");
        // -q: no banner; -e: the child's exit status; -c: the command.
        command
            .args(["-q", "-e", "-c"])
            .arg(format!(
                "'{}' plugin check '{}'",
                env!("CARGO_BIN_EXE_outboxd"),
                wasm.display()
            ))
            .arg("/dev/null")
            .env("RUST_LOG", "debug");
        match no_color {
            Some(value) => command.env("NO_COLOR", value),
            None => command.env_remove("NO_COLOR"),
        };
        let out = command.output().expect("run util-linux `script`");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        assert!(text.contains("DEBUG"), "no log line to look at:\n{text}");
        text
    };
    let plain = on_a_terminal(None);
    assert!(
        plain.contains("\u{1b}["),
        "no colour on a terminal:\n{plain:?}"
    );
    let empty = on_a_terminal(Some(""));
    assert!(
        empty.contains("\u{1b}["),
        "an empty NO_COLOR is unset:\n{empty:?}"
    );
    let no_color = on_a_terminal(Some("1"));
    assert!(
        !no_color.contains('\u{1b}'),
        "colour despite NO_COLOR=1:\n{no_color:?}"
    );
}

/// A `[config]` URL outside `capabilities.http` — resolved as the daemon
/// resolves it, `${VAR}` included — is refused, naming the key, the origin
/// and the grant: every request to it would be denied.
#[test]
fn a_config_url_outside_the_grant_is_refused_naming_it_and_the_grant() {
    let plugins = common::built_plugins();
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("webhook.wasm");
    std::fs::copy(plugins.join("webhook.wasm"), &wasm).unwrap();
    std::fs::write(
        dir.path().join("webhook.toml"),
        "name = \"webhook\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n\
         [capabilities]\nhttp = [\"${HOOK_ALLOW:-http://127.0.0.1:9}\"]\n\
         [config]\nurl = \"${HOOK_URL:-http://127.0.0.1:9/hook}\"\n\
         secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
    )
    .unwrap();
    // The defaults agree: accepted.
    let out = check(&wasm, &[], &["HOOK_URL", "HOOK_ALLOW"]);
    assert!(out.status.success(), "{}", stdout(&out));
    // The environment moves the URL elsewhere: refused.
    let out = check(
        &wasm,
        &[("HOOK_URL", "http://127.0.0.1:8081/hook?token=s3cret")],
        &["HOOK_ALLOW"],
    );
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("verdict: refused"), "{text}");
    assert!(
        text.contains("config.url is a URL outside the manifest's grant")
            && text.contains("http://127.0.0.1:8081 is not in the plugin's allow-list")
            && text.contains("capabilities.http = [\"http://127.0.0.1:9\"]"),
        "{text}"
    );
    assert!(
        !text.contains("s3cret"),
        "a config value was printed: {text}"
    );
}
