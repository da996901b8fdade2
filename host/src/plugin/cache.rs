//! The compiled-component cache: `<data-dir>/cache/<key>.cwasm`.
//!
//! Owns: turning a component's bytes into a compiled [`Component`] without
//! compiling it again when this engine already did. The key is the SHA-256
//! of the component's bytes together with the engine's
//! `precompile_compatibility_hash` (wasmtime's version and every setting
//! that changes the machine code), so an upgrade or a settings change is a
//! miss, never a wrong hit. Loading a precompiled component costs about
//! 0.2 ms here (docs/measurements.md); compiling the webhook sink takes tens to
//! hundreds of milliseconds.
//!
//! A file that cannot be loaded (truncated, garbage, from another engine)
//! is ignored: the component is compiled and the file written again. Files
//! are written to a temporary name, synced, then renamed, so a crash never
//! leaves a half-written file under a key.
//!
//! Must never: load a file it did not write. `Component::deserialize_file`
//! maps the file as native code and trusts it; only this module writes into
//! the cache directory, which belongs to the daemon alone (like its
//! database). Nothing from the plugins directory is ever deserialized.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// File name extension of cached compiled components.
const EXTENSION: &str = "cwasm";

/// Where a compiled component came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Loaded from the cache file.
    Hit,
    /// Compiled, and written to the cache.
    Compiled,
    /// A cache file was there but could not be loaded (the reason); the
    /// component was compiled and the file written again.
    Replaced(String),
}

/// How often the cache was hit and missed since start.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Components read from the cache.
    pub hits: AtomicU64,
    /// Components compiled (and written to the cache).
    pub compiles: AtomicU64,
}

/// The cache directory of one engine.
#[derive(Clone)]
pub struct CompiledCache {
    dir: PathBuf,
    /// Hex SHA-256 of the engine's compatibility hash.
    engine_key: Arc<str>,
    stats: Arc<CacheStats>,
}

/// Feeds `Hash` output into SHA-256, so the engine's key does not depend
/// on std's unspecified `DefaultHasher`.
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        0
    }
}

impl CompiledCache {
    /// A cache in `dir` (created when first written) for `engine`.
    pub fn new(engine: &Engine, dir: PathBuf) -> CompiledCache {
        let mut hasher = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex::encode(hasher.0.finalize());
        CompiledCache {
            dir,
            engine_key: Arc::from(engine_key.as_str()),
            stats: Arc::default(),
        }
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hits and compiles so far.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// The file that holds the compiled form of `bytes`.
    pub fn path_for(&self, bytes: &[u8]) -> PathBuf {
        let mut key = Sha256::new();
        key.update(self.engine_key.as_bytes());
        key.update(b"\0");
        key.update(Sha256::digest(bytes));
        self.dir
            .join(format!("{}.{EXTENSION}", hex::encode(key.finalize())))
    }

    /// The compiled component for `bytes`: from the cache when there, else
    /// compiled with `compile` and written to the cache (a write failure is
    /// logged; the component is returned regardless).
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        compile: impl FnOnce() -> wasmtime::Result<Component>,
    ) -> wasmtime::Result<(Component, Source)> {
        let path = self.path_for(bytes);
        let mut source = Source::Compiled;
        if path.is_file() {
            // SAFETY: the file is in the daemon's own cache directory, under
            // a key naming this engine, and was written by `store` below from
            // `Component::serialize` (module note). wasmtime checks its
            // version and settings header before using it.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((component, Source::Hit));
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), "compiled cache file ignored, compiling again: {e:#}");
                    source = Source::Replaced(format!("{e:#}"));
                }
            }
        }
        let component = compile()?;
        self.stats.compiles.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.store(&component, &path) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compiled cache: {e}");
        }
        Ok((component, source))
    }

    /// Write `component` to `path` through a temporary file and a rename.
    fn store(&self, component: &Component, path: &Path) -> std::io::Result<()> {
        let serialized = component.serialize().map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension(format!(
            "{EXTENSION}.{}.{:016x}.tmp",
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&serialized)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component with a bit of code in it, so compiling is real work.
    const WAT: &str = r#"(component
        (core module $m
            (func (export "f") (param i32) (result i32)
                local.get 0 i32.const 1 i32.add))
        (core instance (instantiate $m)))"#;

    #[test]
    fn second_load_hits_the_cache_and_a_corrupt_file_is_rewritten() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompiledCache::new(&engine, dir.path().join("cache"));
        let bytes = wat::parse_str(WAT).unwrap();
        let compile = || Component::new(&engine, &bytes);

        let (_, first) = cache.get_or_compile(&engine, &bytes, compile).unwrap();
        assert_eq!(first, Source::Compiled);
        let path = cache.path_for(&bytes);
        assert!(path.is_file(), "the compiled form is written under the key");

        // A new cache over the same directory (a restart) loads it.
        let restarted = CompiledCache::new(&engine, dir.path().join("cache"));
        let (_, second) = restarted.get_or_compile(&engine, &bytes, compile).unwrap();
        assert_eq!(second, Source::Hit);
        assert_eq!(restarted.stats().hits.load(Ordering::Relaxed), 1);
        assert_eq!(restarted.stats().compiles.load(Ordering::Relaxed), 0);

        // Garbage under the key: ignored, compiled again, rewritten.
        std::fs::write(&path, b"not a compiled component").unwrap();
        let (_, third) = restarted.get_or_compile(&engine, &bytes, compile).unwrap();
        assert!(matches!(third, Source::Replaced(_)), "{third:?}");
        let (_, fourth) = restarted.get_or_compile(&engine, &bytes, compile).unwrap();
        assert_eq!(fourth, Source::Hit, "the rewritten file loads");
        // Truncated: the same.
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let (_, fifth) = restarted.get_or_compile(&engine, &bytes, compile).unwrap();
        assert!(matches!(fifth, Source::Replaced(_)), "{fifth:?}");
    }

    #[test]
    fn another_engine_setting_is_another_key() {
        let plain = Engine::default();
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let epoch = Engine::new(&config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bytes = wat::parse_str(WAT).unwrap();
        let a = CompiledCache::new(&plain, dir.path().to_path_buf()).path_for(&bytes);
        let b = CompiledCache::new(&epoch, dir.path().to_path_buf()).path_for(&bytes);
        assert_ne!(a, b);
        let other = wat::parse_str("(component)").unwrap();
        assert_ne!(
            a,
            CompiledCache::new(&plain, dir.path().to_path_buf()).path_for(&other)
        );
    }
}
