//! The `POST /ingest` request for one event: the dispatcher's body by the
//! shared mapping (`awareness_wire::ingest_body`) and its headers. A pure
//! function of the event and the configuration, so it is tested natively.

use awareness_wire::Packet;
use outboxd_sink::pending::Header;
use outboxd_sink::Event;

use crate::config::Config;

/// Sent as `user-agent`.
const USER_AGENT: &str = concat!("outboxd-awareness/", env!("CARGO_PKG_VERSION"));

/// Headers and body for `event`; `Err` is why the event can never be sent
/// (no `schemaid`, data that is not JSON), for a reject.
pub fn build(config: &Config, event: &Event) -> Result<(Vec<Header>, Vec<u8>), String> {
    let body = awareness_wire::ingest_body(&Packet::from_event(event)?);
    let headers = vec![
        ("content-type".into(), b"application/json".to_vec()),
        ("content-length".into(), body.len().to_string().into_bytes()),
        ("user-agent".into(), USER_AGENT.as_bytes().to_vec()),
        ("x-ingest-secret".into(), config.secret.as_bytes().to_vec()),
    ];
    Ok((headers, body))
}

/// [`build`], with the attempt's `traceparent` header
/// (`outboxd_sink::trace`) when there is one.
pub fn build_traced(config: &Config, event: &Event) -> Result<(Vec<Header>, Vec<u8>), String> {
    let (mut headers, body) = build(config, event)?;
    outboxd_sink::trace::add_header(&mut headers, event, String::into_bytes);
    Ok((headers, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse(&outboxd_sink::config::entries(&[
            ("url", "http://127.0.0.1:4000"),
            ("secret", "ingest s3cret"),
        ]))
        .unwrap()
    }

    fn event() -> Event {
        Event {
            id: "evt-1".into(),
            source: "neo4j://vault".into(),
            type_: "w3ds.metaenvelope.update".into(),
            subject: None,
            stream: "envelope-9".into(),
            sequence: 7,
            time: "2026-11-30T01:02:03.456Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: br#"{"k":"v"}"#.to_vec(),
            extensions: vec![("schemaid".into(), "s-1".into())],
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03.456789Z".into(),
        }
    }

    #[test]
    fn headers_carry_the_secret_and_the_json_body() {
        let (headers, body) = build(&config(), &event()).unwrap();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(get("x-ingest-secret").as_deref(), Some("ingest s3cret"));
        assert_eq!(get("content-type").as_deref(), Some("application/json"));
        assert_eq!(get("content-length"), Some(body.len().to_string()));
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"eventId":"evt-1","id":"envelope-9","w3id":null,"evaultPublicKey":null,"data":{"k":"v"},"schemaId":"s-1","operation":null,"requestingPlatform":null,"occurredAt":"2026-11-30T01:02:03.456Z","streamVersion":7}"#
        );
    }

    #[test]
    fn an_event_without_schemaid_is_refused() {
        let mut e = event();
        e.extensions.clear();
        assert!(build(&config(), &e).unwrap_err().contains("schemaid"));
    }
}
