//! The operator console: server-rendered pages served by `outboxd run`
//! under `console.prefix` (default `/console`) — overview, events and an
//! event's deliveries, failed attempts, dead letters with replay and purge by filter,
//! destinations, a stream's heads and why they do not move, plugins and
//! sources.
//!
//! Owns: the pages' routes and templates (`templates/`, compiled in by
//! askama), the one stylesheet (`assets/`), logins and CSRF
//! ([`session`]), the delivery-rate graph ([`rate`]). Its settings
//! (`[console]`) are the daemon's configuration's, handed in as [`Mount`]. Every page is a GET whose filters are in its query
//! string, so a link can be shared; no page needs JavaScript.
//!
//! Must never: read or write the store but through the admin actions
//! (`crate::ops::actions`: the CLI, the admin API and the console cannot
//! disagree), answer anything but the login page without a live session,
//! act on a POST without the session's CSRF token, act at all in
//! read-only mode, or show a secret except the one a create or a rotation
//! just made.

pub mod rate;
pub mod session;

mod actions;
mod pages;
mod views;

use std::sync::Arc;

use askama::Template;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::ops::actions::AdminError;
use crate::ops::OpsState;
use session::Sessions;

/// What every page handler reaches.
#[derive(Clone)]
pub struct ConsoleState {
    /// The admin layer's context.
    pub ops: OpsState,
    /// Path prefix, e.g. `/console`.
    pub prefix: Arc<str>,
    /// Every action hidden and refused.
    pub read_only: bool,
    /// Cookies carry `Secure` (the daemon serves TLS).
    pub secure: bool,
    /// The live logins.
    pub sessions: Arc<Sessions>,
    /// Deliveries per second, last hour.
    pub rate: Arc<rate::Rate>,
    /// An event page's trace link, `{trace_id}` replaced.
    pub trace_url: Option<Arc<str>>,
}

/// Where and how the console is served (from `[console]`, and `[tls]`).
#[derive(Debug, Clone)]
pub struct Mount {
    /// Path prefix, e.g. `/console`: starts with `/`, no trailing `/`.
    pub prefix: String,
    /// Every action hidden and refused.
    pub read_only: bool,
    /// How long a login lasts.
    pub session_ttl: std::time::Duration,
    /// Cookies carry `Secure`: the daemon serves TLS.
    pub secure: bool,
    /// An event page's trace link, `{trace_id}` replaced (`console.trace-url`).
    pub trace_url: Option<String>,
}

/// The console's routes under `mount.prefix`, and the task sampling the
/// delivery rate, stopped by `stop`.
pub fn mount(
    mount: Mount,
    ops: OpsState,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (Router, tokio::task::JoinHandle<()>) {
    let rate = Arc::new(rate::Rate::default());
    let sampler = rate.clone().run(ops.metrics.clone(), stop);
    let state = ConsoleState {
        ops,
        prefix: mount.prefix.as_str().into(),
        read_only: mount.read_only,
        secure: mount.secure,
        sessions: Arc::new(Sessions::new(mount.session_ttl)),
        rate,
        trace_url: mount.trace_url.as_deref().map(Arc::from),
    };
    (router(state), sampler)
}

fn router(state: ConsoleState) -> Router {
    let p = state.prefix.to_string();
    let at = |path: &str| format!("{p}{path}");
    Router::new()
        .route(&p, get(home))
        .route(&at("/"), get(home))
        .route(&at("/assets/console.css"), get(stylesheet))
        .route(&at("/login"), get(pages::login_form).post(actions::login))
        .route(&at("/logout"), post(actions::logout))
        .route(&at("/overview"), get(pages::overview))
        .route(&at("/events"), get(pages::events))
        .route(&at("/events/{id}"), get(pages::event))
        .route(&at("/attempts"), get(pages::attempts))
        .route(&at("/dead"), get(pages::dead))
        .route(&at("/dead/confirm"), get(pages::dead_confirm))
        .route(&at("/dead/replay"), post(actions::dead_replay))
        .route(&at("/dead/purge"), post(actions::dead_purge))
        .route(
            &at("/destinations"),
            get(pages::destinations).post(actions::destination_create),
        )
        .route(
            &at("/destinations/{name}/edit"),
            get(pages::destination_edit).post(actions::destination_edit),
        )
        .route(
            &at("/destinations/{name}/{action}"),
            post(actions::destination_action),
        )
        .route(&at("/streams"), get(pages::streams))
        .route(&at("/plugins"), get(pages::plugins))
        .with_state(state)
}

async fn home(State(state): State<ConsoleState>) -> Redirect {
    Redirect::to(&format!("{}/overview", state.prefix))
}

const STYLESHEET: &str = include_str!("assets/console.css");

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLESHEET,
    )
        .into_response()
}

/// A request with a live session: its CSRF token. Without one, a GET is
/// sent to the login page and anything else refused (403).
pub struct Authed {
    /// The session's id.
    pub id: String,
    /// The session's CSRF token.
    pub csrf: String,
}

impl FromRequestParts<ConsoleState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ConsoleState,
    ) -> Result<Self, Self::Rejection> {
        let live = session::cookie_value(&parts.headers)
            .and_then(|id| state.sessions.get(&id).map(|s| (id, s)));
        match live {
            Some((id, s)) => Ok(Authed { id, csrf: s.csrf }),
            None if parts.method == axum::http::Method::GET => {
                Err(Redirect::to(&format!("{}/login?expired=1", state.prefix)).into_response())
            }
            None => Err(refusal(
                state,
                None,
                StatusCode::FORBIDDEN,
                "no live session: log in again",
            )),
        }
    }
}

/// What the page frame (`base.html`) shows around every page.
pub struct Frame {
    /// Path prefix.
    pub prefix: String,
    /// The session's CSRF token (empty when logged out).
    pub csrf: String,
    /// Logged in: show the navigation.
    pub logged_in: bool,
    /// Actions hidden.
    pub read_only: bool,
    /// The page's title.
    pub title: String,
    /// A refusal to show above the page.
    pub error: Option<String>,
    /// A confirmation to show above the page.
    pub notice: Option<String>,
}

impl Frame {
    /// The frame of a page titled `title` for the session `authed`.
    pub fn new(state: &ConsoleState, authed: Option<&Authed>, title: &str) -> Frame {
        Frame {
            prefix: state.prefix.to_string(),
            csrf: authed.map(|a| a.csrf.clone()).unwrap_or_default(),
            logged_in: authed.is_some(),
            read_only: state.read_only,
            title: title.to_string(),
            error: None,
            notice: None,
        }
    }
}

/// A page answering only its frame's error or notice.
#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage {
    frame: Frame,
}

/// `template` rendered with `status`.
fn render(status: StatusCode, template: &impl Template) -> Response {
    match template.render() {
        Ok(html) => (status, [(header::CACHE_CONTROL, "no-store")], Html(html)).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("console: page did not render: {e}"),
        )
            .into_response(),
    }
}

/// A page saying `message`, with `status`.
fn refusal(
    state: &ConsoleState,
    authed: Option<&Authed>,
    status: StatusCode,
    message: &str,
) -> Response {
    let mut frame = Frame::new(state, authed, "Refused");
    frame.error = Some(message.to_string());
    render(status, &MessagePage { frame })
}

/// An admin action's refusal as a page, with its status (the field at
/// fault is in its message).
fn admin_refusal(state: &ConsoleState, authed: &Authed, e: AdminError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    refusal(state, Some(authed), status, &e.to_string())
}
