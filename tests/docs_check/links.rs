//! The internal link check: every relative link of a Markdown file names a
//! file or folder that exists, and every `#anchor` a heading of the page it
//! points into.
//!
//! mdBook only warns about such links; this check fails on them. Anchors
//! are made the way mdBook and GitHub make them from a heading's text:
//! lower case, letters, digits, `-` and `_` kept, whitespace turned into
//! `-`, everything else dropped, and a repeated id suffixed `-1`, `-2`, ...

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

/// One broken link: the file and line it is on, the link, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The Markdown file holding the link.
    pub file: PathBuf,
    /// 1-based line of the link.
    pub line: usize,
    /// The link as written.
    pub link: String,
    /// What is missing.
    pub problem: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: link `{}`: {}",
            self.file.display(),
            self.line,
            self.link,
            self.problem
        )
    }
}

/// The anchor mdBook and GitHub give a heading whose text is `text`.
pub fn anchor_of(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

/// Every anchor of `markdown`: one per heading (repeats suffixed), plus
/// each `id="..."` or `name="..."` of inline HTML.
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = anchor_of(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            Event::Html(h) | Event::InlineHtml(h) => {
                for attr in ["id=\"", "name=\""] {
                    for (i, _) in h.match_indices(attr) {
                        let rest = &h[i + attr.len()..];
                        if let Some(end) = rest.find('"') {
                            out.insert(rest[..end].to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The 1-based line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

/// Every link and image destination of `markdown` with its 1-based line.
pub fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (event, range) in Parser::new(markdown).into_offset_iter() {
        if let Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) = event {
            out.push((line_of(markdown, range.start), dest_url.to_string()));
        }
    }
    out
}

/// Whether `link` leaves the repository (a scheme such as `https:` or
/// `mailto:`), which this check does not follow.
fn external(link: &str) -> bool {
    match link.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => link.starts_with("//"),
    }
}

/// `path` with `.` and `..` resolved without touching the disk.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The broken internal links of `files`. A link may point anywhere inside
/// `root` (the repository); one that climbs out of it is broken too.
pub fn check(root: &Path, files: &[PathBuf]) -> Vec<Broken> {
    let mut cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut anchors_of = |file: &Path| -> BTreeSet<String> {
        cache
            .entry(file.to_path_buf())
            .or_insert_with(|| anchors(&std::fs::read_to_string(file).unwrap_or_default()))
            .clone()
    };
    let root = normalise(root);
    let mut broken = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (line, link) in links(&text) {
            if external(&link) {
                continue;
            }
            let fail = |problem: String| Broken {
                file: file.clone(),
                line,
                link: link.clone(),
                problem,
            };
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                normalise(&file.parent().unwrap().join(path))
            };
            if !target.starts_with(&root) {
                broken.push(fail("points outside the repository".into()));
                continue;
            }
            if !target.exists() {
                broken.push(fail(format!("no file {}", target.display())));
                continue;
            }
            if let Some(anchor) = anchor {
                let page = target.extension().is_some_and(|e| e == "md");
                if page && !anchors_of(&target).contains(anchor) {
                    broken.push(fail(format!(
                        "no heading with anchor #{anchor} in {}",
                        target.display()
                    )));
                }
            }
        }
    }
    broken
}
