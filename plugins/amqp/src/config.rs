//! The sink's configuration: the manifest's `[config]` table, checked once in
//! `init` and kept for the instance's single `deliver` call.
//!
//! Every error names the offending key and says what a valid value looks
//! like.

use crate::template::Template;

const KNOWN_KEYS: &str = "exchange, routing-key, unroutable, ordering, header-prefix";

/// The parsed `[config]` table.
#[derive(Clone, Debug)]
pub struct Config {
    /// Exchange every event is published to (`exchange`). It must also be
    /// granted under `[capabilities] amqp.exchanges`.
    pub exchange: String,
    /// Routing key template (`routing-key`).
    pub routing_key: Template,
    /// What an unroutable event becomes (`unroutable`).
    pub unroutable: Unroutable,
    /// How events of one stream are put in flight (`ordering`).
    pub ordering: Ordering,
    /// Prefix of the CloudEvents attribute headers (`header-prefix`).
    pub header_prefix: &'static str,
}

/// The answer for an event no queue is bound to receive (the broker returned
/// it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unroutable {
    /// Dead-letter it at once: nobody listens for this routing key.
    Reject,
    /// Try again with backoff, e.g. while a consumer's queue is being bound.
    Retry,
}

/// How many events of one stream may be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// One per stream: an event is published only after its predecessor in
    /// the batch was confirmed, so a failure the broker reports (unroutable,
    /// negative confirm) never lets a successor through. Different streams
    /// are still in flight together.
    Strict,
    /// The whole batch at once, one call. Faster for batches with long runs
    /// of one stream; a successor already sent when its predecessor comes
    /// back unroutable or nacked stays published.
    Pipelined,
}

/// The binding's preferred separator (CloudEvents AMQP binding §3.1.3.1).
pub const PREFIX_UNDERSCORE: &str = "cloudEvents_";
/// The binding's original separator, still permitted.
pub const PREFIX_COLON: &str = "cloudEvents:";

impl Config {
    /// Parses the `[config]` table, name → value, as the host hands it over.
    pub fn parse(entries: &[(String, String)]) -> Result<Config, String> {
        let mut exchange = None;
        let mut routing_key = None;
        let mut unroutable = None;
        let mut ordering = None;
        let mut header_prefix = None;
        for (key, value) in entries {
            let slot = match key.as_str() {
                "exchange" => &mut exchange,
                "routing-key" => &mut routing_key,
                "unroutable" => &mut unroutable,
                "ordering" => &mut ordering,
                "header-prefix" => &mut header_prefix,
                other => {
                    return Err(format!(
                        "unknown config key `{other}` (known: {KNOWN_KEYS})"
                    ))
                }
            };
            if slot.replace(value.as_str()).is_some() {
                return Err(format!("config key `{key}` is given more than once"));
            }
        }

        let exchange = exchange
            .ok_or("config key `exchange` is required: the exchange to publish every event to")?;
        if exchange.len() > 255 {
            return Err("config key `exchange` is longer than AMQP's 255 bytes".into());
        }
        let routing_key = routing_key
            .ok_or("config key `routing-key` is required: a template such as `documents.{type}`")?;
        let routing_key =
            Template::parse(routing_key).map_err(|e| format!("config key `routing-key`: {e}"))?;
        let unroutable = match unroutable.map(str::trim) {
            None | Some("reject") => Unroutable::Reject,
            Some("retry") => Unroutable::Retry,
            Some(other) => {
                return Err(format!(
                    "config key `unroutable` must be `reject` or `retry`, got `{other}`"
                ))
            }
        };
        let ordering = match ordering.map(str::trim) {
            None | Some("strict") => Ordering::Strict,
            Some("pipelined") => Ordering::Pipelined,
            Some(other) => {
                return Err(format!(
                    "config key `ordering` must be `strict` or `pipelined`, got `{other}`"
                ))
            }
        };
        let header_prefix = match header_prefix.map(str::trim) {
            None | Some(PREFIX_UNDERSCORE) => PREFIX_UNDERSCORE,
            Some(PREFIX_COLON) => PREFIX_COLON,
            Some(other) => {
                return Err(format!(
                    "config key `header-prefix` must be `{PREFIX_UNDERSCORE}` or `{PREFIX_COLON}`, got `{other}`"
                ))
            }
        };
        Ok(Config {
            exchange: exchange.to_string(),
            routing_key,
            unroutable,
            ordering,
            header_prefix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &[(&str, &str)]) -> Result<Config, String> {
        let entries: Vec<(String, String)> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(&entries)
    }

    #[test]
    fn defaults_apply() {
        let c = parse(&[
            ("exchange", "documents"),
            ("routing-key", "documents.{type}"),
        ])
        .unwrap();
        assert_eq!(c.exchange, "documents");
        assert_eq!(c.unroutable, Unroutable::Reject);
        assert_eq!(c.ordering, Ordering::Strict);
        assert_eq!(c.header_prefix, "cloudEvents_");
    }

    #[test]
    fn errors_name_the_key() {
        let err = parse(&[("routing-key", "k")]).unwrap_err();
        assert!(err.contains("`exchange`"), "{err}");
        let err = parse(&[("exchange", "x")]).unwrap_err();
        assert!(err.contains("`routing-key`"), "{err}");
        let err = parse(&[("exchange", "x"), ("routing-key", "a.{b")]).unwrap_err();
        assert!(err.contains("`routing-key`"), "{err}");
        let err = parse(&[
            ("exchange", "x"),
            ("routing-key", "k"),
            ("unroutable", "drop"),
        ])
        .unwrap_err();
        assert!(err.contains("`unroutable`"), "{err}");
        let err = parse(&[("exchange", "x"), ("routing-key", "k"), ("colour", "red")]).unwrap_err();
        assert!(err.contains("`colour`"), "{err}");
        let err = parse(&[
            ("exchange", "x"),
            ("routing-key", "k"),
            ("header-prefix", "ce-"),
        ])
        .unwrap_err();
        assert!(err.contains("`header-prefix`"), "{err}");
        let err = parse(&[
            ("exchange", "x"),
            ("routing-key", "k"),
            ("ordering", "loose"),
        ])
        .unwrap_err();
        assert!(err.contains("`ordering`"), "{err}");
    }

    #[test]
    fn choices() {
        let c = parse(&[
            ("exchange", "x"),
            ("routing-key", "k"),
            ("unroutable", "retry"),
            ("ordering", "pipelined"),
            ("header-prefix", "cloudEvents:"),
        ])
        .unwrap();
        assert_eq!(c.unroutable, Unroutable::Retry);
        assert_eq!(c.ordering, Ordering::Pipelined);
        assert_eq!(c.header_prefix, "cloudEvents:");
    }
}
