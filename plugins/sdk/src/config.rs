//! Reading a sink's `[config]` table as `init` receives it: every key known,
//! none given twice, numbers within their bounds.
//!
//! Errors name the key and say what a valid value looks like; none ever
//! repeats a value (it may be a secret, or a URL carrying a token).
//!
//! Must never: decide what a key means; the sink does that.

/// The `[config]` entries, checked against the sink's known keys.
#[derive(Debug, Clone)]
pub struct Table<'a> {
    entries: Vec<(&'a str, &'a str)>,
}

impl<'a> Table<'a> {
    /// Checks `entries` (name → value, as the host hands them over) against
    /// `known`. `Err` names an unknown key, listing the known ones, or a key
    /// given more than once.
    pub fn new(entries: &'a [(String, String)], known: &[&str]) -> Result<Table<'a>, String> {
        let mut seen: Vec<(&'a str, &'a str)> = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            if !known.contains(&key.as_str()) {
                return Err(format!(
                    "unknown config key `{key}` (known: {})",
                    known.join(", ")
                ));
            }
            if seen.iter().any(|(k, _)| k == key) {
                return Err(format!("config key `{key}` is given more than once"));
            }
            seen.push((key.as_str(), value.as_str()));
        }
        Ok(Table { entries: seen })
    }

    /// The value of `key`, when given.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The value of `key`, when given and not empty after trimming: a
    /// manifest's `${VAR:-}` for an unset variable reads as not given.
    pub fn non_empty(&self, key: &str) -> Option<&'a str> {
        self.get(key).filter(|v| !v.trim().is_empty())
    }

    /// The value of `key`, or `Err(missing)` naming what it is for.
    pub fn required(&self, key: &str, missing: &str) -> Result<&'a str, String> {
        self.get(key)
            .ok_or_else(|| format!("config key `{key}` is required: {missing}"))
    }

    /// `key` as a whole number within `min..=max`, `default` when not given.
    pub fn number(&self, key: &str, min: u64, max: u64, default: u64) -> Result<u64, String> {
        let Some(value) = self.get(key) else {
            return Ok(default);
        };
        match value.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!(
                "config key `{key}` must be a whole number from {min} to {max}, got `{value}`"
            )),
        }
    }
}

/// `[config]` entries from string pairs, owned as the host hands them to
/// `init` (for a sink's tests).
pub fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        entries(pairs)
    }

    #[test]
    fn known_keys_once_each() {
        let entries = owned(&[("url", "http://h/"), ("timeout-ms", "5")]);
        let table = Table::new(&entries, &["url", "timeout-ms", "secret"]).unwrap();
        assert_eq!(table.get("url"), Some("http://h/"));
        assert_eq!(table.get("secret"), None);
        assert_eq!(table.number("timeout-ms", 1, 10, 7), Ok(5));
        assert_eq!(table.number("max", 1, 10, 7), Ok(7));

        let err = Table::new(&owned(&[("colour", "red")]), &["url"]).unwrap_err();
        assert!(err.contains("`colour`") && err.contains("url"), "{err}");
        let err = Table::new(&owned(&[("url", "a"), ("url", "b")]), &["url"]).unwrap_err();
        assert!(err.contains("more than once"), "{err}");
    }

    #[test]
    fn numbers_in_bounds_and_blank_values() {
        let entries = owned(&[("n", "0"), ("m", "soon"), ("s", "  ")]);
        let table = Table::new(&entries, &["n", "m", "s"]).unwrap();
        assert!(table.number("n", 1, 10, 1).unwrap_err().contains("`n`"));
        assert!(table.number("m", 1, 10, 1).unwrap_err().contains("`m`"));
        assert_eq!(table.non_empty("s"), None);
        assert!(table
            .required("x", "what x is for")
            .unwrap_err()
            .contains("`x`"));
    }
}
