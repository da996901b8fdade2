//! The platform sync action (`POST /v1/admin/destinations/sync`,
//! `outboxd destinations sync`, and `[destinations.sync]` on a schedule):
//! keeping catch-all destinations in step with a list of platforms (the
//! subscriptions of the awareness service: one per subscribing platform,
//! each with a webhook URL and a secret).
//!
//! Owns: what a sync does with each platform — absent → created (and
//! backfilled with the events of the last `backfill`, 24 h by default);
//! changed URL or secret → updated; present and unchanged → nothing;
//! vanished from the list → paused, its deliveries kept (never deleted) —
//! and the no-echo filter: a platform's destination never takes the
//! events that platform sent (`requestingplatform != <name>`). Only
//! destinations this sync created (`managed_by`) are ever paused by it.
//!
//! Must never: delete a destination or its deliveries, or touch one it did
//! not create.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::destinations::{self as actions, Context, Spec};
use super::AdminError;
use crate::destinations::{now_ms, Destination, Filter, State};

/// The `managed_by` mark of destinations a sync created.
pub const MANAGED_BY: &str = "sync";

/// The reason of a destination a sync paused.
const VANISHED: &str = "no longer in the platform list (sync)";

/// How far back a new platform's destination is backfilled unless the
/// sync says otherwise: 24 h, the window the awareness service's own
/// catch-up covered.
pub const DEFAULT_BACKFILL: Duration = Duration::from_secs(24 * 3600);

/// One subscribing platform.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    /// The platform's name, as events name it in `requestingPlatform`;
    /// also the destination's name (after `prefix`).
    pub name: String,
    /// Its webhook URL.
    pub url: String,
    /// The secret its webhook verifies with; absent or `""`: unsigned.
    #[serde(default)]
    pub secret: Option<String>,
}

/// A sync request: the platform list and how to serve it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The platforms and their subscriptions.
    pub platforms: Vec<Platform>,
    /// The sink serving the destinations. Default `webhook`.
    #[serde(default = "default_sink")]
    pub sink: String,
    /// Configuration given to every destination (e.g. `payload =
    /// "awareness"`), under each platform's `url`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Prefix of the destination names. Default none.
    #[serde(default)]
    pub prefix: String,
    /// How far back a new destination is backfilled, e.g. `"24h"`.
    #[serde(default, with = "humantime_serde")]
    pub backfill: Option<Duration>,
}

fn default_sink() -> String {
    "webhook".into()
}

/// What a sync did, by destination name.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Destinations created.
    pub created: Vec<String>,
    /// Destinations updated.
    pub updated: Vec<String>,
    /// Destinations already as the file says.
    pub unchanged: Vec<String>,
    /// Destinations paused (vanished from the file; deliveries kept).
    pub paused: Vec<String>,
}

/// Make the destinations match `req`. Every platform is checked before
/// anything is written (a bad entry refuses the whole sync, naming it).
pub async fn sync(ctx: &Context, req: &Request) -> Result<Report, AdminError> {
    check(req)?;
    let stored = actions::all(ctx).await?;
    let backfill = req.backfill.unwrap_or(DEFAULT_BACKFILL);
    let since = crate::rfc3339::format_ms(now_ms() - backfill.as_millis() as i64);
    let mut report = Report::default();
    for (i, p) in req.platforms.iter().enumerate() {
        let name = format!("{}{}", req.prefix, p.name);
        let existing = stored.iter().find(|d| d.name == name);
        let spec = platform_spec(req, i, p, &name, existing, &since)?;
        let written = actions::put(ctx, &name, spec).await.map_err(|e| match e {
            AdminError::Invalid { field, message } => AdminError::Invalid {
                field: format!("platforms[{i}] ({name}): {field}"),
                message,
            },
            other => other,
        })?;
        if written.created {
            report.created.push(name);
        } else if written.changed {
            report.updated.push(name);
        } else {
            report.unchanged.push(name);
        }
    }
    report.paused = pause_vanished(ctx, req, &stored).await?;
    tracing::info!(
        created = report.created.len(),
        updated = report.updated.len(),
        paused = report.paused.len(),
        "destinations synced"
    );
    Ok(report)
}

/// Refuse a request naming a platform twice or one without a URL, naming
/// the entry.
fn check(req: &Request) -> Result<(), AdminError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in req.platforms.iter().enumerate() {
        if !seen.insert(p.name.as_str()) {
            return Err(AdminError::Invalid {
                field: format!("platforms[{i}].name"),
                message: format!("{:?} is listed twice", p.name),
            });
        }
        if p.url.is_empty() {
            return Err(AdminError::Invalid {
                field: format!("platforms[{i}].url"),
                message: "is empty".into(),
            });
        }
    }
    Ok(())
}

/// The destination platform `p` (entry `i`) should be, named `name`: the
/// request's config with the platform's URL, its secret, and the no-echo
/// filter (`requestingplatform != <platform>`). A new one is backfilled
/// from `since`; one a sync paused because it vanished is active again;
/// any other state (an operator's pause, a disable) is kept.
///
/// Errors: a destination of that name that no sync created.
fn platform_spec(
    req: &Request,
    i: usize,
    p: &Platform,
    name: &str,
    existing: Option<&Destination>,
    since: &str,
) -> Result<Spec, AdminError> {
    if existing.is_some_and(|d| d.managed_by.as_deref() != Some(MANAGED_BY)) {
        return Err(AdminError::Invalid {
            field: format!("platforms[{i}].name"),
            message: format!(
                "destination {name:?} exists and was not created by a sync; rename one of them"
            ),
        });
    }
    let returned = existing.is_some_and(|d| {
        d.state == State::Paused
            && d.state_reason
                .as_deref()
                .is_some_and(|r| r.starts_with(VANISHED))
    });
    let mut config = req.config.clone();
    config.insert("url".into(), p.url.clone());
    Ok(Spec {
        sink: req.sink.clone(),
        config,
        secret: Some(p.secret.clone().unwrap_or_default()),
        filter: Filter {
            conditions: vec![format!("requestingplatform != \"{}\"", p.name)],
            ..Default::default()
        },
        backfill_since: existing.is_none().then(|| since.to_string()),
        state: returned.then_some(State::Active),
        managed_by: Some(MANAGED_BY.into()),
        ..Default::default()
    })
}

/// Pause the active destinations a sync created whose platform is no
/// longer in `req` (their deliveries are kept); their names.
async fn pause_vanished(
    ctx: &Context,
    req: &Request,
    stored: &[Destination],
) -> Result<Vec<String>, AdminError> {
    let mut paused = Vec::new();
    for d in stored {
        let listed = req
            .platforms
            .iter()
            .any(|p| format!("{}{}", req.prefix, p.name) == d.name);
        if d.managed_by.as_deref() == Some(MANAGED_BY) && !listed && d.state == State::Active {
            actions::hold(
                ctx,
                &d.name,
                &format!("{VANISHED}; its deliveries are kept"),
            )
            .await?;
            paused.push(d.name.clone());
        }
    }
    Ok(paused)
}

/// Sync from the file `from` every `every` until `shutdown` (the
/// `[destinations.sync]` configuration). A file that cannot be read or
/// parsed, or a sync refused, is logged and tried again next time; what
/// was synced before stays.
pub fn run_every(
    ctx: Context,
    from: std::path::PathBuf,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let outcome = match std::fs::read_to_string(&from) {
                Err(e) => Err(format!("{}: {e}", from.display())),
                Ok(text) => match parse(&text) {
                    Err(e) => Err(format!("{}: {e}", from.display())),
                    Ok(req) => sync(&ctx, &req).await.map_err(|e| e.to_string()),
                },
            };
            if let Err(e) = outcome {
                tracing::warn!("scheduled destinations sync: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
        }
    })
}

/// Read a platform list from `text`: a JSON array of platforms, or an
/// object `{"platforms": [...], "sink", "config", "prefix", "backfill"}`.
pub fn parse(text: &str) -> Result<Request, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let value = match value {
        Value::Array(list) => json!({ "platforms": list }),
        other => other,
    };
    serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}
