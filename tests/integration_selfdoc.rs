//! The command line documents itself: `outboxd completions SHELL` gives a
//! script the shell accepts and that completes the real subcommands,
//! `outboxd man` a man page `man` renders with every subcommand (one page
//! per command with `--out`), and `docs/reference/cli.md` holds exactly
//! what `outboxd man --markdown` renders from the same clap Command.
//!
//! The list of subcommands the checks compare against is read from
//! `outboxd --help`, clap's own rendering, not from the code under test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `outboxd ARGS` with no `OUTBOXD_*` variable of the caller's.
fn outboxd(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OUTBOXD_") {
            command.env_remove(key);
        }
    }
    let out = command.args(args).output().expect("run outboxd");
    assert!(
        out.status.success(),
        "outboxd {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// The subcommands `outboxd ARGS --help` lists (clap's `Commands:`
/// section), without `help`.
fn subcommands_of(args: &[&str]) -> Vec<String> {
    let mut with_help = args.to_vec();
    with_help.push("--help");
    let help = stdout(&outboxd(&with_help));
    let Some((_, commands)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    commands
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path below the top (`["plugin"]`, `["plugin", "check"]`,
/// …), as `--help` lists them.
fn every_command() -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut todo: Vec<Vec<String>> = subcommands_of(&[]).into_iter().map(|n| vec![n]).collect();
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for sub in subcommands_of(&args) {
            let mut child = path.clone();
            child.push(sub);
            todo.push(child);
        }
        all.push(path);
    }
    all.sort();
    all
}

#[test]
fn the_help_lists_the_self_documenting_commands() {
    let top = subcommands_of(&[]);
    for name in ["run", "plugin", "dead", "completions", "man", "health"] {
        assert!(
            top.contains(&name.to_string()),
            "{name} missing from {top:?}"
        );
    }
}

#[test]
fn bash_completions_are_a_script_bash_accepts_and_that_completes_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("outboxd.bash");
    std::fs::write(&script, outboxd(&["completions", "bash"]).stdout).unwrap();
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        syntax.status.success(),
        "bash -n refused the script: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    // Complete `outboxd <TAB>` and `outboxd plugin ch<TAB>` as bash would:
    // the function is called with the command, the word and the one before.
    let complete = |words: &str, cword: usize| -> Vec<String> {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{words}'; \
                 COMP_POINT=${{#COMP_LINE}}; \
                 _outboxd outboxd \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                script.display()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let top = complete("outboxd ''", 1);
    for name in subcommands_of(&[]) {
        assert!(top.contains(&name), "`outboxd <TAB>` lacks {name}: {top:?}");
    }
    assert_eq!(complete("outboxd plugin ch", 2), vec!["check".to_string()]);
}

#[test]
fn every_shell_gets_a_script_naming_the_subcommands() {
    let names = subcommands_of(&[]);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&outboxd(&["completions", shell]));
        for name in &names {
            assert!(script.contains(name.as_str()), "{shell}: no {name}");
        }
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("possible values"));
}

#[test]
fn the_man_page_renders_with_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("outboxd.1");
    let roff = stdout(&outboxd(&["man"]));
    assert!(
        roff.contains(".TH outboxd 1"),
        "{}",
        &roff[..200.min(roff.len())]
    );
    std::fs::write(&page, &roff).unwrap();
    let rendered = Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man (man-db) renders the page");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let text = String::from_utf8_lossy(&rendered.stdout);
    assert!(text.contains("SUBCOMMANDS"), "{text}");
    for name in subcommands_of(&[]) {
        assert!(
            text.contains(&format!("outboxd-{name}")),
            "the rendered page lacks {name}:\n{text}"
        );
    }
}

#[test]
fn man_out_writes_one_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    outboxd(&["man", "--out", out.to_str().unwrap()]);
    let mut pages: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let mut expected: Vec<String> = every_command()
        .iter()
        .map(|path| format!("outboxd-{}.1", path.join("-")))
        .collect();
    expected.push("outboxd.1".into());
    expected.sort();
    assert_eq!(pages, expected);
    let check = std::fs::read_to_string(out.join("outboxd-plugin-check.1")).unwrap();
    assert!(check.contains("manifest"), "{check}");
}

/// `docs/reference/cli.md`'s generated part, between the markers.
fn committed_reference() -> (String, String) {
    let path = repo_root().join("docs/reference/cli.md");
    let page = std::fs::read_to_string(&path).expect("docs/reference/cli.md");
    let begin = page
        .find("<!-- generated by `outboxd man --markdown`")
        .expect("the page has its begin marker");
    let end_marker = "<!-- end of the generated part -->\n";
    let end = page.find(end_marker).expect("the page has its end marker") + end_marker.len();
    (page.clone(), page[begin..end].to_string())
}

#[test]
fn the_cli_reference_is_what_the_cli_renders() {
    let rendered = stdout(&outboxd(&["man", "--markdown"]));
    let (page, committed) = committed_reference();
    if committed != rendered && std::env::var_os("UPDATE_CLI_REFERENCE").is_some() {
        let path = repo_root().join("docs/reference/cli.md");
        std::fs::write(&path, page.replace(&committed, &rendered)).unwrap();
        return;
    }
    assert!(
        committed == rendered,
        "docs/reference/cli.md is out of date with the CLI: rerun this test with \
         UPDATE_CLI_REFERENCE=1 to rewrite its generated part, and commit it"
    );
    for path in every_command() {
        let heading = format!("### `outboxd {}`", path.join(" "));
        assert!(committed.contains(&heading), "no {heading}");
    }
    for flag in [
        "--listen <LISTEN>",
        "--migrate",
        "--manifest <MANIFEST>",
        "--offline",
    ] {
        assert!(committed.contains(flag), "no {flag}");
    }
    // Every argument says what it is: its doc comment is its only
    // description, in --help, the man pages and here.
    let mut heading = "";
    let mut undocumented = Vec::new();
    for line in committed.lines() {
        if line.starts_with("### ") {
            heading = line;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((argument, meaning)) = row.split_once("` | ") else {
            continue;
        };
        let meaning = meaning.trim_end_matches('|').trim();
        let generated_only = [
            "Required.",
            "Default:",
            "One of",
            "May be given",
            "Environment:",
        ];
        if meaning.is_empty() || generated_only.iter().any(|g| meaning.starts_with(g)) {
            undocumented.push(format!("{heading}: {argument}"));
        }
    }
    assert!(
        undocumented.is_empty(),
        "arguments without a doc comment: {undocumented:#?}"
    );
}
