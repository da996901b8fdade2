//! Which events a destination takes: its [`Filter`] (globs over `type`
//! and stream, and `where` conditions over CloudEvents attributes).
//!
//! Must never: look at anything but the event's attributes, or fail an
//! event on a condition it cannot parse (that condition matches nothing).

use serde::{Deserialize, Serialize};

use crate::event::{glob_match, NewEvent};

/// Which events a destination takes. Every part must match; an empty list
/// matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filter {
    /// Globs over the event's `type` (`*` any run of characters).
    pub types: Vec<String>,
    /// Globs over the event's stream (`partitionkey`).
    pub streams: Vec<String>,
    /// Attribute conditions, `NAME == GLOB` or `NAME != GLOB`, over
    /// CloudEvents attribute names (`type`, `source`, `subject`,
    /// `partitionkey`, or an extension such as `requestingplatform`). An
    /// absent attribute is equal to nothing: `==` fails, `!=` holds.
    #[serde(rename = "where")]
    pub conditions: Vec<String>,
}

/// One parsed attribute condition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    attribute: String,
    equal: bool,
    pattern: String,
}

impl Filter {
    /// Check every part; `Err` names the part (`filter.where[1]`) and what
    /// is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (key, list) in [("types", &self.types), ("streams", &self.streams)] {
            for (i, p) in list.iter().enumerate() {
                if p.is_empty() {
                    return Err((format!("filter.{key}[{i}]"), "is empty".into()));
                }
            }
        }
        for (i, c) in self.conditions.iter().enumerate() {
            parse_condition(c).map_err(|e| (format!("filter.where[{i}]"), e))?;
        }
        Ok(())
    }

    /// Whether `event` passes. Conditions that do not parse (refused at
    /// create, so only from a hand-edited row) match nothing.
    pub fn matches(&self, event: &NewEvent) -> bool {
        let any = |list: &[String], value: &str| {
            list.is_empty() || list.iter().any(|p| glob_match(p, value))
        };
        any(&self.types, &event.ty)
            && any(&self.streams, &event.stream)
            && self.conditions.iter().all(|c| match parse_condition(c) {
                Ok(c) => {
                    let value = attribute(event, &c.attribute);
                    let hit = value.is_some_and(|v| glob_match(&c.pattern, v));
                    hit == c.equal
                }
                Err(_) => false,
            })
    }
}

/// `NAME == VALUE` / `NAME != VALUE`; VALUE may be in double quotes.
fn parse_condition(text: &str) -> Result<Condition, String> {
    let (attribute, equal, value) = if let Some((a, v)) = text.split_once("!=") {
        (a, false, v)
    } else if let Some((a, v)) = text.split_once("==") {
        (a, true, v)
    } else {
        return Err(format!(
            "{text:?} is not a condition: expected `NAME == VALUE` or `NAME != VALUE`"
        ));
    };
    let attribute = attribute.trim();
    if attribute.is_empty()
        || !attribute
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "{attribute:?} is not a CloudEvents attribute name (lower-case letters and digits)"
        ));
    }
    let value = value.trim();
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    Ok(Condition {
        attribute: attribute.to_string(),
        equal,
        pattern: value.to_string(),
    })
}

/// The value of CloudEvents attribute `name` of `event`, as text.
fn attribute<'e>(event: &'e NewEvent, name: &str) -> Option<&'e str> {
    match name {
        "id" => Some(&event.id),
        "source" => Some(&event.source),
        "type" => Some(&event.ty),
        "subject" => event.subject.as_deref(),
        "partitionkey" => Some(&event.stream),
        "datacontenttype" => event.datacontenttype.as_deref(),
        "dataschema" => event.dataschema.as_deref(),
        "time" => event.time.as_deref(),
        other => event.extensions.get(other).map(String::as_str),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ty: &str, stream: &str, ext: &[(&str, &str)]) -> NewEvent {
        let body = serde_json::json!({
            "specversion": "1.0", "id": "e1", "source": "/s", "type": ty,
            "partitionkey": stream, "data": {}
        });
        let mut e = crate::event::parse_one(body.to_string().as_bytes()).unwrap();
        for (k, v) in ext {
            e.extensions.insert(k.to_string(), v.to_string());
        }
        e
    }

    #[test]
    fn conditions_compare_attributes_and_an_absent_one_is_unequal() {
        let f = Filter {
            conditions: vec!["requestingplatform != \"blabsy\"".into()],
            ..Default::default()
        };
        assert!(f.validate().is_ok());
        assert!(!f.matches(&event("t", "s", &[("requestingplatform", "blabsy")])));
        assert!(f.matches(&event("t", "s", &[("requestingplatform", "pictique")])));
        assert!(f.matches(&event("t", "s", &[])));
        let f = Filter {
            types: vec!["issues.*".into()],
            conditions: vec!["partitionkey == repo-*".into()],
            ..Default::default()
        };
        assert!(f.matches(&event("issues.opened", "repo-1", &[])));
        assert!(!f.matches(&event("push", "repo-1", &[])));
        assert!(!f.matches(&event("issues.opened", "other", &[])));
    }

    #[test]
    fn a_bad_condition_is_named() {
        let f = Filter {
            conditions: vec!["ok == 1".into(), "Type ~ x".into()],
            ..Default::default()
        };
        let (field, why) = f.validate().unwrap_err();
        assert_eq!(field, "filter.where[1]");
        assert!(why.contains("expected `NAME == VALUE`"), "{why}");
    }
}
