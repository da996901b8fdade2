//! What the manual's tests read: the Markdown files of `docs/` and the
//! README, their fenced code blocks, their links and headings, and the
//! configuration keys the code accepts.
//!
//! Must never: change a file it reads, or decide what a page says; the tests
//! in `tests/integration_docs.rs` compare.
#![allow(dead_code)]

pub mod blocks;
pub mod config_keys;
pub mod links;

use std::path::{Path, PathBuf};

/// Every Markdown file the manual is made of: `README.md` and every `.md`
/// under `docs/` (sorted, so failures come in a stable order).
pub fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}
