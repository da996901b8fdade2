//! `sdkpost`: a sink written only with the guest SDK (`plugins/sdk`): each
//! event's data is POSTed to `config.url` with `outboxd_sink::http::send`,
//! and the answer becomes the outcome through `outboxd_sink::outcome`. The
//! tests use it to see the SDK's HTTP helper and mapping against a real
//! receiver and the host's allow-list.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use outboxd_sink::http::{self, Method, Request, Url};
use outboxd_sink::{outcome, Event, Guest, Outcome};

static URL: Mutex<Option<Url>> = Mutex::new(None);

struct SdkPost;

impl Guest for SdkPost {
    fn init(config: Vec<(String, String)>) -> Result<(), String> {
        let url = config
            .iter()
            .find(|(k, _)| k == "url")
            .ok_or("config key `url` is required")?;
        let url = Url::parse(&url.1).map_err(|e| format!("config key `url` {e}"))?;
        *URL.lock().unwrap() = Some(url);
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let url = URL.lock().unwrap().clone().expect("init ran");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        batch
            .iter()
            .map(|event| {
                let headers = [("content-type".to_string(), b"application/json".to_vec())];
                let request = Request {
                    method: Method::Post,
                    url: &url,
                    headers: &headers,
                    body: &event.data,
                    timeout: Duration::from_secs(5),
                    max_body: 1024,
                };
                match http::send(&request) {
                    Ok(response) => outcome::for_response(
                        response.status,
                        response.header("retry-after"),
                        &response.body,
                        now,
                    ),
                    Err(code) => outcome::transport_error(&code),
                }
            })
            .collect()
    }
}

outboxd_sink::export!(SdkPost);
