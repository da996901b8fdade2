//! The plugin host: sinks are WebAssembly components with a TOML manifest.
//!
//! Owns: finding plugins in the plugins directory (every `NAME.toml` with the
//! component it names, by default `NAME.wasm`), checking each against the
//! `outboxd:sink` world and its manifest's grants, and running batches in
//! the sandbox ([`runtime`]; compiled forms kept on disk by [`cache`]), with
//! outbound HTTP ([`egress`]) and AMQP ([`amqp`]) only as far as the
//! manifest grants. The generated bindings ([`bindings`]) and every host
//! function they call for ([`host_state`]; the `http-batch` imports, which
//! read requests in place, [`batch_imports`]) sit side by side. A plugin that
//! fails to load is reported with its file and the reason; the others load
//! regardless.
//!
//! Inside, imports go one way: `registry`, `check` and `trial` use this
//! module's loading; `runtime` uses `host_state` and `batch_imports`,
//! which use `egress`,
//! `amqp`, `log_limit` and the bindings; `egress`, `amqp` and `manifest`
//! use nothing above them.
//!
//! Must never: decide retries, leases or durability (the delivery engine
//! owns those; the one outcome the host sets is a `reject` for a batch
//! whose every request the manifest denied, see [`runtime`]), or let one
//! plugin's failure affect another.

pub mod amqp;
pub mod batch_imports;
pub mod bindings;
pub mod cache;
pub mod check;
pub mod egress;
pub mod guest_text;
pub mod host_state;
pub mod log_limit;
pub mod manifest;
pub mod registry;
pub mod runtime;
pub mod scaffold;
pub mod trace;
pub mod trial;
pub mod wit;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use manifest::Manifest;
pub use runtime::{Plugin, Runtime, SinkFailure, TrapKind, DAEMON_POOL_SLOTS};

/// A plugin that could not be loaded, and why.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The manifest or component file at fault.
    pub file: PathBuf,
    /// The manifest the plugin was loaded from.
    pub manifest: PathBuf,
    /// Sink name, when the manifest could be read.
    pub name: Option<String>,
    /// Why it was refused.
    pub reason: String,
}

/// The plugins found in a directory.
#[derive(Clone, Default)]
pub struct Plugins {
    /// Loaded sinks by name.
    pub loaded: BTreeMap<String, Plugin>,
    /// Plugins refused at load.
    pub failed: Vec<LoadFailure>,
}

impl Plugins {
    /// Names of every sink with a readable manifest, loaded or not. Routes
    /// may name these; deliveries to a sink that failed to load wait.
    pub fn known_sinks(&self) -> Vec<String> {
        let mut names: Vec<String> = self.loaded.keys().cloned().collect();
        names.extend(self.failed.iter().filter_map(|f| f.name.clone()));
        names.sort();
        names.dedup();
        names
    }
}

/// Load every plugin in `dir`. A missing directory yields no plugins (and
/// is logged); each refused plugin is logged with its reason.
pub fn load_dir(runtime: &Runtime, dir: &Path) -> Plugins {
    let mut plugins = Plugins::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "plugins directory not readable: {e}; no sinks loaded");
            return plugins;
        }
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let manifests: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    for path in &files {
        if path.extension().is_some_and(|e| e == "wasm")
            && !manifests.iter().any(|m| m.with_extension("wasm") == *path)
        {
            // A component without a manifest of the same name may still be
            // named by another manifest's `component`; only note it.
            tracing::debug!(file = %path.display(), "component without a manifest of the same name");
        }
    }
    for path in manifests {
        match load_one(runtime, path) {
            Ok(plugin) => {
                let name = plugin.name().to_string();
                if plugins.loaded.contains_key(&name) {
                    let reason = format!("sink name {name:?} is already used by another manifest");
                    tracing::error!(file = %path.display(), "plugin refused: {reason}");
                    plugins.failed.push(LoadFailure {
                        file: path.clone(),
                        manifest: path.clone(),
                        name: None,
                        reason,
                    });
                    continue;
                }
                let component = match plugin.manifest().component_path() {
                    Some(path) => path.display().to_string(),
                    None => format!("builtin {:?}", plugin.manifest().builtin),
                };
                tracing::info!(
                    sink = %name,
                    version = %plugin.manifest().version,
                    %component,
                    "plugin loaded"
                );
                plugins.loaded.insert(name, plugin);
            }
            Err(failure) => {
                tracing::error!(file = %failure.file.display(), "plugin refused: {}", failure.reason);
                plugins.failed.push(failure);
            }
        }
    }
    plugins
}

/// Load one plugin from its manifest.
pub fn load_one(runtime: &Runtime, manifest_path: &Path) -> Result<Plugin, LoadFailure> {
    let manifest = Manifest::load(manifest_path).map_err(|e| LoadFailure {
        file: manifest_path.to_path_buf(),
        manifest: manifest_path.to_path_buf(),
        name: None,
        reason: e.to_string(),
    })?;
    let name = Some(manifest.name.clone());
    if let Some(builtin) = manifest.builtin {
        return Ok(runtime.builtin(manifest, builtin));
    }
    let component_path = manifest
        .component_path()
        .expect("a manifest without builtin names its component")
        .to_path_buf();
    let fail = |reason: String| LoadFailure {
        file: component_path.clone(),
        manifest: manifest_path.to_path_buf(),
        name: name.clone(),
        reason,
    };
    let bytes =
        std::fs::read(&component_path).map_err(|e| fail(format!("cannot read component: {e}")))?;
    let component = compile_checked(runtime, &bytes).map_err(fail)?;
    runtime
        .prepare(manifest, &component)
        .map_err(|reason| LoadFailure {
            file: component_path.clone(),
            manifest: manifest_path.to_path_buf(),
            name: name.clone(),
            reason,
        })
}

/// Compile bytes that must be a WebAssembly component (not a core module,
/// not anything else). The error says which.
pub fn compile_checked(
    runtime: &Runtime,
    bytes: &[u8],
) -> Result<wasmtime::component::Component, String> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    // Layer field: 0 for a core module, 1 for a component.
    if bytes[6..8] == [0, 0] {
        return Err("a core WebAssembly module, not a component (build for wasm32-wasip2 or run `wasm-tools component new`)".into());
    }
    runtime
        .compile(bytes)
        .map_err(|e| format!("not a valid component: {e:#}"))
}
