//! The routing key template: literal text with `{name}` placeholders, each
//! replaced by an event attribute, e.g. `documents.{operation}.{type}` →
//! `documents.new.person`.
//!
//! Names: `id`, `source`, `type`, `subject`, `stream` (also
//! `partitionkey`), `sequence`, `time`, `datacontenttype`, `dataschema`, or
//! the name of any extension attribute of the event. `{{` and `}}` stand
//! for literal braces. An event that lacks an attribute the template needs
//! cannot be routed as configured and is rejected.

use outboxd_sink::Event;

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Attribute(String),
}

impl Template {
    /// Parses `text`; errors say what is wrong and where.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|(_, c)| *c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|(_, c)| *c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let rest = &text[at + 1..];
                    let end = rest
                        .find('}')
                        .ok_or_else(|| format!("`{{` at byte {at} is never closed"))?;
                    let name = &rest[..end];
                    if name.is_empty()
                        || !name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                    {
                        return Err(format!(
                            "`{{{name}}}` is not an attribute name (letters, digits, `_`, `-`)"
                        ));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Attribute(name.to_ascii_lowercase()));
                    while let Some((i, _)) = chars.peek() {
                        if *i > at + end + 1 {
                            break;
                        }
                        chars.next();
                    }
                }
                '}' => return Err(format!("`}}` at byte {at} closes nothing (write `}}}}`)")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The routing key for `event`; `Err` names the missing attribute.
    pub fn render(&self, event: &Event) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Attribute(name) => match attribute(event, name) {
                    Some(value) => out.push_str(&value),
                    None => {
                        return Err(format!(
                            "the routing key template needs `{{{name}}}`, which this event does not have"
                        ))
                    }
                },
            }
        }
        if out.len() > 255 {
            return Err(format!(
                "the routing key is {} bytes; AMQP allows at most 255",
                out.len()
            ));
        }
        Ok(out)
    }
}

/// The value of attribute `name` (lower case) of `event`, if it has one.
fn attribute(event: &Event, name: &str) -> Option<String> {
    match name {
        "id" => Some(event.id.clone()),
        "source" => Some(event.source.clone()),
        "type" => Some(event.type_.clone()),
        "subject" => event.subject.clone(),
        "stream" | "partitionkey" => Some(event.stream.clone()),
        "sequence" => Some(event.sequence.to_string()),
        "time" => Some(event.time.clone()),
        "datacontenttype" => event.datacontenttype.clone(),
        "dataschema" => event.dataschema.clone(),
        _ => event
            .extensions
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn event() -> Event {
        Event {
            id: "evt-1".into(),
            source: "/documents".into(),
            type_: "person".into(),
            subject: None,
            stream: "doc-7".into(),
            sequence: 42,
            time: "2026-11-30T01:02:03.456Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: b"{}".to_vec(),
            extensions: vec![("operation".into(), "new".into())],
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03.456789Z".into(),
        }
    }

    #[test]
    fn renders_attributes_and_extensions() {
        let t = Template::parse("documents.{operation}.{type}").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "documents.new.person");
        let t = Template::parse("{stream}/{sequence}/{ID}").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "doc-7/42/evt-1");
        let t = Template::parse("plain").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "plain");
        let t = Template::parse("a{{b}}c").unwrap();
        assert_eq!(t.render(&event()).unwrap(), "a{b}c");
    }

    #[test]
    fn missing_attributes_are_named() {
        let t = Template::parse("x.{subject}").unwrap();
        assert!(t.render(&event()).unwrap_err().contains("{subject}"));
        let t = Template::parse("x.{tenant}").unwrap();
        assert!(t.render(&event()).unwrap_err().contains("{tenant}"));
    }

    #[test]
    fn bad_templates_are_refused() {
        assert!(Template::parse("a.{b").is_err());
        assert!(Template::parse("a.{}").is_err());
        assert!(Template::parse("a.{b c}").is_err());
        assert!(Template::parse("a}").is_err());
    }
}
