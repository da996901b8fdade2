//! Routes kept apart: whether an `amqp` sink could publish onto a queue an
//! `amqp` source consumes (docs/guides/sources.md, "Routes kept apart": ingress
//! routes such as `documents.ingest.#` are kept apart from the routes
//! outboxd publishes to, or outboxd would read back its own output).
//!
//! Owns the overlap test of AMQP topic patterns ([`topics_overlap`]) and
//! the check of one sink manifest against one source ([`check_sink`]). A
//! sink is anything whose manifest grants `capabilities.amqp` on the same
//! broker and virtual host: its `[config] exchange` (or, when absent, any
//! exchange its grant allows) and its `[config] routing-key` template (each
//! word holding a `{placeholder}` may become any words; absent: any key)
//! are compared with the source's bindings and, for the default exchange,
//! with the queue's name.
//!
//! Must never: pass a configuration in which some event could be published
//! where the source consumes it. It is conservative: an overlap that only
//! some attribute values could produce is refused too. Exchange-to-exchange
//! bindings made outside outboxd are not seen.

use super::AmqpSourceConfig;
use crate::event::glob_match;
use crate::sources::SinkView;

/// Whether some routing key matches both topic patterns (`*` one word, `#`
/// zero or more words, words separated by `.`).
pub fn topics_overlap(a: &str, b: &str) -> bool {
    let a: Vec<&str> = a.split('.').collect();
    let b: Vec<&str> = b.split('.').collect();
    let mut memo = vec![vec![None; b.len() + 1]; a.len() + 1];
    overlap(&a, &b, 0, 0, &mut memo)
}

fn overlap(a: &[&str], b: &[&str], i: usize, j: usize, memo: &mut Vec<Vec<Option<bool>>>) -> bool {
    if let Some(known) = memo[i][j] {
        return known;
    }
    let result = match (a.get(i), b.get(j)) {
        (None, None) => true,
        (Some(&"#"), _) if overlap(a, b, i + 1, j, memo) => true,
        (_, Some(&"#")) if overlap(a, b, i, j + 1, memo) => true,
        // `#` takes one more word of the other side (a word, `*`, or `#`).
        (Some(&"#"), Some(_)) => overlap(a, b, i, j + 1, memo),
        (Some(_), Some(&"#")) => overlap(a, b, i + 1, j, memo),
        (Some(x), Some(y)) if *x == "*" || *y == "*" || x == y => overlap(a, b, i + 1, j + 1, memo),
        _ => false,
    };
    memo[i][j] = Some(result);
    result
}

/// A routing-key template of the `amqp` sink as a topic pattern: a word
/// with a `{placeholder}` becomes `#` (an attribute value may hold dots).
pub fn template_pattern(template: &str) -> String {
    template
        .split('.')
        .map(|word| {
            let literal = word.replace("{{", "").replace("}}", "");
            if literal.contains('{') {
                "#"
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `Err` names the sink, its exchange and routing key, and the source's
/// binding they could reach.
pub fn check_sink(
    source: &str,
    config: &AmqpSourceConfig,
    source_url: &str,
    sink: &SinkView<'_>,
) -> Result<(), String> {
    let Some(grant) = &sink.amqp else {
        return Ok(());
    };
    if !crate::broker::same_broker(grant.url, source_url) {
        return Ok(());
    }
    let configured = sink.config.get("exchange");
    let publishes_to = |exchange: &str| match configured {
        Some(e) => e == exchange,
        None => grant.exchanges.iter().any(|p| glob_match(p, exchange)),
    };
    let key = sink
        .config
        .get("routing-key")
        .map(|t| template_pattern(t))
        .unwrap_or_else(|| "#".to_string());
    let shown_exchange = configured
        .map(|e| format!("exchange {e:?}"))
        .unwrap_or_else(|| format!("exchanges {:?}", grant.exchanges));
    let refuse = |reached: String| {
        Err(format!(
            "sink {:?} publishes to {shown_exchange} with routing key {:?}, which could land its own events on \
             queue {:?} of source {source:?} ({reached}): keep ingress routes apart from the routes outboxd \
             publishes to (another exchange, or routing keys that do not overlap)",
            sink.name,
            sink.config.get("routing-key").map(String::as_str).unwrap_or("(any)"),
            config.queue,
        ))
    };
    for (i, binding) in config.bindings.iter().enumerate() {
        if !publishes_to(&binding.exchange) {
            continue;
        }
        for pattern in &binding.routing_keys {
            let reaches = match binding.exchange_kind.as_str() {
                "topic" => topics_overlap(&key, pattern),
                "direct" => topics_overlap(&key, &pattern.replace(['*', '#'], "\u{0}")),
                // fanout and headers exchanges ignore the routing key.
                _ => true,
            };
            if reaches {
                return refuse(format!(
                    "bindings[{i}]: exchange {:?}, routing key {pattern:?}",
                    binding.exchange
                ));
            }
        }
    }
    // The default exchange routes a key equal to a queue's name to it.
    if publishes_to("") && topics_overlap(&key, &config.queue.replace(['*', '#'], "\u{0}")) {
        return refuse("the default exchange routes the queue's own name to it".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_overlap_like_rabbitmq_matches() {
        assert!(topics_overlap("documents.#", "documents.ingest.#"));
        assert!(topics_overlap("documents.*.person", "documents.ingest.#"));
        assert!(topics_overlap("#", "a.b"));
        assert!(topics_overlap("a.*.c", "a.b.*"));
        assert!(topics_overlap("a.#.c", "a.c"));
        assert!(!topics_overlap("documents.new.#", "documents.ingest.#"));
        assert!(!topics_overlap("documents.*", "documents.ingest.#.x.y"));
        assert!(!topics_overlap("a.*", "a"));
        assert!(!topics_overlap("a.b", "a.b.c"));
        assert!(topics_overlap("a.#", "a"));
    }

    fn source(bindings: &str) -> AmqpSourceConfig {
        toml::from_str(&format!(
            "url = \"amqp://u:p@127.0.0.1:5672/%2f\"\nqueue = \"orders.in\"\n{bindings}"
        ))
        .unwrap()
    }

    /// A sink named `rabbit` granted every exchange (`*`) on `url`, with
    /// its `[config] exchange` and `routing-key` when given.
    struct Sink {
        url: String,
        exchanges: Vec<String>,
        config: std::collections::BTreeMap<String, String>,
    }

    impl Sink {
        fn view(&self) -> SinkView<'_> {
            SinkView {
                name: "rabbit",
                config: &self.config,
                amqp: Some(crate::sources::SinkAmqp {
                    url: &self.url,
                    exchanges: &self.exchanges,
                }),
            }
        }
    }

    fn sink(url: &str, exchange: Option<&str>, key: Option<&str>) -> Sink {
        let mut config = std::collections::BTreeMap::new();
        if let Some(e) = exchange {
            config.insert("exchange".to_string(), e.to_string());
        }
        if let Some(k) = key {
            config.insert("routing-key".to_string(), k.to_string());
        }
        Sink {
            url: url.to_string(),
            exchanges: vec!["*".to_string()],
            config,
        }
    }

    const URL: &str = "amqp://u:p@127.0.0.1:5672/%2f";

    #[test]
    fn sinks_are_checked_per_broker_exchange_kind_and_default_exchange() {
        let topic = source(
            "[[bindings]]\nexchange = \"documents\"\nrouting-keys = [\"documents.ingest.#\"]\n",
        );
        let check = |c: &AmqpSourceConfig, m: &Sink| check_sink("src", c, URL, &m.view());
        assert!(check(
            &topic,
            &sink(URL, Some("documents"), Some("documents.{type}"))
        )
        .is_err());
        assert!(check(
            &topic,
            &sink(URL, Some("documents"), Some("documents.new.{type}"))
        )
        .is_ok());
        assert!(check(&topic, &sink(URL, Some("elsewhere"), Some("#"))).is_ok());
        // Another broker, or another vhost, cannot reach the queue.
        assert!(check(
            &topic,
            &sink(
                "amqp://u:p@127.0.0.1:5673/%2f",
                Some("documents"),
                Some("#")
            )
        )
        .is_ok());
        assert!(check(
            &topic,
            &sink(
                "amqp://u:p@127.0.0.1:5672/other",
                Some("documents"),
                Some("#")
            )
        )
        .is_ok());
        // No configured exchange: any granted one (`*`) could be it; no
        // routing-key template: any key.
        let e = check(&topic, &sink(URL, None, None)).unwrap_err();
        assert!(e.contains("\"rabbit\"") && e.contains("bindings[0]"), "{e}");
        // A fanout binding takes every key.
        let fanout = source("[[bindings]]\nexchange = \"fan\"\nexchange-kind = \"fanout\"\nrouting-keys = [\"x\"]\n");
        assert!(check(&fanout, &sink(URL, Some("fan"), Some("anything.{type}"))).is_err());
        // A direct binding matches its key literally.
        let direct = source("[[bindings]]\nexchange = \"d\"\nexchange-kind = \"direct\"\nrouting-keys = [\"a.*\"]\n");
        assert!(check(&direct, &sink(URL, Some("d"), Some("a.b"))).is_ok());
        assert!(check(&direct, &sink(URL, Some("d"), Some("a.{type}"))).is_err());
        // The default exchange routes the queue's name to it.
        let e = check(&topic, &sink(URL, Some(""), Some("orders.in"))).unwrap_err();
        assert!(e.contains("default exchange"), "{e}");
        assert!(check(&topic, &sink(URL, Some(""), Some("orders.out"))).is_ok());
    }

    #[test]
    fn templates_become_patterns() {
        assert_eq!(
            template_pattern("documents.{operation}.{type}"),
            "documents.#.#"
        );
        assert_eq!(
            template_pattern("documents.new.{{lit}}"),
            "documents.new.{{lit}}"
        );
        assert!(topics_overlap(
            &template_pattern("documents.{type}"),
            "documents.ingest.#"
        ));
        assert!(!topics_overlap(
            &template_pattern("published.{type}"),
            "documents.ingest.#"
        ));
    }
}
