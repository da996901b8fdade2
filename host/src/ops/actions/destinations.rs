//! The destination actions (`/v1/admin/destinations`, `outboxd
//! destinations …`; a platform list is [`super::sync`]).
//!
//! Owns: checking a [`Spec`] before anything is written — unknown sink, a
//! name taken, a URL outside the manifest's grant or on an internal
//! address, a filter that does not parse, a rate of 0, a retry override
//! past the manifest's, a configuration the plugin's own `init` refuses —
//! each refused with the field it names, nothing half-created; writing
//! records (create, idempotent put, state changes, rotation, delete with
//! park or purge), their secrets sealed before they are written
//! (`crate::destinations::sealing`; without a key, a secret is refused
//! naming the setting and nothing is written); the answers (the record
//! without secrets, [`DestinationView`], with health and queue in a
//! listing, [`Listed`]).
//!
//! Must never: return a secret except in the answer that created or
//! rotated it; write a secret in the clear when a key is configured;
//! delete deliveries unless the request says `purge`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{invalid, listed, AdminError};
use crate::destinations::health::Health;
use crate::destinations::live::{retry_within, Live};
use crate::destinations::sealing::{self, SealingError};
use crate::destinations::{
    now_ms, secret, Destination, DestinationView, Filter, RetryOverride, State, MAX_NAME_BYTES,
};
use crate::plugin::egress::EgressPolicy;
use crate::plugin::registry::Registry;
use crate::plugin::Plugin;
use crate::routing::routes::Router;
use crate::store::{Purged, PutMode, Store, StoreError};

/// What the actions work on.
#[derive(Clone)]
pub struct Context {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The destinations as loaded.
    pub live: Arc<Live>,
    /// The loaded plugins (config is checked against them).
    pub plugins: Arc<Registry>,
    /// The routing table.
    pub routes: Arc<Router>,
    /// Wake-ups of the delivery loops.
    pub wake: Arc<crate::wakeups::Wakeups>,
}

/// A destination as a request gives it (`POST`, `PUT`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The plugin (manifest `name`) that serves it.
    pub sink: String,
    #[serde(default)]
    /// Configuration merged over the manifest's `[config]`.
    pub config: BTreeMap<String, String>,
    /// The signing secret, given to the plugin as config `secret`. Omitted
    /// on create: a Standard Webhooks `whsec_…` secret is generated and
    /// returned once. `""`: no secret. Omitted on `PUT` of an existing
    /// destination: the stored one is kept.
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    /// Which events it takes.
    pub filter: Filter,
    #[serde(default)]
    /// A retry policy within the manifest's bounds.
    pub retry: Option<RetryOverride>,
    #[serde(default)]
    /// Deliveries per second at most (a token bucket).
    pub rate_per_second: Option<u32>,
    #[serde(default)]
    /// Events in flight at most (the claim's size).
    pub max_in_flight: Option<u32>,
    /// `active` or `paused`. Omitted: `active` for a new destination, the
    /// stored state (paused or disabled, with its reason) otherwise.
    #[serde(default)]
    pub state: Option<State>,
    /// Who keeps it (`sync` for a platform sync); shown, not interpreted
    /// except by that sync.
    #[serde(default)]
    pub managed_by: Option<String>,
    /// RFC 3339: also queue the stored events since then that match, in
    /// stream order (only when the destination is created).
    #[serde(default)]
    pub backfill_since: Option<String>,
}

/// The answer of a create or put.
#[derive(Debug, Serialize)]
pub struct Written {
    /// True when it did not exist before.
    pub created: bool,
    /// False when a `PUT` found the same destination stored (nothing
    /// written).
    pub changed: bool,
    /// The destination as the API shows it (no secret).
    pub destination: DestinationView,
    /// The secret, in the answer that generated it only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Deliveries a `backfill_since` created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backfilled: Option<u64>,
}

/// Create destination `name`; refused if it exists.
pub async fn create(ctx: &Context, name: &str, spec: Spec) -> Result<Written, AdminError> {
    write(ctx, name, spec, true).await
}

/// Create or replace destination `name` (idempotent: the same spec again
/// writes nothing).
pub async fn put(ctx: &Context, name: &str, spec: Spec) -> Result<Written, AdminError> {
    write(ctx, name, spec, false).await
}

async fn write(
    ctx: &Context,
    name: &str,
    spec: Spec,
    create_only: bool,
) -> Result<Written, AdminError> {
    check_name(ctx, name)?;
    let stored = find(ctx, name).await?;
    if create_only && stored.is_some() {
        return Err(exists(name));
    }
    let plugin = ctx.plugins.serving(&spec.sink).ok_or_else(|| {
        invalid(
            "sink",
            format!(
                "no plugin named {:?} is loaded (loaded: {})",
                spec.sink,
                listed(&ctx.plugins.loaded())
            ),
        )
    })?;
    let since_ms = match &spec.backfill_since {
        Some(t) => Some(crate::rfc3339::parse_ms(t).map_err(|e| invalid("backfill_since", e))?),
        None => None,
    };
    let secrets = ctx.live.secrets();
    // Compared and checked in the clear; written sealed.
    let previous = match &stored {
        Some((d, _)) => Some(sealing::open_record(d, secrets).map_err(AdminError::Secret)?),
        None => None,
    };
    let (destination, generated) = record(name, &spec, previous.as_ref())?;
    check(&plugin, &destination, secrets).await?;
    if let (Some((old, _)), Some(previous)) = (&stored, &previous) {
        if *previous == destination {
            return Ok(Written {
                created: false,
                changed: false,
                destination: old.redacted(),
                secret: None,
                backfilled: None,
            });
        }
    }
    let destination = sealing::seal_record(&destination, secrets).map_err(AdminError::Secret)?;
    let text = serde_json::to_string(&destination).map_err(|e| invalid("", e.to_string()))?;
    let mode = match &stored {
        None => PutMode::Create,
        Some((_, revision)) => PutMode::Revision(*revision),
    };
    if ctx
        .store
        .put_destination(name, &destination.sink, &text, mode)
        .await?
        .is_none()
    {
        return Err(match mode {
            PutMode::Create if create_only => exists(name),
            _ => changed(name),
        });
    }
    ctx.live.refresh().await?;
    let created = stored.is_none();
    let backfilled = match since_ms.filter(|_| created) {
        Some(since) => {
            let (_, n) =
                crate::routing::routes::backfill(&*ctx.store, &ctx.routes, name, since).await?;
            ctx.wake.keys([name]);
            Some(n)
        }
        None => None,
    };
    tracing::info!(destination = %name, sink = %destination.sink, created, "destination written");
    Ok(Written {
        created,
        changed: true,
        destination: destination.redacted(),
        secret: generated,
        backfilled,
    })
}

/// Build the record `spec` asks for over `previous`; returns it and the
/// secret generated for it, if one was.
fn record(
    name: &str,
    spec: &Spec,
    previous: Option<&Destination>,
) -> Result<(Destination, Option<String>), AdminError> {
    if spec.config.contains_key("secret") || spec.config.contains_key("previous-secret") {
        return Err(invalid(
            "config.secret",
            "give the signing secret as the destination's `secret`, not in `config` (it is then never shown)",
        ));
    }
    for (key, value) in &spec.config {
        if key.is_empty() {
            return Err(invalid("config", "a key is empty"));
        }
        if crate::secrets::is_sealed(value) {
            return Err(invalid(
                format!("config.{key}"),
                "values starting with `enc:` are kept for sealed secrets; give the value itself",
            ));
        }
    }
    if spec
        .secret
        .as_deref()
        .is_some_and(crate::secrets::is_sealed)
    {
        return Err(invalid(
            "secret",
            "values starting with `enc:` are kept for sealed secrets; give the secret itself",
        ));
    }
    spec.filter
        .validate()
        .map_err(|(field, message)| invalid(field, message))?;
    for (field, value) in [
        ("rate_per_second", spec.rate_per_second),
        ("max_in_flight", spec.max_in_flight),
    ] {
        if value == Some(0) {
            return Err(invalid(field, "must be at least 1 (omit it for no limit)"));
        }
    }
    let state = match spec.state {
        None => previous.map_or(State::Active, |p| p.state),
        Some(State::Active) => State::Active,
        Some(State::Paused) => State::Paused,
        Some(State::Disabled) => {
            return Err(invalid(
                "state",
                "`disabled` is set by outboxd only; use `paused`",
            ))
        }
    };
    let mut generated = None;
    let (secret, previous_secret, previous_until_ms) = match (&spec.secret, previous) {
        (Some(s), _) if s.is_empty() => (None, None, None),
        (Some(s), _) => (Some(s.clone()), None, None),
        (None, Some(p)) => (
            p.secret.clone(),
            p.previous_secret.clone(),
            p.previous_until_ms,
        ),
        (None, None) => {
            let s = secret::generate();
            generated = Some(s.clone());
            (Some(s), None, None)
        }
    };
    let keep_state_reason = previous.filter(|p| p.state == state && state != State::Active);
    Ok((
        Destination {
            name: name.to_string(),
            sink: spec.sink.clone(),
            config: spec.config.clone(),
            filter: spec.filter.clone(),
            retry: spec.retry.clone(),
            rate_per_second: spec.rate_per_second,
            max_in_flight: spec.max_in_flight,
            state,
            state_reason: keep_state_reason.and_then(|p| p.state_reason.clone()),
            secret,
            previous_secret,
            previous_until_ms,
            created_at_ms: previous.map_or_else(now_ms, |p| p.created_at_ms),
            managed_by: spec.managed_by.clone(),
        },
        generated,
    ))
}

/// Check `d` (in the clear) against the plugin that would serve it: retry
/// within the manifest's bounds, the URL within its grant and on no
/// internal address it does not name, and the plugin's own `init`
/// accepting the merged configuration.
async fn check(
    plugin: &Plugin,
    d: &Destination,
    secrets: &crate::secrets::Secrets,
) -> Result<(), AdminError> {
    let manifest = plugin.manifest();
    if let Some(over) = &d.retry {
        let m = &manifest.retry;
        for (field, given, bound) in [
            ("retry.window", over.window, m.window),
            ("retry.cap", over.cap, m.cap),
            ("retry.base", over.base, m.cap),
        ] {
            if let Some(given) = given.filter(|g| *g > bound) {
                return Err(invalid(
                    field,
                    format!(
                        "{} is past the sink's bound of {} (manifest {})",
                        humantime::format_duration(given),
                        humantime::format_duration(bound),
                        manifest.file.display()
                    ),
                ));
            }
        }
    }
    let config = d
        .plugin_config(now_ms(), secrets)
        .map_err(AdminError::Secret)?;
    if let Some(url) = config.get("url") {
        if !manifest.capabilities.http.is_empty() {
            check_url(&manifest.capabilities.http, url).await?;
        }
    }
    let retry = d.retry.as_ref().map(|r| retry_within(&manifest.retry, r));
    let trial = plugin.for_destination(&config, retry);
    match trial.deliver(&[]).await {
        Ok(_) => Ok(()),
        Err(crate::plugin::SinkFailure::Init(reason)) => Err(invalid(
            "config",
            format!("sink {:?} refused it: {reason}", d.sink),
        )),
        Err(other) => Err(invalid(
            "sink",
            format!("sink {:?} failed to start: {other}", d.sink),
        )),
    }
}

/// `url` must be allowed by the manifest's `capabilities.http` and, once
/// resolved, reach no internal address the allow-list does not name.
async fn check_url(grant: &[String], url: &str) -> Result<(), AdminError> {
    let field = "config.url";
    let policy = EgressPolicy::new(grant).map_err(|e| invalid("sink", e))?;
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(field, format!("{url:?} is not a URL: {e}")))?;
    let scheme = uri.scheme_str().unwrap_or("").to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(invalid(field, "must be an http:// or https:// URL"));
    }
    policy.check(&uri).map_err(|e| invalid(field, e))?;
    let host = uri
        .host()
        .unwrap_or("")
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let addrs = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| invalid(field, format!("{host} does not resolve: {e}")))?;
    for addr in addrs {
        policy
            .check_address(&scheme, &host, addr)
            .map_err(|e| invalid(field, e))?;
    }
    Ok(())
}

fn check_name(ctx: &Context, name: &str) -> Result<(), AdminError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(invalid(
            "name",
            format!("must be 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid(
            "name",
            format!("{name:?} may hold only letters, digits, `-`, `_` and `.`"),
        ));
    }
    if ctx.plugins.known().iter().any(|s| s == name) {
        return Err(invalid(
            "name",
            format!("{name:?} is the name of a sink (its own deliveries are stored under it); choose another"),
        ));
    }
    Ok(())
}

async fn find(ctx: &Context, name: &str) -> Result<Option<(Destination, i64)>, AdminError> {
    let rows = ctx.store.destinations().await?;
    let Some(row) = rows.into_iter().find(|r| r.name == name) else {
        return Ok(None);
    };
    let d = serde_json::from_str(&row.record).map_err(|e| {
        AdminError::Store(StoreError::Corrupt(format!("destination {name:?}: {e}")))
    })?;
    Ok(Some((d, row.revision)))
}

async fn update(
    ctx: &Context,
    name: &str,
    change: impl FnOnce(&mut Destination),
) -> Result<Destination, AdminError> {
    let (mut d, revision) = find(ctx, name).await?.ok_or_else(|| not_found(name))?;
    change(&mut d);
    let text = serde_json::to_string(&d).map_err(|e| invalid("", e.to_string()))?;
    if ctx
        .store
        .put_destination(name, &d.sink, &text, PutMode::Revision(revision))
        .await?
        .is_none()
    {
        return Err(changed(name));
    }
    ctx.live.refresh().await?;
    Ok(d)
}

/// What an edit changes (`PATCH /v1/admin/destinations/{name}`, the
/// console's edit form): each field given replaces the stored one; an
/// absent field keeps it. The sink, the secret (see [`rotate`]), the
/// state (see [`set_active`]) and who manages it are not edited here.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// The whole configuration merged over the manifest's. A value given
    /// as every listing shows it — a credential's `***`, a URL with its
    /// password masked — keeps its stored value.
    #[serde(default)]
    pub config: Option<BTreeMap<String, String>>,
    /// Which events it takes.
    #[serde(default)]
    pub filter: Option<Filter>,
    /// A retry policy within the manifest's bounds; `null`: the manifest's.
    #[serde(default, deserialize_with = "given")]
    pub retry: Option<Option<RetryOverride>>,
    /// Deliveries per second at most; `null`: no limit.
    #[serde(default, deserialize_with = "given")]
    pub rate_per_second: Option<Option<u32>>,
    /// Events in flight at most; `null`: the manifest's batch size.
    #[serde(default, deserialize_with = "given")]
    pub max_in_flight: Option<Option<u32>>,
}

/// A field that is present, `null` included (`Some(None)`); absent fields
/// stay `None` through `#[serde(default)]`.
fn given<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The value credentials are shown as, and an edit's "keep it".
const SHOWN_CREDENTIAL: &str = "***";

/// Edit destination `name`: the fields `edit` gives replace the stored
/// ones, everything else is kept, and the result is checked and written as
/// [`put`] does (the same refusals, naming the field).
///
/// Errors: [`AdminError::NotFound`] for no such destination;
/// [`AdminError::Invalid`] for `config.K = "***"` where no credential `K`
/// is stored, and whatever [`put`] refuses.
pub async fn edit(ctx: &Context, name: &str, edit: Edit) -> Result<Written, AdminError> {
    let (stored, _) = find(ctx, name).await?.ok_or_else(|| not_found(name))?;
    let stored = sealing::open_record(&stored, ctx.live.secrets()).map_err(AdminError::Secret)?;
    let shown = stored.redacted().config;
    let config = match edit.config {
        None => stored.config.clone(),
        Some(given) => {
            let mut config = BTreeMap::new();
            for (key, value) in given {
                // A value as the listing shows it (a credential's `***`, a
                // URL with its password masked) keeps the stored one.
                let value =
                    match (stored.config.get(&key), shown.get(&key)) {
                        (Some(kept), Some(s)) if *s == value => kept.clone(),
                        _ if value == SHOWN_CREDENTIAL => return Err(invalid(
                            format!("config.{key}"),
                            "`***` keeps a stored credential, and none is stored under this key",
                        )),
                        _ => value,
                    };
                config.insert(key, value);
            }
            config
        }
    };
    let spec = Spec {
        sink: stored.sink.clone(),
        config,
        secret: None,
        filter: edit.filter.unwrap_or(stored.filter),
        retry: edit.retry.unwrap_or(stored.retry),
        rate_per_second: edit.rate_per_second.unwrap_or(stored.rate_per_second),
        max_in_flight: edit.max_in_flight.unwrap_or(stored.max_in_flight),
        state: None,
        managed_by: stored.managed_by,
        backfill_since: None,
    };
    put(ctx, name, spec).await
}

/// Every destination as stored (records that do not parse are skipped).
pub async fn all(ctx: &Context) -> Result<Vec<Destination>, AdminError> {
    Ok(ctx
        .store
        .destinations()
        .await?
        .into_iter()
        .filter_map(|r| serde_json::from_str(&r.record).ok())
        .collect())
}

/// Pause destination `name` with `reason`.
pub async fn hold(ctx: &Context, name: &str, reason: &str) -> Result<DestinationView, AdminError> {
    let d = update(ctx, name, |d| {
        d.state = State::Paused;
        d.state_reason = Some(reason.to_string());
    })
    .await?;
    tracing::info!(destination = %name, reason, "destination paused");
    Ok(d.redacted())
}

/// Pause (nothing claimed, deliveries still queued) or resume (also
/// re-enables a disabled destination) destination `name`.
pub async fn set_active(
    ctx: &Context,
    name: &str,
    active: bool,
) -> Result<DestinationView, AdminError> {
    if active {
        // Its failing time starts afresh: the operator says the target is
        // fixed. Written before it is active, so the health its loop
        // writes after its first batch is never overwritten by this.
        find(ctx, name).await?.ok_or_else(|| not_found(name))?;
        let _ = ctx
            .store
            .save_destination_health(
                name,
                &serde_json::to_string(&Health::default()).unwrap_or_default(),
            )
            .await;
    }
    let d = update(ctx, name, |d| {
        d.state = if active { State::Active } else { State::Paused };
        d.state_reason = (!active).then(|| "paused by an operator".to_string());
    })
    .await?;
    tracing::info!(destination = %name, active, "destination state changed");
    Ok(d.redacted())
}

/// The answer of a secret rotation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rotated {
    /// The destination as the API shows it (no secret).
    pub destination: DestinationView,
    /// The new secret — the only time it is shown.
    pub secret: String,
    /// Until when the previous secret keeps signing beside it (RFC 3339).
    pub previous_valid_until: Option<String>,
}

/// Rotate the signing secret of `name`: `new` (or a generated one) signs
/// from now on; the previous one keeps signing beside it for `grace`.
/// Returns the new secret — the only time it is shown.
pub async fn rotate(
    ctx: &Context,
    name: &str,
    new: Option<String>,
    grace: Option<Duration>,
) -> Result<Rotated, AdminError> {
    if new.as_deref() == Some("") {
        return Err(invalid("secret", "is empty"));
    }
    if new.as_deref().is_some_and(crate::secrets::is_sealed) {
        return Err(invalid(
            "secret",
            "values starting with `enc:` are kept for sealed secrets; give the secret itself",
        ));
    }
    let secret = new.unwrap_or_else(secret::generate);
    let grace = grace.unwrap_or(secret::DEFAULT_GRACE);
    let given = ctx
        .live
        .secrets()
        .seal(&sealing::context(name), &secret)
        .map_err(|source| {
            AdminError::Secret(SealingError {
                destination: name.to_string(),
                field: "secret".into(),
                source,
            })
        })?;
    let d = update(ctx, name, move |d| {
        d.previous_secret = d.secret.replace(given);
        d.previous_until_ms = Some(now_ms() + grace.as_millis() as i64);
    })
    .await?;
    tracing::info!(destination = %name, grace = ?grace, "destination secret rotated");
    Ok(Rotated {
        destination: d.redacted(),
        secret,
        previous_valid_until: d.previous_until_ms.map(crate::rfc3339::format_ms),
    })
}

/// What a delete does with the destination's deliveries not yet delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pending {
    /// Keep them, waiting under the destination's name (a destination of
    /// that name created later delivers them).
    Park,
    /// Delete them (pending, retrying and dead).
    Purge,
}

/// The answer of a delete.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    /// The destination deleted.
    pub deleted: String,
    /// What was done with its deliveries not yet delivered.
    pub pending: Pending,
    /// What a `purge` deleted (zero for `park`).
    pub purged: Purged,
}

/// Delete destination `name`, with `pending` deciding its deliveries.
pub async fn delete(ctx: &Context, name: &str, pending: Pending) -> Result<Deleted, AdminError> {
    if !ctx.store.delete_destination(name).await? {
        return Err(not_found(name));
    }
    ctx.live.refresh().await?;
    let purged = match pending {
        Pending::Purge => ctx.store.purge_target(name).await?,
        Pending::Park => Purged::default(),
    };
    tracing::info!(destination = %name, ?pending, purged.pending, purged.dead, "destination deleted");
    Ok(Deleted {
        deleted: name.to_string(),
        pending,
        purged,
    })
}

/// A destination's queue, as a listing shows it (counted up to
/// `crate::store::STATS_COUNT_CAP`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueView {
    /// Waiting for a first attempt.
    pub pending: u64,
    /// Waiting to retry.
    pub retrying: u64,
    /// Being delivered.
    pub leased: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// How long its oldest due head has been due, ms.
    pub oldest_due_age_ms: Option<i64>,
    /// The count stopped at the cap: figures are lower bounds.
    pub capped: bool,
}

/// One destination in a listing: the record without secrets, its store
/// revision, its health (`{}` before its first attempt), its queue, and
/// whether this daemon serves it.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The record, without secrets.
    #[serde(flatten)]
    pub destination: DestinationView,
    /// Its store revision.
    pub revision: i64,
    /// What its loop last saw; `{}` when nothing yet.
    #[serde(serialize_with = "empty_when_none")]
    pub health: Option<Health>,
    /// Its deliveries by state.
    pub queue: QueueView,
    /// This daemon has it loaded and the plugin that serves it.
    pub served_here: bool,
}

/// A stored destination whose record does not parse: shown, named, never
/// served.
#[derive(Debug, Clone, Serialize)]
pub struct Unreadable {
    /// Its name.
    pub name: String,
    /// Its sink.
    pub sink: String,
    /// Why its record could not be read.
    pub error: String,
}

/// One entry of `GET /v1/admin/destinations`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Listed {
    /// A destination.
    Destination(Box<Listing>),
    /// A record that does not parse.
    Unreadable(Unreadable),
}

impl Listed {
    fn name(&self) -> &str {
        match self {
            Listed::Destination(l) => &l.destination.name,
            Listed::Unreadable(u) => &u.name,
        }
    }
}

/// The answer of `GET /v1/admin/destinations`.
#[derive(Debug, Clone, Serialize)]
pub struct Destinations {
    /// By name.
    pub destinations: Vec<Listed>,
}

fn empty_when_none<S: serde::Serializer>(h: &Option<Health>, s: S) -> Result<S::Ok, S::Error> {
    match h {
        Some(h) => h.serialize(s),
        None => serde::ser::SerializeMap::end(serde::Serializer::serialize_map(s, Some(0))?),
    }
}

/// Every destination: record (no secrets), health and queue figures.
pub async fn list(ctx: &Context) -> Result<Destinations, AdminError> {
    let snapshot = ctx.live.current();
    let rows = ctx.store.destinations().await?;
    let health: BTreeMap<String, Health> = ctx
        .store
        .destination_health()
        .await?
        .into_iter()
        .filter_map(|(n, h)| serde_json::from_str(&h).ok().map(|h| (n, h)))
        .collect();
    let queue = ctx.store.queue_stats(crate::store::STATS_COUNT_CAP).await?;
    let mut out = Vec::new();
    for row in rows {
        let d = match serde_json::from_str::<Destination>(&row.record) {
            Ok(d) => d,
            Err(e) => {
                out.push(Listed::Unreadable(Unreadable {
                    name: row.name,
                    sink: row.sink,
                    error: format!("unreadable record: {e}"),
                }));
                continue;
            }
        };
        let q = queue.sinks.iter().find(|q| q.sink == row.name);
        out.push(Listed::Destination(Box::new(Listing {
            destination: d.redacted(),
            revision: row.revision,
            health: health.get(&row.name).cloned(),
            queue: QueueView {
                pending: q.map_or(0, |q| q.pending),
                retrying: q.map_or(0, |q| q.retrying),
                leased: q.map_or(0, |q| q.leased),
                dead: q.map_or(0, |q| q.dead),
                oldest_due_age_ms: q.and_then(|q| q.oldest_due_age_ms),
                capped: queue.capped,
            },
            served_here: snapshot.by_name.contains_key(&row.name)
                && ctx.plugins.serving(&row.sink).is_some(),
        })));
    }
    Ok(Destinations { destinations: out })
}

/// One destination, as [`list`] shows it.
pub async fn show(ctx: &Context, name: &str) -> Result<Listed, AdminError> {
    list(ctx)
        .await?
        .destinations
        .into_iter()
        .find(|v| v.name() == name)
        .ok_or_else(|| not_found(name))
}

fn exists(name: &str) -> AdminError {
    AdminError::Conflict(format!(
        "destination {name:?} already exists (PUT replaces it)"
    ))
}

fn changed(name: &str) -> AdminError {
    AdminError::Conflict(format!(
        "destination {name:?} was changed meanwhile; read it again and retry"
    ))
}

fn not_found(name: &str) -> AdminError {
    AdminError::NotFound(format!("no destination named {name:?}"))
}
