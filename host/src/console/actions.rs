//! The console's forms (every one a POST): login and logout, replay or
//! purge of dead letters by filter, and the destination actions (create,
//! edit, pause, resume, rotate the secret, delete with park or purge).
//!
//! Owns: the checks every form passes before anything is done — a live
//! session, the console not read-only, the session's CSRF token in the
//! form's `csrf` field (compared in constant time) — and reading a form
//! into the admin action's input.
//!
//! Must never: act through anything but the admin actions, or act on a
//! form that failed a check (403, nothing done).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;

use super::pages::{destinations_page, edit_page, DeadQuery, EditForm, LoginPage};
use super::session::{same, set_cookie};
use super::{admin_refusal, refusal, render, Authed, ConsoleState, Frame, MessagePage};
use crate::ops::actions::dead::{self, DeadSelection};
use crate::ops::actions::destinations::{self, Edit, Pending, Spec};
use crate::ops::actions::{invalid, AdminError, DEAD_PAGE_MAX};
use crate::routing::destination::RetryOverride;
use crate::routing::filter::Filter;

/// A posted form's fields, by name (the last of a repeated name wins).
type Fields = BTreeMap<String, String>;

/// `fields` when the form may act: not read-only, and carrying the
/// session's CSRF token; else the 403 page.
fn checked(
    state: &ConsoleState,
    authed: &Authed,
    fields: Vec<(String, String)>,
) -> Result<Fields, Box<Response>> {
    if state.read_only {
        return Err(Box::new(refusal(
            state,
            Some(authed),
            StatusCode::FORBIDDEN,
            "the console is read-only (console.read-only): nothing was changed",
        )));
    }
    let fields: Fields = fields.into_iter().collect();
    match fields.get("csrf") {
        Some(given) if same(given, &authed.csrf) => Ok(fields),
        _ => Err(Box::new(refusal(
            state,
            Some(authed),
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page and try again; nothing was changed",
        ))),
    }
}

fn field(fields: &Fields, name: &str) -> Option<String> {
    fields
        .get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `POST {prefix}/login` (`token`): a session and its cookie, or the
/// login page saying why not (no session made).
pub async fn login(
    State(state): State<ConsoleState>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let given = fields
        .iter()
        .rev()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let token = state.ops.admin_token.as_deref();
    let no_token = token.unwrap_or("").is_empty();
    match state.sessions.login(given, token) {
        Some(id) => {
            let cookie = set_cookie(&id, &state.prefix, state.sessions.ttl(), state.secure);
            (
                [(header::SET_COOKIE, cookie)],
                Redirect::to(&format!("{}/overview", state.prefix)),
            )
                .into_response()
        }
        None => {
            state.ops.metrics.refused("console", "admin-token");
            let mut frame = Frame::new(&state, None, "Log in");
            frame.error = Some(if no_token {
                "the console needs admin.token (OUTBOXD_ADMIN__TOKEN) set on the daemon; no session was started".into()
            } else {
                "wrong admin token: no session was started".into()
            });
            let status = if no_token {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::UNAUTHORIZED
            };
            render(status, &LoginPage { frame, no_token })
        }
    }
}

/// `POST {prefix}/logout`: the session ends, its cookie is removed.
pub async fn logout(
    State(state): State<ConsoleState>,
    authed: Authed,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields: Fields = fields.into_iter().collect();
    if !fields.get("csrf").is_some_and(|g| same(g, &authed.csrf)) {
        return refusal(
            &state,
            Some(&authed),
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: you are still logged in",
        );
    }
    state.sessions.logout(&authed.id);
    let cookie = set_cookie("", &state.prefix, std::time::Duration::ZERO, state.secure);
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to(&format!("{}/login", state.prefix)),
    )
        .into_response()
}

fn dead_selection(fields: &Fields) -> Result<(DeadQuery, DeadSelection), AdminError> {
    let q = DeadQuery {
        sink: field(fields, "sink"),
        stream: field(fields, "stream"),
        event_id: field(fields, "event_id"),
        since: field(fields, "since"),
        until: field(fields, "until"),
        action: None,
    };
    let sel = DeadSelection {
        filter: q.filter()?,
        limit: Some(DEAD_PAGE_MAX),
    };
    Ok((q, sel))
}

/// A page saying `notice`, linking back to the dead letters of `q`.
fn done(state: &ConsoleState, authed: &Authed, notice: String) -> Response {
    let mut frame = Frame::new(state, Some(authed), "Done");
    frame.notice = Some(notice);
    render(StatusCode::OK, &MessagePage { frame })
}

/// `POST {prefix}/dead/replay` (the filter, `csrf`): the matching dead
/// letters made pending again (one run: up to [`DEAD_PAGE_MAX`]); the
/// delivery loops take them in stream order.
pub async fn dead_replay(
    State(state): State<ConsoleState>,
    authed: Authed,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields = match checked(&state, &authed, fields) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let replayed = match dead_selection(&fields) {
        Ok((_, sel)) => dead::replay_dead(&*state.ops.store, &sel).await,
        Err(e) => Err(e),
    };
    match replayed {
        Ok(r) => {
            state.ops.wake.everyone();
            done(
                &state,
                &authed,
                format!(
                    "Replayed {} dead letter{}: they are pending again and go out in stream order.",
                    r.replayed,
                    if r.replayed == 1 { "" } else { "s" }
                ),
            )
        }
        Err(e) => admin_refusal(&state, &authed, e),
    }
}

/// `POST {prefix}/dead/purge` (the filter, `csrf`): the matching dead
/// letters deleted (one run: up to [`DEAD_PAGE_MAX`]).
pub async fn dead_purge(
    State(state): State<ConsoleState>,
    authed: Authed,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields = match checked(&state, &authed, fields) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let purged = match dead_selection(&fields) {
        Ok((_, sel)) => dead::purge_dead(&*state.ops.store, &sel).await,
        Err(e) => Err(e),
    };
    match purged {
        Ok(p) => {
            // A purged dead letter may unblock its stream (`on-dead = block`).
            state.ops.wake.everyone();
            done(
                &state,
                &authed,
                format!(
                    "Purged {} dead letter{}.",
                    p.purged,
                    if p.purged == 1 { "" } else { "s" }
                ),
            )
        }
        Err(e) => admin_refusal(&state, &authed, e),
    }
}

/// `config`'s `key = value` lines as a map. Errors: a line without `=`,
/// naming it.
fn config_lines(text: &str) -> Result<BTreeMap<String, String>, AdminError> {
    let mut config = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            invalid(
                "config",
                format!("line {}: {line:?} is not `key = value`", n + 1),
            )
        })?;
        config.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(config)
}

/// `POST {prefix}/destinations` (`name`, `sink`, `config` as `key = value`
/// lines, `secret` optional, `csrf`): the destination created; a secret
/// generated for it is shown this once.
pub async fn destination_create(
    State(state): State<ConsoleState>,
    authed: Authed,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields = match checked(&state, &authed, fields) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let name = field(&fields, "name").unwrap_or_default();
    let created = async {
        if name.is_empty() {
            return Err(invalid("name", "is empty"));
        }
        let spec = Spec {
            sink: field(&fields, "sink").unwrap_or_default(),
            config: config_lines(fields.get("config").map_or("", |s| s.as_str()))?,
            secret: field(&fields, "secret"),
            ..Spec::default()
        };
        destinations::create(&state.ops.destinations(), &name, spec).await
    };
    let mut frame = Frame::new(&state, Some(&authed), "Destinations");
    match created.await {
        Ok(w) => {
            frame.notice = Some(format!("Created destination {name}."));
            let secret = w.secret.map(|s| (name.clone(), s));
            destinations_page(&state, frame, secret, StatusCode::CREATED).await
        }
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            frame.error = Some(e.to_string());
            destinations_page(&state, frame, None, status).await
        }
    }
}

/// The posted edit form as the form to show again and the [`Edit`] it
/// asks for: every field given (an empty one clears its setting).
/// Errors: a duration or a number that does not parse, naming its field.
fn edit_of(name: &str, fields: &Fields) -> (EditForm, Result<Edit, AdminError>) {
    let text = |k: &str| fields.get(k).map_or("", |v| v.trim()).to_string();
    let form = EditForm {
        name: name.to_string(),
        sink: String::new(),
        config: text("config"),
        types: text("types"),
        streams: text("streams"),
        conditions: text("where"),
        retry_base: text("retry_base"),
        retry_cap: text("retry_cap"),
        retry_window: text("retry_window"),
        rate: text("rate_per_second"),
        in_flight: text("max_in_flight"),
    };
    let edit = (|| {
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect()
        };
        let duration = |field: &str, v: &str| -> Result<Option<std::time::Duration>, AdminError> {
            if v.is_empty() {
                return Ok(None);
            }
            humantime::parse_duration(v).map(Some).map_err(|e| {
                invalid(
                    field,
                    format!("{v:?} is not a duration like 2s or 10m: {e}"),
                )
            })
        };
        let number = |field: &str, v: &str| -> Result<Option<u32>, AdminError> {
            if v.is_empty() {
                return Ok(None);
            }
            v.parse()
                .map(Some)
                .map_err(|_| invalid(field, format!("{v:?} is not a whole number")))
        };
        let retry = RetryOverride {
            base: duration("retry.base", &form.retry_base)?,
            cap: duration("retry.cap", &form.retry_cap)?,
            window: duration("retry.window", &form.retry_window)?,
        };
        Ok(Edit {
            config: Some(config_lines(&form.config)?),
            filter: Some(Filter {
                types: list(&form.types),
                streams: list(&form.streams),
                conditions: form
                    .conditions
                    .lines()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect(),
            }),
            retry: Some((retry != RetryOverride::default()).then_some(retry)),
            rate_per_second: Some(number("rate_per_second", &form.rate)?),
            max_in_flight: Some(number("max_in_flight", &form.in_flight)?),
        })
    })();
    (form, edit)
}

/// `POST {prefix}/destinations/{name}/edit` (the edit form's fields,
/// `csrf`): the destination's settings replaced through the admin layer's
/// edit; refused, the form is shown again with what was posted and why.
pub async fn destination_edit(
    State(state): State<ConsoleState>,
    authed: Authed,
    Path(name): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields = match checked(&state, &authed, fields) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let (mut form, edit) = edit_of(&name, &fields);
    let outcome = match edit {
        Ok(edit) => destinations::edit(&state.ops.destinations(), &name, edit).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(w) => {
            let mut frame = Frame::new(&state, Some(&authed), "Destinations");
            frame.notice = Some(if w.changed {
                format!("Saved destination {name}.")
            } else {
                format!("Destination {name} was already so; nothing changed.")
            });
            destinations_page(&state, frame, None, StatusCode::OK).await
        }
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            let mut frame = Frame::new(&state, Some(&authed), &format!("Edit destination {name}"));
            frame.error = Some(e.to_string());
            if let Ok(destinations::Listed::Destination(l)) =
                destinations::show(&state.ops.destinations(), &name).await
            {
                form.sink = l.destination.sink.clone();
            }
            edit_page(&state, frame, &name, Some(form), status).await
        }
    }
}

/// `POST {prefix}/destinations/{name}/{pause|resume|rotate|delete}`
/// (`csrf`; `pending` = `park` or `purge` for delete).
pub async fn destination_action(
    State(state): State<ConsoleState>,
    authed: Authed,
    Path((name, action)): Path<(String, String)>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let fields = match checked(&state, &authed, fields) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let ctx = state.ops.destinations();
    let outcome: Result<(String, Option<(String, String)>), AdminError> = async {
        match action.as_str() {
            "pause" | "resume" => {
                let active = action == "resume";
                destinations::set_active(&ctx, &name, active).await?;
                let word = if active { "Resumed" } else { "Paused" };
                Ok((format!("{word} destination {name}."), None))
            }
            "rotate" => {
                let r = destinations::rotate(&ctx, &name, None, None).await?;
                let until = r
                    .previous_valid_until
                    .map(|u| format!(" The previous secret keeps signing until {u}."))
                    .unwrap_or_default();
                Ok((
                    format!("Rotated the secret of {name}.{until}"),
                    Some((name.clone(), r.secret)),
                ))
            }
            "delete" => {
                let pending = match field(&fields, "pending").as_deref() {
                    Some("purge") => Pending::Purge,
                    Some("park") => Pending::Park,
                    other => {
                        return Err(invalid(
                            "pending",
                            format!("must be park or purge, got {:?}", other.unwrap_or("")),
                        ))
                    }
                };
                let d = destinations::delete(&ctx, &name, pending).await?;
                Ok((
                    format!(
                        "Deleted destination {name}; {} pending and {} dead deliveries purged.",
                        d.purged.pending, d.purged.dead
                    ),
                    None,
                ))
            }
            other => Err(AdminError::NotFound(format!(
                "no destination action {other:?}: pause, resume, rotate or delete"
            ))),
        }
    }
    .await;
    let mut frame = Frame::new(&state, Some(&authed), "Destinations");
    match outcome {
        Ok((notice, secret)) => {
            frame.notice = Some(notice);
            destinations_page(&state, frame, secret, StatusCode::OK).await
        }
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            frame.error = Some(e.to_string());
            destinations_page(&state, frame, None, status).await
        }
    }
}
