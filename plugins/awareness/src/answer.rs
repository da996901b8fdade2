//! What the awareness service's answer to `POST /ingest` means for the
//! event (its IngestController.ts and IngestService.ts):
//!
//! | answer                         | outcome                                             |
//! |--------------------------------|-----------------------------------------------------|
//! | 2xx (`200 {ok, duplicate, …}`) | `delivered`, a duplicate included                   |
//! | 409 (eventId reused)           | `reject`, quoting the service's `error`             |
//! | 400 (no `id` or `schemaId`)    | `reject`, quoting the service's `error`             |
//! | 401 (secret refused)           | `retry`: the secret is wrong, not the event         |
//! | 408, 425, 429, 5xx             | `retry`, honouring `Retry-After`                    |
//! | other statuses                 | `reject`, quoting the body                          |
//!
//! A refused secret refuses every event alike; dead-lettering on it would
//! empty the backlog into the dead letters while an operator fixes one
//! setting, so it is retried, saying why, until the secret is right.

use std::time::Duration;

use outboxd_sink::http::Response;
use outboxd_sink::outcome;
use outboxd_sink::{Outcome, RetryInfo};

/// The retry reason for a 401, shown to operators in the delivery's last
/// error.
pub const SECRET_REFUSED: &str = "HTTP 401: the awareness service refused the ingest secret (x-ingest-secret); fix the sink's `secret` — the events wait, nothing is dead-lettered";

/// The outcome of the service's `response`; `now` is the time since the
/// unix epoch (for a `Retry-After` date).
pub fn judge(response: &Response, now: Duration) -> Outcome {
    let retry_after = response.header("retry-after");
    match response.status {
        401 => Outcome::Retry(RetryInfo {
            reason: SECRET_REFUSED.into(),
            after_ms: retry_after.and_then(|v| outcome::retry_after_ms(v, now)),
        }),
        400 | 409 => Outcome::Reject(outcome::reject_reason(
            response.status,
            service_error(&response.body).as_bytes(),
        )),
        status => outcome::for_response(status, retry_after, &response.body, now),
    }
}

/// The service's `{"error": "…"}` message, else the body as text.
fn service_error(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(response: &Response) -> Outcome {
        super::judge(response, Duration::from_secs(1_700_000_000))
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_services_answers() {
        let ok =
            r#"{"ok":true,"packetId":"p","eventId":"e","duplicate":true,"deliveriesQueued":0}"#;
        assert!(matches!(judge(&response(200, &[], ok)), Outcome::Delivered));
        match judge(&response(
            409,
            &[],
            r#"{"error":"eventId e-1 was already used for a different event"}"#,
        )) {
            Outcome::Reject(reason) => assert_eq!(
                reason,
                "HTTP 409: eventId e-1 was already used for a different event"
            ),
            other => panic!("409 must reject: {other:?}"),
        }
        match judge(&response(
            400,
            &[],
            r#"{"error":"id and schemaId are required"}"#,
        )) {
            Outcome::Reject(reason) => {
                assert_eq!(reason, "HTTP 400: id and schemaId are required")
            }
            other => panic!("400 must reject: {other:?}"),
        }
        match judge(&response(
            401,
            &[("retry-after", "3")],
            r#"{"error":"invalid ingest secret"}"#,
        )) {
            Outcome::Retry(info) => {
                assert_eq!(info.reason, SECRET_REFUSED);
                assert_eq!(info.after_ms, Some(3_000));
            }
            other => panic!("401 must retry: {other:?}"),
        }
        match judge(&response(429, &[("retry-after", "2")], "")) {
            Outcome::Retry(info) => assert_eq!(info.after_ms, Some(2_000)),
            other => panic!("429 must retry: {other:?}"),
        }
        assert!(matches!(judge(&response(503, &[], "")), Outcome::Retry(_)));
        assert!(matches!(
            judge(&response(404, &[], "no")),
            Outcome::Reject(_)
        ));
    }

    #[test]
    fn a_long_or_odd_reason_is_bounded() {
        let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(5000));
        match judge(&response(409, &[], &long)) {
            Outcome::Reject(reason) => assert!(reason.chars().count() <= 210, "{}", reason.len()),
            other => panic!("{other:?}"),
        }
        match judge(&response(409, &[], "plain\ntext")) {
            Outcome::Reject(reason) => assert_eq!(reason, "HTTP 409: plain text"),
            other => panic!("{other:?}"),
        }
    }
}
