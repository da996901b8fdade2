//! The `outboxd` command line as a user types it: global options before or
//! after the subcommand, and admin commands that never create state.

use std::process::Output;

fn outboxd(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .env_remove("OUTBOXD_CONFIG")
        .env_remove("OUTBOXD_DATA_DIR")
        .env_remove("OUTBOXD_DATABASE_URL")
        .output()
        .expect("run outboxd")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn global_options_stand_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let migrated = outboxd(&["migrate", "--data-dir", data]);
    assert!(migrated.status.success(), "{}", text(&migrated));
    for args in [
        vec!["dead", "list", "--data-dir", data],
        vec!["dead", "--data-dir", data, "list"],
        vec!["--data-dir", data, "dead", "list"],
        vec!["events", "show", "nope", "--data-dir", data],
        vec!["events", "--data-dir", data, "show", "nope"],
    ] {
        let out = outboxd(&args);
        let all = text(&out);
        assert!(
            !all.contains("unexpected argument"),
            "`outboxd {}` refused its option: {all}",
            args.join(" ")
        );
        if args.contains(&"events") {
            assert!(all.contains("no event with id \"nope\""), "{all}");
        } else {
            assert!(out.status.success(), "`outboxd {}`: {all}", args.join(" "));
        }
    }
}

#[test]
fn an_admin_command_where_no_database_exists_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for args in [
        vec!["events", "show", "some-id"],
        vec!["dead", "list"],
        vec!["sinks", "pause", "webhook"],
    ] {
        let mut args = args.clone();
        args.extend(["--data-dir", data.to_str().unwrap()]);
        let out = outboxd(&args);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(all.contains("no database at"), "{all}");
        assert!(
            !data.exists(),
            "`outboxd {}` created {}",
            args.join(" "),
            data.display()
        );
    }
}
