//! The WIT this binary speaks, embedded at build time from the
//! repository's `wit/`, so `outboxd plugin wit` and `outboxd plugin new`
//! hand a plugin author exactly the interface the host was built against.
//!
//! Owns: the embedded files and writing them out.
//!
//! Must never: change a file's text (the host's bindings, `super::bindings`,
//! are generated from the same files).

use std::path::{Path, PathBuf};

/// The WIT files, by name, as in the repository's `wit/` folder.
pub const FILES: &[(&str, &str)] = &[("sink.wit", include_str!("../../../wit/sink.wit"))];

/// Why the WIT could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{file}: cannot write: {source}")]
pub struct WriteError {
    /// The file or folder that could not be written.
    pub file: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// Write every file of [`FILES`] into `dir` (created when missing),
/// replacing files of the same name. Returns the paths written.
pub fn write_to(dir: &Path) -> Result<Vec<PathBuf>, WriteError> {
    std::fs::create_dir_all(dir).map_err(|source| WriteError {
        file: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for (name, text) in FILES {
        let file = dir.join(name);
        std::fs::write(&file, text).map_err(|source| WriteError {
            file: file.clone(),
            source,
        })?;
        written.push(file);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_wit_is_the_version_the_host_implements() {
        let (major, minor, patch) = super::super::manifest::WIT_VERSION;
        let package = format!(
            "package {}@{major}.{minor}.{patch};",
            super::super::manifest::WIT_PACKAGE
        );
        assert!(FILES[0].1.starts_with(&package), "{package}");
    }
}
