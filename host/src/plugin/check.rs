//! `outboxd plugin check FILE.wasm`: what a plugin author runs before
//! dropping a plugin in.
//!
//! Owns: printing a component's imports and exports, the verdict of the
//! same checks the daemon makes — at load (the component against the world,
//! the manifest's limits and grants), at start (the daemon's admission rule,
//! handed in by the caller, e.g. the deadline against the configured lease),
//! and at the first batch (`init` called in the sandbox with the resolved
//! configuration) — and, apart from that verdict, the manifest's `${VAR}`
//! references this shell leaves unset, named as what the daemon will need in
//! its environment at start.
//!
//! Must never: hand the plugin an event (`init` runs in the sandbox a batch
//! gets, and `deliver` is not called), or count an `init` refusal
//! caused by an unset `${VAR}` as the component's fault.

use std::path::Path;
use std::process::ExitCode;

use super::egress::EgressPolicy;
use super::manifest::Unresolved;
use super::{compile_checked, Manifest, Plugin, Runtime, SinkFailure};

/// Check `file` (with `manifest`, or the `.toml` beside it when present),
/// print the report on stdout, and return the exit code: success when the
/// component and its manifest pass the daemon's load checks, `admit` (the
/// daemon's start-time rule for a loaded plugin, with the configured lease)
/// accepts it, and `init` accepts the manifest's configuration. Unset
/// environment variables the manifest refers to do not fail the check (they
/// belong to the daemon's environment, not to the plugin); they are listed
/// under `needs at start`, and an `init` refusal while a `config` value is
/// unset is reported as a note, since the daemon would give `init` the
/// value.
pub async fn run(
    file: &Path,
    manifest: Option<&Path>,
    admit: &dyn Fn(&Plugin) -> Result<(), String>,
) -> ExitCode {
    match check(file, manifest, admit).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            println!("verdict: refused\n  {}: {reason}", file.display());
            ExitCode::FAILURE
        }
    }
}

/// The checks of [`run`], in the daemon's order; `Err` is the reason for
/// the refusal (printed after what was reported so far).
async fn check(
    file: &Path,
    manifest: Option<&Path>,
    admit: &dyn Fn(&Plugin) -> Result<(), String>,
) -> Result<(), String> {
    let runtime =
        Runtime::new().map_err(|e| format!("cannot start the WebAssembly runtime: {e:#}"))?;
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read: {e}"))?;
    let component = compile_checked(&runtime, &bytes)?;
    let ty = component.component_type();
    print_interface(file, &bytes, &ty, runtime.engine());
    let (manifest, unresolved) = manifest_for(file, manifest)?;
    let plugin = runtime.prepare(manifest, &component)?;
    if ty
        .imports(runtime.engine())
        .any(|(name, _)| name.starts_with("wasi:http/") || is_http_batch(name))
    {
        check_config_urls(plugin.manifest())?;
    }
    admit(&plugin)?;
    check_init(&plugin, &unresolved).await?;
    println!("verdict: ok (matches world outboxd:sink/sink)");
    if ty
        .imports(runtime.engine())
        .any(|(name, _)| name.starts_with("wasi:sockets/"))
    {
        println!(
            "note: it imports wasi:sockets, which is linked with every socket call denied \
             (access-denied): its only network is wasi:http, by capabilities.http"
        );
    }
    if !unresolved.is_empty() {
        println!("needs at start: the daemon refuses this manifest until its environment sets");
        for u in &unresolved {
            println!("  {} (for {})", u.var, u.key);
        }
    }
    Ok(())
}

/// Print the component's size, SHA-256 (hex, as `sha256sum` prints it and
/// as `outboxd sinks list` shows the version a daemon runs), imports (with
/// what limited ones give) and exports.
fn print_interface(
    file: &Path,
    bytes: &[u8],
    ty: &wasmtime::component::types::Component,
    engine: &wasmtime::Engine,
) {
    use sha2::Digest;
    println!("component: {} ({} bytes)", file.display(), bytes.len());
    println!("wasm_sha256: {}", hex::encode(sha2::Sha256::digest(bytes)));
    println!("imports:");
    for (name, _) in ty.imports(engine) {
        match import_note(name) {
            Some(note) => println!("  {name}  ({note})"),
            None => println!("  {name}"),
        }
    }
    println!("exports:");
    for (name, _) in ty.exports(engine) {
        println!("  {name}");
    }
}

/// The manifest to check with: `manifest`, else the `.toml` beside `file`,
/// else one granting nothing, named after the file. With it, the `${VAR}`
/// references this shell leaves unset.
fn manifest_for(
    file: &Path,
    manifest: Option<&Path>,
) -> Result<(Manifest, Vec<Unresolved>), String> {
    let manifest_path = manifest
        .map(Path::to_path_buf)
        .unwrap_or_else(|| file.with_extension("toml"));
    if manifest_path.exists() {
        let (m, missing) = Manifest::load_unresolved(&manifest_path).map_err(|e| e.to_string())?;
        println!(
            "manifest: {} (sink {:?}, version {})",
            manifest_path.display(),
            m.name,
            m.version
        );
        return Ok((m, missing));
    }
    println!(
        "manifest: none found at {}; checking with no capabilities granted",
        manifest_path.display()
    );
    let name: String = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin")
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let text = format!("name = {name:?}\nversion = \"0\"\nwit = \"outboxd:sink@0.1.0\"\n");
    let m = Manifest::parse(&text, file).map_err(|e| e.to_string())?;
    Ok((m, Vec::new()))
}

/// Refuse a `[config]` value that is an `http://` or `https://` URL (as the
/// daemon resolves it, `${VAR}`s included) outside `capabilities.http`:
/// every request to it would be denied, and the daemon would dead-letter
/// each event at its first attempt (`runtime::denied_by_manifest`). The
/// reason names the key, the URL's origin (never its path or query, which
/// may carry a token) and the grant.
fn check_config_urls(manifest: &Manifest) -> Result<(), String> {
    let policy = EgressPolicy::new(&manifest.capabilities.http)?;
    for (key, value) in &manifest.config {
        let lower = value.to_ascii_lowercase();
        if !lower.starts_with("http://") && !lower.starts_with("https://") {
            continue;
        }
        let Ok(uri) = value.parse::<http::Uri>() else {
            continue;
        };
        if let Err(reason) = policy.check(&uri) {
            return Err(format!(
                "config.{key} is a URL outside the manifest's grant: {reason} ({}); \
                 every request to it would be denied (HTTP-request-denied) and the daemon \
                 would dead-letter each event at its first attempt: add its origin to \
                 capabilities.http or fix config.{key}",
                policy.grant()
            ));
        }
    }
    Ok(())
}

/// Call `init` as the daemon does at the start of every batch, in the same
/// sandbox, without `deliver`: nothing is sent, and the plugin's
/// per-batch log lines (such as a count of events delivered) do not show.
/// A refusal while a `config` value is unset is only reported.
async fn check_init(plugin: &Plugin, unresolved: &[Unresolved]) -> Result<(), String> {
    let unset_config: Vec<&str> = unresolved
        .iter()
        .filter(|u| u.key.starts_with("config."))
        .map(|u| u.key.as_str())
        .collect();
    match plugin.init().await {
        Ok(()) => println!("init: ok (accepted the manifest's configuration)"),
        Err(SinkFailure::Init(reason)) if !unset_config.is_empty() => println!(
            "init: refused with {} left empty: {reason} (check again with the environment set)",
            unset_config.join(", ")
        ),
        Err(SinkFailure::Init(reason)) => {
            return Err(format!(
                "init refused the manifest's configuration: {reason} \
                 (the daemon would fail every batch of this sink with it)"
            ))
        }
        Err(trap) => {
            return Err(format!(
                "init failed in the sandbox: {trap} (the daemon would fail every batch of this sink with it)"
            ))
        }
    }
    Ok(())
}

/// Whether `name` is outboxd's own batch HTTP interface (any version).
fn is_http_batch(name: &str) -> bool {
    name.starts_with("outboxd:sink/http-batch")
}

/// What an import gives a plugin, where that is less (or other) than its
/// name says
/// (docs/plugins.md, "What a plugin can reach").
fn import_note(name: &str) -> Option<&'static str> {
    if name.starts_with("wasi:sockets/") {
        Some("linked; every socket call is denied")
    } else if name.starts_with("wasi:filesystem/") {
        Some("linked; no directory is open")
    } else if name.starts_with("wasi:cli/environment") {
        Some("linked; no variables, no arguments")
    } else if is_http_batch(name) {
        Some("many requests per call, to capabilities.http only")
    } else {
        None
    }
}
