//! Fenced code blocks of a Markdown file, with the line each starts on, so
//! that a failing example names its file and line.

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// One fenced code block.
#[derive(Debug, Clone)]
pub struct Block {
    /// The info string's words (```` ```toml manifest ```` → `["toml",
    /// "manifest"]`; commas count as spaces).
    pub info: Vec<String>,
    /// The block's text, without the fences.
    pub text: String,
    /// 1-based line of the opening fence.
    pub line: usize,
}

impl Block {
    /// Whether the info string's first word is `lang`.
    pub fn is(&self, lang: &str) -> bool {
        self.info.first().is_some_and(|w| w == lang)
    }

    /// Whether the info string carries the word `word` after the language.
    pub fn tagged(&self, word: &str) -> bool {
        self.info.iter().skip(1).any(|w| w == word)
    }
}

/// Every fenced code block of `markdown`, in order.
pub fn fenced(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    for (event, range) in Parser::new(markdown).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                current = Some(Block {
                    info: info
                        .split(|c: char| c.is_whitespace() || c == ',')
                        .filter(|w| !w.is_empty())
                        .map(str::to_string)
                        .collect(),
                    text: String::new(),
                    line: super::links::line_of(markdown, range.start),
                });
            }
            Event::Text(text) => {
                if let Some(block) = current.as_mut() {
                    block.text.push_str(&text);
                }
            }
            Event::End(TagEnd::CodeBlock) => out.extend(current.take()),
            _ => {}
        }
    }
    out
}
