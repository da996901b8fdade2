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
    assert!(out.status.success(), "check refused a sound component:\n{text}");
    assert!(text.contains("verdict: ok"), "{text}");
    assert!(text.contains("imports:") && text.contains("exports:"), "{text}");
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
        &[("OUTBOXD_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
        &[],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("verdict: ok"), "{text}");
    assert!(!text.contains("needs at start"), "{text}");
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
