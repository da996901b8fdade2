//! The couchdb relay loop: read the credentials, check the database,
//! install the design document, scan the `pending` view, then follow
//! `_changes` from the saved checkpoint, scanning again every
//! `scan-interval`; each document read becomes events ([`super::mapping`])
//! handed to [`crate::ingest::submit`].
//!
//! Must never: save a checkpoint past changes not yet ingested, or let a
//! bad document stop the relay of the rest of the database.

use super::*;

/// Run the source until `shutdown` turns true (`Ok`) or something fails.
pub async fn run(
    name: &str,
    config: &CouchdbConfig,
    ctx: &SourceContext,
    status: &StatusHandle,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), CouchdbError> {
    let credentials = config.credentials().map_err(CouchdbError::Config)?;
    let template = Template::parse(&config.event_type).map_err(CouchdbError::Config)?;
    let client = Client::new(
        &config.url,
        &config.database,
        credentials,
        config.request_timeout,
    );
    let mut relay = Relay {
        name,
        config,
        ctx,
        template,
        reported: HashSet::new(),
    };
    let live = live_after(config);
    let scan_fresh =
        config.scan_interval * 2 + config.feed_timeout + config.request_timeout + CHECK_SLACK;

    let info = client.db_info().await?;
    status.check("couchdb_reachable", true, None, Some(live));
    design::ensure(&client, config).await?;

    let database = format!("{}/{}", config.url.trim_end_matches('/'), config.database);
    let mut since = resume_since(name, ctx, &database, &info).await?;
    tracing::info!(source = name, database = %database, since = %client::since_param(&since), "couchdb source started");

    relay.scan(&client, &|| ()).await?;
    status.check("last_scan", true, None, Some(scan_fresh));
    status.cycle();
    let feed_view = format!("{}/{}", config.design_document, design::VIEW);
    let mut next_scan = Instant::now() + config.scan_interval;
    let mut caught_up_at = Instant::now();

    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= next_scan {
            // A long scan keeps the feed's checks fresh: the feed resumes
            // right after it.
            let renew = || {
                status.check("couchdb_reachable", true, None, Some(live));
                status.check("feed_following", true, None, Some(live));
            };
            relay.scan(&client, &renew).await?;
            status.check("last_scan", true, None, Some(scan_fresh));
            status.cycle();
            next_scan = Instant::now() + config.scan_interval;
            continue;
        }
        let wait = (next_scan - now).min(config.feed_timeout);
        let answer = tokio::select! {
            answer = client.changes(&since, config.page_size, wait, &feed_view) => answer?,
            _ = shutdown.changed() => return Ok(()),
        };
        status.check("couchdb_reachable", true, None, Some(live));
        match answer {
            None => caught_up_at = Instant::now(),
            Some(changes) => {
                if relay.changes(changes, &mut since, &database).await? {
                    caught_up_at = Instant::now();
                }
            }
        }
        status.check("feed_following", true, None, Some(live));
        status.cycle();
        ctx.metrics
            .source_checkpoint_lag
            .get_or_create(&crate::metrics::SourceLabel {
                source: name.to_string(),
            })
            .set(caught_up_at.elapsed().as_secs_f64());
    }
}

/// Where the feed starts: the saved checkpoint when it belongs to
/// `database` (its URL and name), else the database's present end
/// (`update_seq` of `info`): the first scan finds what is older.
async fn resume_since(
    name: &str,
    ctx: &SourceContext,
    database: &str,
    info: &Value,
) -> Result<Value, CouchdbError> {
    let saved = store_call(ctx, ctx.store.source_checkpoint(name)).await?;
    Ok(saved
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .filter(|cp| cp["database"] == json!(database))
        .map(|cp| cp["since"].clone())
        .unwrap_or_else(|| info.get("update_seq").cloned().unwrap_or(json!(0))))
}

/// A store call under the source's database timeout.
async fn store_call<T>(
    ctx: &SourceContext,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, CouchdbError> {
    match tokio::time::timeout(ctx.db_timeout, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CouchdbError::StoreTimeout(ctx.db_timeout)),
    }
}

struct Relay<'a> {
    name: &'a str,
    config: &'a CouchdbConfig,
    ctx: &'a SourceContext,
    template: Template,
    /// (document id, revision) pairs whose malformed entries were reported.
    reported: HashSet<(String, String)>,
}

impl Relay<'_> {
    /// Relay the documents of one feed answer, then checkpoint its
    /// `last_seq` as `since` (for `database`) when it moved. True when the
    /// answer was not a full page: the feed has caught up.
    async fn changes(
        &mut self,
        changes: Changes,
        since: &mut Value,
        database: &str,
    ) -> Result<bool, CouchdbError> {
        self.documents(&changes.docs).await?;
        if changes.last_seq != *since {
            *since = changes.last_seq;
            let checkpoint = json!({ "database": database, "since": since }).to_string();
            let save = self
                .ctx
                .store
                .save_source_checkpoint(self.name, &checkpoint);
            store_call(self.ctx, save).await?;
        }
        Ok(changes.count < self.config.page_size as usize)
    }

    /// Read the whole `pending` view, page by page (`limit` = page size + 1:
    /// the extra row is where the next page starts, CouchDB's documented
    /// paging), relaying each document once. Sets the oldest-pending gauge.
    /// `page_done` is called after each page.
    async fn scan(
        &mut self,
        client: &Client,
        page_done: &(dyn Fn() + Sync),
    ) -> Result<(), CouchdbError> {
        let page = self.config.page_size;
        let mut start: Option<(Value, String)> = None;
        let mut last_doc: Option<String> = None;
        let mut oldest: Option<i64> = None;
        loop {
            let rows = client
                .view_page(
                    &self.config.design_document,
                    design::VIEW,
                    start.as_ref().map(|(k, id)| (k, id.as_str())),
                    page + 1,
                )
                .await?;
            let more = rows.len() > page as usize;
            start = rows
                .get(page as usize)
                .map(|r| (r.key.clone(), r.id.clone()));
            let mut docs = Vec::new();
            for row in rows.into_iter().take(page as usize) {
                if last_doc.as_deref() == Some(row.id.as_str()) {
                    continue;
                }
                last_doc = Some(row.id);
                if let Some(doc) = row.doc {
                    docs.push(doc);
                }
            }
            if let Some(o) = self.documents(&docs).await? {
                oldest = Some(oldest.map_or(o, |x| x.min(o)));
            }
            page_done();
            if !more {
                break;
            }
        }
        let age = oldest
            .map(|ms| {
                let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
                ((now as i64 - ms).max(0)) as f64 / 1000.0
            })
            .unwrap_or(0.0);
        self.ctx
            .metrics
            .source_oldest_pending_age
            .get_or_create(&crate::metrics::SourceLabel {
                source: self.name.to_string(),
            })
            .set(age);
        Ok(())
    }

    /// Relay the pending entries of `docs`. Returns the oldest pending
    /// entry's `created_at` (Unix ms) among them.
    async fn documents(&mut self, docs: &[Value]) -> Result<Option<i64>, CouchdbError> {
        let mut groups: Vec<(String, Vec<NewEvent>)> = Vec::new();
        let mut oldest = None;
        let metrics = &self.ctx.metrics;
        for doc in docs {
            let id = doc.get("_id").and_then(Value::as_str).unwrap_or_default();
            if id.starts_with("_design/") {
                continue;
            }
            let out = mapping::read_document(doc, self.config, &self.template);
            if let Some(o) = out.oldest_pending_ms {
                oldest = Some(oldest.map_or(o, |x: i64| x.min(o)));
            }
            metrics.source_entries(self.name, "already_published", out.published);
            if !out.malformed.is_empty() || out.held > 0 {
                let rev = doc.get("_rev").and_then(Value::as_str).unwrap_or_default();
                if self.reported.len() >= MALFORMED_MEMORY {
                    self.reported.clear();
                }
                if self.reported.insert((id.to_string(), rev.to_string())) {
                    for reason in &out.malformed {
                        tracing::warn!(
                            source = self.name,
                            document = id,
                            rev,
                            "malformed outbox entry, not relayed: {reason}"
                        );
                    }
                    if out.held > 0 {
                        tracing::warn!(source = self.name, document = id, rev, held = out.held,
                            "pending entries held back behind a malformed entry of the same document (per-document order)");
                    }
                    metrics.source_entries(self.name, "malformed", out.malformed.len() as u64);
                }
            }
            if !out.events.is_empty() {
                groups.push((id.to_string(), out.events));
            }
        }
        if groups.is_empty() {
            return Ok(oldest);
        }
        let all: Vec<NewEvent> = groups.iter().flat_map(|(_, e)| e.iter().cloned()).collect();
        match self.submit(all).await {
            Ok(()) => {}
            // One document's entry conflicts: relay the others one document
            // at a time, so it holds back nobody else.
            Err(SubmitError::Refused(_)) => {
                for (doc, events) in groups {
                    if let Err(SubmitError::Refused(e)) = self.submit(events).await {
                        tracing::error!(source = self.name, document = %doc,
                            "outbox entry refused by the store, not relayed: {e}");
                        metrics.source_entries(self.name, "conflict", 1);
                    }
                }
            }
            Err(SubmitError::Failed(e)) => return Err(e),
        }
        Ok(oldest)
    }

    /// Ingest `events` in one transaction; counts relayed and duplicates.
    async fn submit(&self, events: Vec<NewEvent>) -> Result<(), SubmitError> {
        let ctx = self.ctx;
        let call = crate::ingest::submit(&*ctx.store, &ctx.routes, &ctx.wake, &ctx.metrics, events);
        match tokio::time::timeout(ctx.db_timeout, call).await {
            Err(_) => Err(SubmitError::Failed(CouchdbError::StoreTimeout(
                ctx.db_timeout,
            ))),
            Ok(Err(IngestError::Store(e))) => Err(SubmitError::Failed(e.into())),
            Ok(Err(e)) => Err(SubmitError::Refused(e)),
            Ok(Ok(results)) => {
                let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
                ctx.metrics
                    .source_entries(self.name, "relayed", results.len() as u64 - duplicates);
                ctx.metrics
                    .source_entries(self.name, "duplicate", duplicates);
                Ok(())
            }
        }
    }
}

enum SubmitError {
    /// The store refused the content (conflict, sequence not advancing).
    Refused(IngestError),
    /// The store failed: retry the run.
    Failed(CouchdbError),
}
