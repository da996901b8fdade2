//! The requests the relay makes to CouchDB, each one documented by Apache
//! CouchDB 3.x's HTTP API: `GET /{db}` (database information),
//! `GET`/`PUT /{db}/_design/{ddoc}` (the design document),
//! `GET /{db}/_design/{ddoc}/_view/{view}` (`startkey`, `startkey_docid`,
//! `limit`, `include_docs`) and `GET /{db}/_changes` (`feed=longpoll`,
//! `since`, `timeout`, `limit`, `include_docs`, `filter=_view` with `view`).
//!
//! Must never: log or put into an error the password, or use an endpoint
//! CouchDB does not document (the test server, pouchdb-server, has some).

use std::time::Duration;

use serde_json::Value;

use super::config::Credentials;

/// A failed request, naming what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CouchError {
    /// No answer: connection refused, timed out, reset.
    #[error("CouchDB {what}: no answer from {server}: {reason}")]
    Unreachable {
        what: String,
        server: String,
        reason: String,
    },
    /// An answer other than the expected status.
    #[error("CouchDB {what}: HTTP {status}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    /// A body that is not what CouchDB documents.
    #[error("CouchDB {what}: unexpected answer: {problem}")]
    Answer { what: String, problem: String },
}

/// Most characters of an error body quoted in an error.
const BODY_QUOTE: usize = 300;

/// One row of a view page.
#[derive(Debug)]
pub struct Row {
    pub id: String,
    pub key: Value,
    /// The document (`include_docs=true`); `None` if it was deleted.
    pub doc: Option<Value>,
}

/// One answer of the change feed.
#[derive(Debug)]
pub struct Changes {
    /// Changed documents (deleted ones and design documents left out).
    pub docs: Vec<Value>,
    /// Changes in this answer, including those left out.
    pub count: usize,
    /// Where the next request resumes (`since`), as CouchDB gave it.
    pub last_seq: Value,
}

/// A client for one database.
pub struct Client {
    http: reqwest::Client,
    /// Server URL without a trailing slash, for messages.
    server: String,
    db_url: String,
    credentials: Option<Credentials>,
    request_timeout: Duration,
}

/// A database or document id as one URL path segment.
fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `since` value as a query parameter: CouchDB 2+ gives opaque strings,
/// older servers (and pouchdb-server) integers.
pub fn since_param(seq: &Value) -> String {
    match seq {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Client {
    /// A client for `database` on `server`.
    pub fn new(
        server: &str,
        database: &str,
        credentials: Option<Credentials>,
        request_timeout: Duration,
    ) -> Client {
        let server = server.trim_end_matches('/').to_string();
        Client {
            http: reqwest::Client::new(),
            db_url: format!("{server}/{}", segment(database)),
            server,
            credentials,
            request_timeout,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = if path.is_empty() {
            self.db_url.clone()
        } else {
            format!("{}/{path}", self.db_url)
        };
        let mut r = self
            .http
            .request(method, url)
            .header("accept", "application/json")
            .timeout(self.request_timeout);
        if let Some(c) = &self.credentials {
            r = r.basic_auth(&c.username, Some(&c.password));
        }
        r
    }

    fn unreachable(&self, what: &str, e: reqwest::Error) -> CouchError {
        // reqwest's Display holds the URL, which holds no credentials.
        CouchError::Unreachable {
            what: what.to_string(),
            server: self.server.clone(),
            reason: e.without_url().to_string(),
        }
    }

    async fn send(
        &self,
        what: &str,
        r: reqwest::RequestBuilder,
    ) -> Result<(u16, Value), CouchError> {
        let response = r.send().await.map_err(|e| self.unreachable(what, e))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|e| self.unreachable(what, e))?;
        if !(200..300).contains(&status) && status != 404 && status != 409 {
            return Err(CouchError::Status {
                what: what.to_string(),
                status,
                body: text.chars().take(BODY_QUOTE).collect(),
            });
        }
        let body = serde_json::from_str(&text).map_err(|e| CouchError::Answer {
            what: what.to_string(),
            problem: format!("not JSON: {e}"),
        })?;
        Ok((status, body))
    }

    fn expect(what: &str, status: u16, body: &Value) -> Result<(), CouchError> {
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(CouchError::Status {
                what: what.to_string(),
                status,
                body: body.to_string().chars().take(BODY_QUOTE).collect(),
            })
        }
    }

    /// `GET /{db}`: the database's information (`update_seq` among it).
    pub async fn db_info(&self) -> Result<Value, CouchError> {
        let what = "GET /{db}";
        let (status, body) = self
            .send(what, self.request(reqwest::Method::GET, ""))
            .await?;
        Self::expect(what, status, &body)?;
        Ok(body)
    }

    /// `GET /{db}/_design/{name}`; `None` when there is none.
    pub async fn design(&self, name: &str) -> Result<Option<Value>, CouchError> {
        let what = "GET /{db}/_design/{ddoc}";
        let path = format!("_design/{}", segment(name));
        let (status, body) = self
            .send(what, self.request(reqwest::Method::GET, &path))
            .await?;
        if status == 404 {
            return Ok(None);
        }
        Self::expect(what, status, &body)?;
        Ok(Some(body))
    }

    /// `PUT /{db}/_design/{name}`. `Ok(false)` on 409 (someone else wrote
    /// it first: read it again).
    pub async fn put_design(&self, name: &str, doc: &Value) -> Result<bool, CouchError> {
        let what = "PUT /{db}/_design/{ddoc}";
        let path = format!("_design/{}", segment(name));
        let (status, body) = self
            .send(what, self.request(reqwest::Method::PUT, &path).json(doc))
            .await?;
        if status == 409 {
            return Ok(false);
        }
        Self::expect(what, status, &body)?;
        Ok(true)
    }

    /// One page of view `view` of design document `ddoc`, with documents:
    /// at most `limit` rows from (`startkey`, `startkey_docid`) on.
    pub async fn view_page(
        &self,
        ddoc: &str,
        view: &str,
        start: Option<(&Value, &str)>,
        limit: u32,
    ) -> Result<Vec<Row>, CouchError> {
        let what = "GET /{db}/_design/{ddoc}/_view/{view}";
        let path = format!("_design/{}/_view/{}", segment(ddoc), segment(view));
        let mut query = vec![
            ("include_docs".to_string(), "true".to_string()),
            ("limit".to_string(), limit.to_string()),
        ];
        if let Some((key, docid)) = start {
            query.push(("startkey".into(), key.to_string()));
            query.push(("startkey_docid".into(), docid.to_string()));
        }
        let (status, body) = self
            .send(
                what,
                self.request(reqwest::Method::GET, &path).query(&query),
            )
            .await?;
        Self::expect(what, status, &body)?;
        let bad = |problem: &str| CouchError::Answer {
            what: what.to_string(),
            problem: problem.to_string(),
        };
        let rows = body
            .get("rows")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `rows` list"))?;
        rows.iter()
            .map(|row| {
                Ok(Row {
                    id: row
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("a row without `id`"))?
                        .to_string(),
                    key: row.get("key").cloned().unwrap_or(Value::Null),
                    doc: row.get("doc").filter(|d| d.is_object()).cloned(),
                })
            })
            .collect()
    }

    /// `GET /{db}/_changes?feed=longpoll&include_docs=true` from `since`:
    /// answers as soon as something changed, or after `timeout` with no
    /// results. A server that ignores `timeout` (pouchdb-server does) is
    /// cut off a request timeout later, which also means "nothing changed":
    /// `Ok(None)`.
    ///
    /// `view` (`ddoc/view`) is CouchDB's `filter=_view`: only documents
    /// that emit a row in that view are returned — for the `pending` view,
    /// documents holding a pending entry, so the revisions that mark
    /// entries published are not read back.
    pub async fn changes(
        &self,
        since: &Value,
        limit: u32,
        timeout: Duration,
        view: &str,
    ) -> Result<Option<Changes>, CouchError> {
        let what = "GET /{db}/_changes";
        let query = [
            ("filter", "_view".to_string()),
            ("view", view.to_string()),
            ("feed", "longpoll".to_string()),
            ("include_docs", "true".to_string()),
            ("since", since_param(since)),
            ("limit", limit.to_string()),
            ("timeout", timeout.as_millis().to_string()),
        ];
        let r = self
            .request(reqwest::Method::GET, "_changes")
            .query(&query)
            .timeout(timeout + self.request_timeout);
        let response = match r.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Ok(None),
            Err(e) => return Err(self.unreachable(what, e)),
        };
        let status = response.status().as_u16();
        let text = match response.text().await {
            Ok(t) => t,
            Err(e) if e.is_timeout() => return Ok(None),
            Err(e) => return Err(self.unreachable(what, e)),
        };
        let body: Value = serde_json::from_str(&text).map_err(|e| CouchError::Answer {
            what: what.to_string(),
            problem: format!("not JSON: {e}"),
        })?;
        Self::expect(what, status, &body)?;
        let bad = |problem: &str| CouchError::Answer {
            what: what.to_string(),
            problem: problem.to_string(),
        };
        let results = body
            .get("results")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `results` list"))?;
        let last_seq = body
            .get("last_seq")
            .cloned()
            .ok_or_else(|| bad("no `last_seq`"))?;
        let docs = results
            .iter()
            .filter(|r| !r.get("deleted").and_then(Value::as_bool).unwrap_or(false))
            .filter(|r| {
                !r.get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("_design/")
                    .starts_with("_design/")
            })
            .filter_map(|r| r.get("doc").filter(|d| d.is_object()).cloned())
            .collect();
        Ok(Some(Changes {
            docs,
            count: results.len(),
            last_seq,
        }))
    }
}
