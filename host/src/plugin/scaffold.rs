//! `outboxd plugin new NAME`: a sink project a plugin author starts from,
//! outside this repository.
//!
//! Owns: the project templates (`template/<lang>/`, embedded at build
//! time) and writing one out: the WIT this binary speaks ([`super::wit`]),
//! the build settings (for Rust, the size-oriented release profile; for
//! JavaScript, componentize-js pinned in `package.json`; for Python,
//! componentize-py pinned in `requirements.txt` and a `build.sh`), a
//! manifest the daemon accepts, a README and unit tests. The Rust project
//! builds with `cargo build --release --target wasm32-wasip2` into a
//! component `outboxd plugin check` accepts (tests/integration_plugin_new.rs
//! builds, checks, runs and loads one).
//!
//! Must never: overwrite a file that exists (the project folder must be new
//! or empty), or write outside the project folder.

use std::path::{Path, PathBuf};

use super::manifest::WIT_VERSION;

/// The languages a project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust, built for `wasm32-wasip2` with `wit-bindgen` and `wasip2`.
    Rust,
    /// JavaScript (an ES module), built with componentize-js through npm.
    Js,
    /// Python, built with componentize-py (`build.sh`).
    Python,
}

/// Why no project was written.
#[derive(Debug, thiserror::Error)]
pub enum NewError {
    /// The name cannot be a sink name (and a crate name).
    #[error(
        "plugin name {0:?}: use a lower-case letter, then lower-case letters, digits, '-' and '_'"
    )]
    Name(String),
    /// The project folder exists and holds files.
    #[error("{0}: already exists and is not empty; choose another --dir or name")]
    Exists(PathBuf),
    #[error("{file}: cannot write: {source}")]
    /// A file or folder could not be written.
    Write {
        /// The file or folder.
        file: PathBuf,
        /// Why it could not be written.
        source: std::io::Error,
    },
}

/// Rust project files: path in the project, template text.
const RUST: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("template/rust/Cargo.toml.tmpl")),
    ("src/lib.rs", include_str!("template/rust/lib.rs.tmpl")),
    (
        "@NAME@.toml",
        include_str!("template/rust/manifest.toml.tmpl"),
    ),
    ("README.md", include_str!("template/rust/README.md.tmpl")),
    (".gitignore", "/target\n"),
];

/// JavaScript project files.
const JS: &[(&str, &str)] = &[
    (
        "package.json",
        include_str!("template/js/package.json.tmpl"),
    ),
    ("sink.js", include_str!("template/js/sink.js.tmpl")),
    (
        "sink.test.js",
        include_str!("template/js/sink.test.js.tmpl"),
    ),
    (
        "support/resolve.js",
        include_str!("template/js/resolve.js.tmpl"),
    ),
    ("support/log.js", include_str!("template/js/log.js.tmpl")),
    (
        "@NAME@.toml",
        include_str!("template/js/manifest.toml.tmpl"),
    ),
    ("README.md", include_str!("template/js/README.md.tmpl")),
    (".gitignore", "/node_modules\n/*.wasm\n"),
];

/// Python project files.
const PYTHON: &[(&str, &str)] = &[
    ("app.py", include_str!("template/python/app.py.tmpl")),
    (
        "test_app.py",
        include_str!("template/python/test_app.py.tmpl"),
    ),
    ("build.sh", include_str!("template/python/build.sh.tmpl")),
    (
        "requirements.txt",
        include_str!("template/python/requirements.txt.tmpl"),
    ),
    (
        "@NAME@.toml",
        include_str!("template/python/manifest.toml.tmpl"),
    ),
    ("README.md", include_str!("template/python/README.md.tmpl")),
    (".gitignore", "/gen\n/*.wasm\n__pycache__/\n"),
];

/// Write a new `lang` project for the sink `name` into `parent/name`.
/// Returns the project folder.
pub fn create(name: &str, lang: Lang, parent: &Path) -> Result<PathBuf, NewError> {
    let valid = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        return Err(NewError::Name(name.to_string()));
    }
    let dir = parent.join(name);
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(NewError::Exists(dir));
    }
    let (major, minor, patch) = WIT_VERSION;
    let fill = |text: &str| {
        text.replace("@NAME@", name)
            .replace("@CRATE@", &name.replace('-', "_"))
            .replace("@ENV@", &name.replace('-', "_").to_ascii_uppercase())
            .replace("@WIT@", &format!("{major}.{minor}.{patch}"))
    };
    let write = |file: PathBuf, text: &str| -> Result<(), NewError> {
        let fail = |source| NewError::Write {
            file: file.clone(),
            source,
        };
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(fail)?;
        }
        std::fs::write(&file, text).map_err(fail)
    };
    let files = match lang {
        Lang::Rust => RUST,
        Lang::Js => JS,
        Lang::Python => PYTHON,
    };
    for (path, text) in files {
        let file = dir.join(fill(path));
        write(file.clone(), &fill(text))?;
        #[cfg(unix)]
        if path.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).map_err(
                |source| NewError::Write {
                    file: file.clone(),
                    source,
                },
            )?;
        }
    }
    for (file, text) in super::wit::FILES {
        write(dir.join("wit").join(file), text)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_nothing_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "My", "1st", "a b", "../x"] {
            assert!(
                matches!(create(bad, Lang::Rust, dir.path()), Err(NewError::Name(_))),
                "{bad}"
            );
        }
        let project = create("my-sink", Lang::Rust, dir.path()).unwrap();
        let manifest = std::fs::read_to_string(project.join("my-sink.toml")).unwrap();
        assert!(manifest.contains("name = \"my-sink\""), "{manifest}");
        assert!(manifest.contains("${MY_SINK_ORIGIN:-"), "{manifest}");
        for token in ["@NAME@", "@CRATE@", "@ENV@", "@WIT@"] {
            assert!(!manifest.contains(token), "{manifest}");
        }
        assert!(
            manifest.contains("wit = \"outboxd:sink@0.1.5\""),
            "{manifest}"
        );
        assert!(project.join("wit/sink.wit").is_file());
        assert!(matches!(
            create("my-sink", Lang::Rust, dir.path()),
            Err(NewError::Exists(_))
        ));
        for (lang, name) in [(Lang::Js, "js-sink"), (Lang::Python, "py-sink")] {
            let project = create(name, lang, dir.path()).unwrap();
            let manifest = std::fs::read_to_string(project.join(format!("{name}.toml"))).unwrap();
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "{manifest}"
            );
            assert!(project.join("wit/sink.wit").is_file());
        }
    }
}
