//! The live set of sinks, and reloading it when the plugins directory
//! changes.
//!
//! Owns: which plugin version serves each sink right now — one `watch`
//! channel per sink, read by that sink's delivery loop before every batch —
//! watching the plugins directory (the `notify` crate; changes only, never
//! reads; debounced by [`DEBOUNCE`]), and what a rescan decides for each manifest:
//!
//! - unchanged (same manifest and component bytes): nothing;
//! - new: load, admit, start its delivery loop;
//! - changed: load and admit the new version; new batches run on it, a
//!   batch in flight finishes on the old one (it holds its own handle);
//! - refused (unreadable, not a component, not the world, not admitted):
//!   the version already serving keeps serving, and the refusal is
//!   reported (logs, `/ready`, `outboxd_plugin_load_failures_total`);
//! - gone: the sink is parked — its loop stops claiming and its deliveries
//!   wait, with reason `sink removed` — and resumes when a manifest of that
//!   name comes back.
//!
//! Must never: stop a working version because its replacement is broken,
//! or drop, dead-letter or re-route the deliveries of a removed sink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use super::{load_one, LoadFailure, Manifest, Plugin, Plugins, Runtime};
use crate::metrics::{Metrics, PluginLabel};

/// Quiet time after the last change in the plugins directory before a
/// rescan (see [`crate::limits::PLUGIN_RESCAN_DEBOUNCE`]).
pub use crate::limits::PLUGIN_RESCAN_DEBOUNCE as DEBOUNCE;

/// Why a parked sink's deliveries wait.
pub const REMOVED_REASON: &str = "sink removed";

/// Checks a loaded plugin against the running daemon (its lease, its
/// `after`); `Err` is the refusal, in words. Given the sink names known.
pub type Admit = Box<dyn Fn(&Plugin, &[String]) -> Result<(), String> + Send + Sync>;

/// Starts the delivery loop of a sink seen for the first time.
pub type StartSink = Box<dyn Fn(&str, watch::Receiver<Option<Plugin>>) + Send + Sync>;

/// What one sink is doing, for `/ready` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkState {
    /// A version is loaded and delivering.
    Loaded {
        /// The manifest version loaded.
        version: String,
    },
    /// Its manifest is gone; deliveries are parked until it returns.
    Removed,
}

struct Entry {
    manifest_path: PathBuf,
    /// Hash of the manifest and component bytes of the serving version;
    /// `None` while removed.
    fingerprint: Option<[u8; 32]>,
    version: String,
    /// [`wasm_sha256`] of the serving version.
    wasm_sha256: Option<String>,
    /// [`file_sha256`] of the serving version's manifest (empty when it
    /// could not be read once loaded).
    manifest_sha256: String,
    current: watch::Sender<Option<Plugin>>,
}

#[derive(Default)]
struct State {
    sinks: BTreeMap<String, Entry>,
    failed: Vec<LoadFailure>,
    /// Manifests refused for what their own files hold (unreadable, not a
    /// component, not the world, ...), by fingerprint: a rescan that finds
    /// them unchanged reports the same refusal without loading, logging or
    /// counting it again.
    refused: BTreeMap<PathBuf, [u8; 32]>,
}

/// What the registry held when a rescan began.
struct Before {
    /// Each sink's manifest and, while it serves, its fingerprint.
    sinks: BTreeMap<String, (PathBuf, Option<[u8; 32]>)>,
    refused: BTreeMap<PathBuf, [u8; 32]>,
    failed: Vec<LoadFailure>,
}

impl Before {
    /// Whether a version of sink `name` is serving.
    fn serving(&self, name: &str) -> bool {
        self.sinks.get(name).is_some_and(|(_, fp)| fp.is_some())
    }

    /// The sink serving from manifest `path`, if one is.
    fn serving_at(&self, path: &Path) -> Option<String> {
        self.sinks
            .iter()
            .find(|(_, (p, fp))| p == path && fp.is_some())
            .map(|(n, _)| n.clone())
    }
}

/// What a rescan decided, before any of it is applied.
#[derive(Default)]
struct Plan {
    /// Sinks with a manifest in the directory (loaded, unchanged, or
    /// refused while a version keeps serving).
    present: BTreeSet<String>,
    /// New versions, loaded and admitted: (sink, manifest, fingerprint).
    loaded: Vec<(String, PathBuf, [u8; 32], Plugin)>,
    /// Unchanged sinks whose manifest now has another file name.
    moved: Vec<(String, PathBuf)>,
    /// Every refusal, old and new.
    failed: Vec<LoadFailure>,
    /// See [`State::refused`].
    refused: BTreeMap<PathBuf, [u8; 32]>,
}

/// The sinks of a running daemon.
pub struct Registry {
    runtime: Runtime,
    dir: PathBuf,
    admit: Admit,
    start_sink: StartSink,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

impl Registry {
    /// Take over the plugins loaded at start (`plugins`, from
    /// [`super::load_dir`] over `dir`) and start a loop for each.
    pub fn new(
        runtime: Runtime,
        dir: &Path,
        plugins: Plugins,
        admit: Admit,
        start_sink: StartSink,
        metrics: Arc<Metrics>,
    ) -> Arc<Registry> {
        let registry = Arc::new(Registry {
            runtime,
            dir: dir.to_path_buf(),
            admit,
            start_sink,
            metrics,
            state: Mutex::new(State::default()),
        });
        let mut state = State::default();
        for failure in plugins.failed {
            state
                .refused
                .insert(failure.manifest.clone(), fingerprint(&failure.manifest));
            state.failed.push(failure);
        }
        for (name, plugin) in plugins.loaded {
            let manifest_path = plugin.manifest().file.clone();
            let fingerprint = Some(fingerprint(&manifest_path));
            let wasm_sha256 = wasm_sha256(&plugin);
            let manifest_sha256 = file_sha256(&manifest_path).unwrap_or_default();
            let (tx, rx) = watch::channel(Some(plugin.clone()));
            (registry.start_sink)(&name, rx);
            state.sinks.insert(
                name,
                Entry {
                    manifest_path,
                    fingerprint,
                    version: plugin.manifest().version.clone(),
                    wasm_sha256,
                    manifest_sha256,
                    current: tx,
                },
            );
        }
        *registry.state.lock().unwrap() = state;
        registry
    }

    /// The identity of every sink with a version loaded: its name, its
    /// manifest `version`, the SHA-256 of its `.wasm` file (of its manifest
    /// for a builtin sink) and of its manifest, each as `sha256sum` prints
    /// it. The fleet compares the two hashes across replicas.
    pub fn identities(&self) -> Vec<crate::store::SinkIdentity> {
        let state = self.state.lock().unwrap();
        state
            .sinks
            .iter()
            .filter(|(_, e)| e.fingerprint.is_some())
            .map(|(name, e)| crate::store::SinkIdentity {
                name: name.clone(),
                version: e.version.clone(),
                component_sha: e
                    .wasm_sha256
                    .clone()
                    .unwrap_or_else(|| e.manifest_sha256.clone()),
                manifest_sha: e.manifest_sha256.clone(),
            })
            .collect()
    }

    /// The version serving `sink` now, if one is loaded.
    pub fn serving(&self, sink: &str) -> Option<Plugin> {
        let state = self.state.lock().unwrap();
        state
            .sinks
            .get(sink)
            .and_then(|e| e.current.borrow().clone())
    }

    /// Sinks with a version loaded.
    pub fn loaded(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .sinks
            .iter()
            .filter(|(_, e)| e.fingerprint.is_some())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Every sink by name with what it is doing.
    pub fn states(&self) -> BTreeMap<String, SinkState> {
        let state = self.state.lock().unwrap();
        state
            .sinks
            .iter()
            .map(|(n, e)| {
                let s = match e.fingerprint {
                    Some(_) => SinkState::Loaded {
                        version: e.version.clone(),
                    },
                    None => SinkState::Removed,
                };
                (n.clone(), s)
            })
            .collect()
    }

    /// The hex SHA-256 of the `.wasm` file of each sink with a version
    /// loaded, as `sha256sum` prints it ([`wasm_sha256`]); builtin sinks,
    /// which have no component, are left out.
    pub fn wasm_sha256s(&self) -> BTreeMap<String, String> {
        let state = self.state.lock().unwrap();
        state
            .sinks
            .iter()
            .filter(|(_, e)| e.fingerprint.is_some())
            .filter_map(|(n, e)| Some((n.clone(), e.wasm_sha256.clone()?)))
            .collect()
    }

    /// Why the last version of each sink offered was refused, while it is
    /// (a sink already serving keeps its running version), by sink name.
    /// A refused manifest that could not be read names no sink and is only
    /// in [`Registry::failures`].
    pub fn refusals(&self) -> BTreeMap<String, String> {
        let state = self.state.lock().unwrap();
        state
            .failed
            .iter()
            .filter_map(|f| Some((f.name.clone()?, f.reason.clone())))
            .collect()
    }

    /// Every sink name seen since start (loaded, removed, or named by a
    /// manifest that was refused): routes and the admin API may name these.
    pub fn known(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        let mut names: BTreeSet<String> = state.sinks.keys().cloned().collect();
        names.extend(state.failed.iter().filter_map(|f| f.name.clone()));
        names.into_iter().collect()
    }

    /// Plugins refused at the last scan, as `file: reason`.
    pub fn failures(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .failed
            .iter()
            .map(|f| {
                let file = f.file.display().to_string();
                // Manifest errors already start with their file.
                if f.reason.starts_with(&file) {
                    f.reason.clone()
                } else {
                    format!("{file}: {}", f.reason)
                }
            })
            .collect()
    }

    /// Start watching the plugins directory, now: a change made after this
    /// returns is seen. Then, in a task until `shutdown` turns true,
    /// rescan once (for changes since the plugins were loaded) and again
    /// [`DEBOUNCE`] after the last of each burst of changes. Only changes
    /// count (create, write, remove, rename), never reads: a rescan reads
    /// every file, and must not set itself off. A directory that cannot be
    /// watched is logged and left alone (plugins then change only with a
    /// restart).
    pub fn watch(
        self: Arc<Registry>,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        use notify::Watcher;
        let (tx, rx) = mpsc::unbounded_channel();
        let watching = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let change = match res {
                Ok(event) => match event.kind {
                    notify::EventKind::Access(_) => return,
                    _ => Ok(()),
                },
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(change);
        })
        .and_then(|mut watcher| {
            watcher
                .watch(&self.dir, notify::RecursiveMode::NonRecursive)
                .map(|()| watcher)
        });
        let watcher = match watching {
            Ok(w) => {
                tracing::info!(dir = %self.dir.display(), "watching the plugins directory");
                w
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "cannot watch the plugins directory: {e}; plugins change only with a restart");
                return tokio::spawn(async {});
            }
        };
        tokio::spawn(self.rescan_on_changes(watcher, rx, shutdown))
    }

    async fn rescan_on_changes(
        self: Arc<Registry>,
        // Kept alive for as long as changes are wanted.
        _watcher: notify::RecommendedWatcher,
        mut changes: mpsc::UnboundedReceiver<Result<(), String>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut pending = true; // the first rescan: changes since the load
        loop {
            if pending {
                pending = false;
                let me = self.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || me.rescan()).await {
                    tracing::error!("plugin rescan failed: {e}");
                }
            }
            tokio::select! {
                got = changes.recv() => match got {
                    None => return,
                    Some(Err(e)) => tracing::warn!("plugin directory watch: {e}"),
                    Some(Ok(())) => {
                        // Wait for the burst to end: DEBOUNCE without news.
                        loop {
                            match tokio::time::timeout(DEBOUNCE, changes.recv()).await {
                                Ok(Some(_)) => continue,
                                Ok(None) => return,
                                Err(_) => break,
                            }
                        }
                        pending = true;
                    }
                },
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// Read the plugins directory again and apply what changed (module
    /// note). Blocking: compiles components; run it off the async workers.
    pub fn rescan(&self) {
        let plan = self.plan();
        self.apply(plan);
    }

    /// What the directory holds against what serves now: every manifest
    /// read, changed ones loaded and admitted; nothing serving is touched.
    fn plan(&self) -> Plan {
        let before = {
            let state = self.state.lock().unwrap();
            Before {
                sinks: state
                    .sinks
                    .iter()
                    .map(|(n, e)| (n.clone(), (e.manifest_path.clone(), e.fingerprint)))
                    .collect(),
                refused: state.refused.clone(),
                failed: state.failed.clone(),
            }
        };
        let mut known: Vec<String> = self.known();
        let mut plan = Plan::default();
        // Files of serving sinks first: when a new file claims a name that
        // is already serving, the new file is the duplicate.
        let mut files = manifest_files(&self.dir);
        files.sort_by_key(|path| before.serving_at(path).is_none());
        for path in files {
            self.plan_file(&before, &mut known, &mut plan, path);
        }
        plan
    }

    /// Add what manifest `path` holds to `plan`.
    fn plan_file(&self, before: &Before, known: &mut Vec<String>, plan: &mut Plan, path: PathBuf) {
        let serving_here = before.serving_at(&path);
        let fp = fingerprint(&path);
        if before.refused.get(&path) == Some(&fp) {
            // Refused before and unchanged: the same refusal, quietly.
            for f in before.failed.iter().filter(|f| f.manifest == path) {
                if let Some(name) = f.name.as_ref().filter(|n| before.serving(n)) {
                    plan.present.insert(name.clone());
                }
                plan.failed.push(f.clone());
            }
            plan.present.extend(serving_here);
            plan.refused.insert(path, fp);
            return;
        }
        let manifest = match Manifest::load(&path) {
            Ok(m) => m,
            Err(e) => {
                let failure = self.refused(&path, serving_here.clone(), true, e.to_string());
                plan.failed.push(failure);
                plan.present.extend(serving_here);
                plan.refused.insert(path, fp);
                return;
            }
        };
        let name = manifest.name.clone();
        if !plan.present.insert(name.clone()) {
            plan.failed.push(self.refused(
                &path,
                None,
                false,
                format!("sink name {name:?} is already used by another manifest"),
            ));
            return;
        }
        if let Some((old_path, Some(old_fp))) = before.sinks.get(&name) {
            if *old_fp == fp {
                if *old_path != path {
                    plan.moved.push((name, path));
                }
                return;
            }
        }
        if !known.contains(&name) {
            known.push(name.clone());
        }
        let serving = before.serving(&name);
        let plugin = match load_one(&self.runtime, &path) {
            Ok(plugin) => plugin,
            Err(f) => {
                // Refused for its own files: not tried again until they change.
                let mut failure = self.refused(&f.file, Some(name), serving, f.reason);
                failure.manifest = path.clone();
                plan.failed.push(failure);
                plan.refused.insert(path, fp);
                return;
            }
        };
        // Admission depends on the other sinks too: tried at every rescan.
        match (self.admit)(&plugin, known) {
            Ok(()) => plan.loaded.push((name, path, fp, plugin)),
            Err(reason) => {
                let mut failure = self.refused(&path, Some(name), serving, reason);
                failure.manifest = path.clone();
                plan.failed.push(failure);
            }
        }
    }

    /// Make `plan` what serves: new versions in, moved manifests followed,
    /// sinks without a manifest parked.
    fn apply(&self, plan: Plan) {
        let mut state = self.state.lock().unwrap();
        for (name, path) in plan.moved {
            if let Some(entry) = state.sinks.get_mut(&name) {
                entry.manifest_path = path;
            }
        }
        for (name, path, fp, plugin) in plan.loaded {
            self.serve(&mut state, name, path, fp, plugin);
        }
        for (name, entry) in state.sinks.iter_mut() {
            if !plan.present.contains(name) && entry.fingerprint.is_some() {
                entry.fingerprint = None;
                entry.current.send_replace(None);
                tracing::warn!(sink = %name, "plugin removed; its deliveries are parked ({REMOVED_REASON}) until it returns");
            }
        }
        // A refusal that no longer holds (a good version loaded, the file
        // put back or removed) is said once, as the refusal was.
        for old in &state.failed {
            let still = plan
                .failed
                .iter()
                .any(|f| f.manifest == old.manifest && f.name == old.name);
            if still {
                continue;
            }
            match &old.name {
                Some(sink) => {
                    tracing::info!(sink = %sink, file = %old.manifest.display(), "plugin refusal cleared (was: {})", old.reason)
                }
                None => {
                    tracing::info!(file = %old.manifest.display(), "plugin refusal cleared (was: {})", old.reason)
                }
            }
        }
        state.failed = plan.failed;
        state.refused = plan.refused;
    }

    /// Let `plugin` (from manifest `path`, fingerprint `fp`) serve sink
    /// `name`: a new version of a serving or parked sink, or a new sink
    /// with its delivery loop started.
    fn serve(&self, state: &mut State, name: String, path: PathBuf, fp: [u8; 32], plugin: Plugin) {
        let version = plugin.manifest().version.clone();
        let wasm_sha256 = wasm_sha256(&plugin);
        let manifest_sha256 = file_sha256(&path).unwrap_or_default();
        self.metrics
            .plugin_loads
            .get_or_create(&PluginLabel {
                plugin: name.clone(),
            })
            .inc();
        match state.sinks.get_mut(&name) {
            Some(entry) => {
                let was = entry.fingerprint.is_some();
                entry.manifest_path = path;
                entry.fingerprint = Some(fp);
                entry.version = version.clone();
                entry.wasm_sha256 = wasm_sha256;
                entry.manifest_sha256 = manifest_sha256;
                entry.current.send_replace(Some(plugin));
                if was {
                    tracing::info!(sink = %name, %version, "plugin replaced; new batches run on the new version");
                } else {
                    tracing::info!(sink = %name, %version, "plugin back; parked deliveries resume");
                }
            }
            None => {
                let (tx, rx) = watch::channel(Some(plugin));
                (self.start_sink)(&name, rx);
                tracing::info!(sink = %name, %version, "plugin added");
                state.sinks.insert(
                    name,
                    Entry {
                        manifest_path: path,
                        fingerprint: Some(fp),
                        version,
                        wasm_sha256,
                        manifest_sha256,
                        current: tx,
                    },
                );
            }
        }
    }

    /// Record and log a refused plugin file of sink `name` (when known).
    /// `serving`: a running version of that sink stays because of this
    /// refusal.
    fn refused(
        &self,
        file: &Path,
        name: Option<String>,
        serving: bool,
        reason: String,
    ) -> LoadFailure {
        let label = name.clone().unwrap_or_else(|| file.display().to_string());
        self.metrics
            .plugin_load_failures
            .get_or_create(&PluginLabel { plugin: label })
            .inc();
        let reason = match name.as_ref().filter(|_| serving) {
            Some(sink) => {
                tracing::error!(file = %file.display(), sink = %sink, "replacement refused, the running version keeps serving: {reason}");
                format!(
                    "{reason} (replacement refused; the running version of {sink:?} keeps serving)"
                )
            }
            None => {
                tracing::error!(file = %file.display(), "plugin refused: {reason}");
                reason
            }
        };
        LoadFailure {
            file: file.to_path_buf(),
            manifest: file.to_path_buf(),
            name,
            reason,
        }
    }
}

/// The manifests (`*.toml`) in `dir`, sorted.
pub(super) fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// The hex SHA-256 of `plugin`'s `.wasm` file, as `sha256sum` prints it:
/// what `/v1/admin/sinks` and `outboxd sinks list` show as `wasm_sha256`,
/// the fleet's `replicas[].component_sha`, and what `outboxd plugin check`
/// prints, so an author can tell which build runs. `None` for a builtin
/// sink (no component). Read from disk once the version is loaded; a file
/// that cannot be read then (removed at once) gives `None`.
pub fn wasm_sha256(plugin: &Plugin) -> Option<String> {
    file_sha256(plugin.manifest().component_path()?)
}

/// The lower-case hex SHA-256 of the file at `path`, as `sha256sum` prints
/// it; `None` when it cannot be read.
fn file_sha256(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(bytes)))
}

/// SHA-256 over a manifest's bytes and, when it parses and names one, its
/// component's bytes: what decides whether a plugin changed. A file that
/// cannot be read hashes as its error, so it changes when the error does.
fn fingerprint(manifest_path: &Path) -> [u8; 32] {
    let mut hash = Sha256::new();
    let mut file = |path: &Path| match std::fs::read(path) {
        Ok(bytes) => {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(&bytes);
        }
        Err(e) => hash.update(format!("unreadable: {:?}", e.kind())),
    };
    file(manifest_path);
    if let Ok(manifest) = Manifest::load(manifest_path) {
        if let Some(component) = manifest.component_path() {
            file(component);
        }
    }
    hash.finalize().into()
}
