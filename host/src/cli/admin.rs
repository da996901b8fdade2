//! `outboxd events|attempts|dead|sinks|sources|backfill|config …`: the CLI
//! face of the actions in `outboxd::ops::actions::{events, attempts, dead,
//! sinks, sources}`.
//!
//! Owns: turning arguments into an action's input (RFC 3339 flags read by
//! `actions::parse_time`, so a mistyped time is named before any
//! request), asking the daemon (or, for `events`, `attempts`, `dead` and `sinks` with
//! `--offline`, calling the action on the database), and printing each
//! answer.
//!
//! Must never: decide anything an action decides, or hide an error the
//! daemon gave.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use http::Method;
use outboxd::config::Config;
use outboxd::limits::{ADMIN_WRITE_TIMEOUT, CLIENT_TIMEOUT};
use outboxd::ops::actions::attempts::{self, AttemptQuery, Attempts};
use outboxd::ops::actions::dead::{self, DeadLetters, DeadSelection, PurgedDead, Replayed};
use outboxd::ops::actions::events::{self, EventView};
use outboxd::ops::actions::sinks::{self, Backfilled, SinkPaused, SinkRetired, Sinks};
use outboxd::ops::actions::sources::Sources;
use outboxd::ops::actions::{self, AdminError, DEAD_PAGE_MAX};
use outboxd::store::DeadFilter;

use super::{answer, ask, Offline, Refusal, Via};

/// `--offline`, for the commands that may work on the database without
/// the daemon.
#[derive(Args)]
pub struct OfflineFlag {
    /// Work on the database directly (the daemon's `--data-dir` or
    /// `--database-url`), without the running daemon. Only `events`,
    /// `attempts`, `dead` and `sinks` take it; the database must exist and
    /// be migrated.
    #[arg(long, global = true)]
    pub offline: bool,
}

#[derive(Subcommand)]
pub enum EventsCommand {
    /// Print an event and its deliveries as JSON (what `GET
    /// /v1/admin/events/ID` answers).
    Show {
        /// The event's CloudEvents `id`.
        id: String,
    },
}

#[derive(Subcommand)]
pub enum AttemptsCommand {
    /// List failed attempts, newest first, one line each: time, event id,
    /// delivery key, stream#sequence, attempt number, duration, outcome
    /// (retry, dead, trap, timeout), the receiver's status
    /// (`-` when unknown) and reason (what `GET /v1/admin/attempts`
    /// answers). A delivered attempt is not recorded.
    List {
        /// One destination's or sink's attempts (its delivery key).
        #[arg(long)]
        sink: Option<String>,
        /// One event's attempts.
        #[arg(long)]
        event: Option<String>,
        /// Recorded at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Recorded before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// At most this many, 1 to 1000 [default: 100].
        #[arg(long)]
        limit: Option<u32>,
    },
}

/// Which dead letters: every given option must match.
#[derive(Args)]
pub struct DeadArgs {
    /// One sink's or destination's dead letters (its delivery key).
    #[arg(long)]
    sink: Option<String>,
    /// One stream's dead letters (`partitionkey`, else `subject`, else
    /// `source`).
    #[arg(long)]
    stream: Option<String>,
    /// One event's deliveries.
    #[arg(long)]
    event: Option<String>,
    /// Died at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Died before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// At most this many, 1 to 10000 [default: 100 for `list`, 10000 for
    /// `replay` and `purge`] (the rule of the admin API too).
    #[arg(long)]
    limit: Option<u32>,
}

#[derive(Subcommand)]
pub enum DeadCommand {
    /// List dead letters with their reasons, newest first: event id, sink,
    /// stream#sequence, attempts, reason (what `GET /v1/admin/dead`
    /// answers).
    List(DeadArgs),
    /// Make dead letters pending again (attempts and window start afresh),
    /// in stream order, 500 a request, with a progress bar on a terminal.
    Replay(DeadArgs),
    /// Delete dead letters, 500 a request, with a progress bar on a
    /// terminal.
    Purge(DeadArgs),
}

#[derive(Subcommand)]
pub enum SinksCommand {
    /// Every sink with its state, as the running daemon (at `listen`)
    /// reports it: name, active or paused, state (loaded, quarantined until
    /// when and why, removed, refused, elsewhere), version. With
    /// `--offline`: the fleet's registry in the database, state `unknown`
    /// (or `retired`).
    List,
    /// Pause a sink: nothing is claimed, nothing is lost.
    Pause {
        /// The sink's name (its manifest's `name`).
        sink: String,
    },
    /// Resume a paused sink.
    Resume {
        /// The sink's name.
        sink: String,
    },
    /// Retire a sink from the fleet's registry: no replica routes new
    /// events to it; its queued deliveries are kept (and delivered by any
    /// replica that still has its plugin loaded).
    Retire {
        /// The sink's name.
        sink: String,
    },
}

#[derive(Subcommand)]
pub enum SourcesCommand {
    /// One line per source: name, kind, ready, last cycle age, last error.
    List,
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the merged configuration (file, environment, flags) as TOML,
    /// secrets redacted.
    Show,
}

/// `outboxd events show ID`.
pub async fn events(
    config: &Config,
    offline: bool,
    command: EventsCommand,
) -> anyhow::Result<ExitCode> {
    let EventsCommand::Show { id } = command;
    let view: Result<EventView, Refusal> = match Via::of(config, offline).await? {
        Via::Offline(store) => events::show_event(&*store, &id).await.map_err(Into::into),
        Via::Daemon(daemon) => {
            let path = format!("/v1/admin/events/{}", encode(&id));
            ask(
                &daemon,
                Method::GET,
                &path,
                None,
                ADMIN_WRITE_TIMEOUT,
                Offline::Allowed,
            )
            .await?
            .map_err(Into::into)
        }
    };
    answer(view, |view| {
        println!("{}", serde_json::to_string_pretty(&view)?);
        Ok(())
    })
}

/// `outboxd attempts list`.
pub async fn attempts(
    config: &Config,
    offline: bool,
    command: AttemptsCommand,
) -> anyhow::Result<ExitCode> {
    let AttemptsCommand::List {
        sink,
        event,
        since,
        until,
        limit,
    } = command;
    let query = AttemptQuery {
        sink,
        event_id: event,
        since,
        until,
        limit,
    };
    // Refuse a mistyped flag before any request, naming the flag.
    if let Err(e) = query.filter() {
        let e = match e {
            AdminError::Invalid { field, message } if field != "limit" => AdminError::Invalid {
                field: format!("--{field}"),
                message,
            },
            AdminError::Invalid { message, .. } => AdminError::Invalid {
                field: "--limit".into(),
                message,
            },
            other => other,
        };
        return answer::<()>(Err(Refusal::Offline(e)), |()| Ok(()));
    }
    let listed: Result<Attempts, Refusal> = match Via::of(config, offline).await? {
        Via::Offline(store) => attempts::list(&*store, &query).await.map_err(Into::into),
        Via::Daemon(daemon) => {
            let qs = query.query_string();
            let path = if qs.is_empty() {
                "/v1/admin/attempts".to_string()
            } else {
                format!("/v1/admin/attempts?{qs}")
            };
            ask(
                &daemon,
                Method::GET,
                &path,
                None,
                ADMIN_WRITE_TIMEOUT,
                Offline::Allowed,
            )
            .await?
            .map_err(Into::into)
        }
    };
    answer(listed, |Attempts { attempts, .. }| {
        for a in &attempts {
            println!(
                "{}\t{}\t{}\t{}#{}\tattempt={}\t{}\t{}\t{}\t{}",
                outboxd::rfc3339::format_ms(a.attempted_at_ms),
                a.event_id,
                a.sink,
                a.stream,
                a.sequence,
                a.attempt,
                a.duration_ms
                    .map_or_else(|| "-".to_string(), |ms| format!("{ms}ms")),
                a.outcome,
                a.status.as_deref().unwrap_or("-"),
                a.reason
            );
        }
        if attempts.is_empty() {
            eprintln!("no failed attempts match");
        }
        Ok(())
    })
}

/// `outboxd dead list|replay|purge`.
pub async fn dead(
    config: &Config,
    offline: bool,
    command: DeadCommand,
) -> anyhow::Result<ExitCode> {
    let via = |args| async move {
        Ok::<_, anyhow::Error>((Via::of(config, offline).await?, selection(args)?))
    };
    match command {
        DeadCommand::List(args) => {
            let (via, sel) = match via(args).await {
                Ok(v) => v,
                Err(e) => return flag_error(e),
            };
            let listed: Result<DeadLetters, Refusal> = match via {
                Via::Offline(store) => dead::list_dead(&*store, &sel).await.map_err(Into::into),
                Via::Daemon(daemon) => {
                    let path = format!("/v1/admin/dead{}", list_query(&sel));
                    ask(
                        &daemon,
                        Method::GET,
                        &path,
                        None,
                        ADMIN_WRITE_TIMEOUT,
                        Offline::Allowed,
                    )
                    .await?
                    .map_err(Into::into)
                }
            };
            answer(listed, |DeadLetters { dead }| {
                for d in &dead {
                    println!(
                        "{}\t{}\t{}#{}\tattempts={}\t{}",
                        d.event_id,
                        d.sink,
                        d.stream,
                        d.sequence,
                        d.attempts,
                        d.reason.as_deref().unwrap_or_default()
                    );
                }
                if dead.is_empty() {
                    eprintln!("no dead letters match");
                }
                Ok(())
            })
        }
        DeadCommand::Replay(args) => {
            let (via, sel) = match via(args).await {
                Ok(v) => v,
                Err(e) => return flag_error(e),
            };
            let done = in_pages(&via, &sel, Paged::Replay).await?;
            answer(done, |replayed| {
                println!("replayed {replayed}");
                Ok(())
            })
        }
        DeadCommand::Purge(args) => {
            let (via, sel) = match via(args).await {
                Ok(v) => v,
                Err(e) => return flag_error(e),
            };
            let done = in_pages(&via, &sel, Paged::Purge).await?;
            answer(done, |purged| {
                println!("purged {purged}");
                Ok(())
            })
        }
    }
}

/// Dead letters one replay or purge request takes at most from the CLI:
/// short transactions (each holds the rows it changes until it commits),
/// and a progress line per page.
const CLI_DEAD_PAGE: u32 = 500;

/// A dead-letter action the CLI runs page by page.
#[derive(Clone, Copy)]
enum Paged {
    Replay,
    Purge,
}

/// `action` on the letters `sel` matches (at most its limit), in pages of
/// [`CLI_DEAD_PAGE`], showing progress against the count that matched at
/// the start. Returns how many were done; a refusal of any page ends it
/// (the pages before it stay done).
async fn in_pages(
    via: &Via,
    sel: &DeadSelection,
    action: Paged,
) -> anyhow::Result<Result<u64, Refusal>> {
    let total = sel.limit.unwrap_or(DEAD_PAGE_MAX);
    let counted = DeadSelection {
        filter: sel.filter.clone(),
        limit: Some(total),
    };
    let matched: Result<DeadLetters, Refusal> = match via {
        Via::Offline(store) => dead::list_dead(&**store, &counted)
            .await
            .map_err(Into::into),
        Via::Daemon(daemon) => ask(
            daemon,
            Method::GET,
            &format!("/v1/admin/dead{}", list_query(&counted)),
            None,
            ADMIN_WRITE_TIMEOUT,
            Offline::Allowed,
        )
        .await?
        .map_err(Into::into),
    };
    let matched = match matched {
        Ok(m) => m.dead.len() as u64,
        Err(refused) => return Ok(Err(refused)),
    };
    let what = match action {
        Paged::Replay => "replaying dead letters",
        Paged::Purge => "purging dead letters",
    };
    let progress = super::progress::Progress::new(what, matched);
    let mut done = 0u64;
    while done < matched {
        let page = DeadSelection {
            filter: sel.filter.clone(),
            limit: Some((matched - done).min(CLI_DEAD_PAGE as u64) as u32),
        };
        let n: Result<u64, Refusal> = match (via, action) {
            (Via::Offline(store), Paged::Replay) => dead::replay_dead(&**store, &page)
                .await
                .map(|r| r.replayed)
                .map_err(Into::into),
            (Via::Offline(store), Paged::Purge) => dead::purge_dead(&**store, &page)
                .await
                .map(|r| r.purged)
                .map_err(Into::into),
            (Via::Daemon(daemon), Paged::Replay) => {
                post::<Replayed>(daemon, "/v1/admin/dead/replay", &page)
                    .await?
                    .map(|r| r.replayed)
            }
            (Via::Daemon(daemon), Paged::Purge) => {
                post::<PurgedDead>(daemon, "/v1/admin/dead/purge", &page)
                    .await?
                    .map(|r| r.purged)
            }
        };
        let n = match n {
            Ok(n) => n,
            Err(refused) => {
                progress.finish();
                return Ok(Err(refused));
            }
        };
        done += n;
        progress.set(done);
        if n < page.limit.unwrap_or(0) as u64 {
            // Fewer matched than the page asked: none is left.
            break;
        }
    }
    progress.finish();
    Ok(Ok(done))
}

/// An error before any action ran: a flag the action refused (printed,
/// exit 1), or no database to work on (an error).
fn flag_error(e: anyhow::Error) -> anyhow::Result<ExitCode> {
    match e.downcast::<AdminError>() {
        Ok(e) => answer::<()>(Err(Refusal::Offline(e)), |()| Ok(())),
        Err(e) => Err(e),
    }
}

/// `POST path` with `body` on the daemon: its answer, or its refusal.
async fn post<T: serde::de::DeserializeOwned>(
    daemon: &super::client::DaemonAt,
    path: &str,
    body: &impl serde::Serialize,
) -> anyhow::Result<Result<T, Refusal>> {
    let body = serde_json::to_value(body)?;
    Ok(ask(
        daemon,
        Method::POST,
        path,
        Some(body),
        ADMIN_WRITE_TIMEOUT,
        Offline::Allowed,
    )
    .await?
    .map_err(Into::into))
}

/// The action's selection from the flags.
fn selection(args: DeadArgs) -> Result<DeadSelection, AdminError> {
    let time = |flag: &str, t: Option<String>| t.map(|t| actions::parse_time(flag, &t)).transpose();
    Ok(DeadSelection {
        filter: DeadFilter {
            sink: args.sink,
            stream: args.stream,
            event_id: args.event,
            since_ms: time("--since", args.since)?,
            until_ms: time("--until", args.until)?,
        },
        limit: args.limit,
    })
}

/// The query string of `GET /v1/admin/dead` for `sel` (`?` included;
/// empty when nothing is selected).
fn list_query(sel: &DeadSelection) -> String {
    let f = &sel.filter;
    let pairs: Vec<String> = [
        ("sink", f.sink.clone()),
        ("stream", f.stream.clone()),
        ("event_id", f.event_id.clone()),
        ("since_ms", f.since_ms.map(|t| t.to_string())),
        ("until_ms", f.until_ms.map(|t| t.to_string())),
        ("limit", sel.limit.map(|n| n.to_string())),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.map(|v| format!("{key}={}", encode(&v))))
    .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

/// `text` percent-encoded for a URL path segment or query value
/// (RFC 3986 unreserved characters kept).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `outboxd sinks list|pause|resume|retire`.
pub async fn sinks(
    config: &Config,
    offline: bool,
    command: SinksCommand,
) -> anyhow::Result<ExitCode> {
    let (sink, paused) = match command {
        SinksCommand::List => return list_sinks(config, offline).await,
        SinksCommand::Pause { sink } => (sink, true),
        SinksCommand::Resume { sink } => (sink, false),
        SinksCommand::Retire { sink } => return retire_sink(config, offline, &sink).await,
    };
    let done: Result<SinkPaused, Refusal> = match Via::of(config, offline).await? {
        Via::Offline(store) => {
            let known: Vec<String> = match sinks::registered(&*store).await {
                Ok(all) => all.into_iter().map(|s| s.sink).collect(),
                Err(e) => return answer::<()>(Err(e.into()), |()| Ok(())),
            };
            sinks::set_paused(&*store, &known, &sink, paused)
                .await
                .map_err(Into::into)
        }
        Via::Daemon(daemon) => {
            let verb = if paused { "pause" } else { "resume" };
            let path = format!("/v1/admin/sinks/{}/{verb}", encode(&sink));
            post(&daemon, &path, &serde_json::json!({})).await?
        }
    };
    answer(done, |SinkPaused { sink, paused }| {
        println!("{sink}: {}", if paused { "paused" } else { "resumed" });
        Ok(())
    })
}

/// `outboxd sinks retire S`.
async fn retire_sink(config: &Config, offline: bool, sink: &str) -> anyhow::Result<ExitCode> {
    let done: Result<SinkRetired, Refusal> = match Via::of(config, offline).await? {
        Via::Offline(store) => sinks::retire(&*store, sink).await.map_err(Into::into),
        Via::Daemon(daemon) => {
            let path = format!("/v1/admin/sinks/{}/retire", encode(sink));
            post(&daemon, &path, &serde_json::json!({})).await?
        }
    };
    answer(done, |SinkRetired { sink, .. }| {
        println!(
            "{sink}: retired; no replica routes new events to it once it reads the \
             registry again (every {:?}); deliveries already queued stay and are \
             delivered by a replica that has it loaded",
            outboxd::fleet::BEAT_EVERY
        );
        Ok(())
    })
}

/// `outboxd sinks list`: the daemon's answer, one line per sink (loaded,
/// removed and quarantined state live in the daemon's process); with
/// `--offline`, the fleet's registry in the database, state `unknown`.
async fn list_sinks(config: &Config, offline: bool) -> anyhow::Result<ExitCode> {
    let daemon = match Via::of(config, offline).await? {
        Via::Offline(store) => return list_registered_sinks(&*store).await,
        Via::Daemon(daemon) => daemon,
    };
    let listed: Result<Sinks, Refusal> = ask(
        &daemon,
        Method::GET,
        "/v1/admin/sinks",
        None,
        CLIENT_TIMEOUT,
        Offline::Allowed,
    )
    .await?
    .map_err(Into::into);
    answer(listed, |Sinks { sinks, .. }| {
        for s in &sinks {
            let state = match &s.quarantine {
                Some(q) => format!("quarantined until {} ({})", q.until, q.reason),
                None => s.state.as_str().to_string(),
            };
            // A refused version: the running one (if any) keeps serving.
            let state = match &s.refused {
                Some(reason) if state == "loaded" => {
                    format!("loaded, replacement refused ({reason})")
                }
                Some(reason) => format!("{state} ({reason})"),
                None => state,
            };
            println!(
                "{}\t{}\t{state}\t{}\t{}",
                s.sink,
                if s.paused { "paused" } else { "active" },
                s.version.as_deref().unwrap_or("-"),
                s.wasm_sha256.as_deref().unwrap_or("-"),
            );
        }
        if sinks.is_empty() {
            eprintln!("no sinks: the daemon at {} has none loaded", config.listen);
        }
        Ok(())
    })
}

/// `outboxd sinks list --offline`: the registry's sinks.
async fn list_registered_sinks(store: &dyn outboxd::store::Store) -> anyhow::Result<ExitCode> {
    answer(
        sinks::registered(store).await.map_err(Refusal::from),
        |all| {
            for s in all {
                let state = if s.retired { "retired" } else { "unknown" };
                let active = if s.paused { "paused" } else { "active" };
                println!("{}\t{active}\t{state}\t{}", s.sink, s.version);
            }
            Ok(())
        },
    )
}

/// `outboxd sources list`: source status lives in the daemon's process.
pub async fn sources(config: &Config, command: SourcesCommand) -> anyhow::Result<ExitCode> {
    let SourcesCommand::List = command;
    let listed: Result<Sources, Refusal> = ask(
        &super::client::DaemonAt::of(config),
        Method::GET,
        "/v1/admin/sources",
        None,
        CLIENT_TIMEOUT,
        Offline::Refused,
    )
    .await?
    .map_err(Into::into);
    answer(listed, |Sources { sources }| {
        for s in sources {
            let age = match s.last_cycle_age_ms {
                Some(ms) => format!("last cycle {ms} ms ago"),
                None => "no cycle yet".to_string(),
            };
            println!(
                "{}\t{}\t{}\t{age}\t{}",
                s.name,
                s.kind,
                if s.ok { "ready" } else { "not ready" },
                s.last_error.as_deref().unwrap_or("-"),
            );
        }
        Ok(())
    })
}

/// `outboxd backfill --sink S [--since T]`, through the running daemon
/// (`POST /v1/admin/backfill`): it has the routes and the plugins, and
/// wakes its delivery loops for the deliveries created.
pub async fn backfill(
    config: &Config,
    sink: String,
    since: Option<String>,
) -> anyhow::Result<ExitCode> {
    let since_ms = match since {
        Some(t) => actions::parse_time("--since", &t)?,
        None => 0,
    };
    let waiting = super::progress::Waiting::new(format!("backfilling {sink}"));
    let req = sinks::BackfillRequest { sink, since_ms };
    let done: anyhow::Result<Result<Backfilled, super::client::Refused>> = ask(
        &super::client::DaemonAt::of(config),
        Method::POST,
        "/v1/admin/backfill",
        Some(serde_json::to_value(&req)?),
        ADMIN_WRITE_TIMEOUT,
        Offline::Refused,
    )
    .await;
    waiting.finish();
    match done? {
        Ok(done) => {
            println!(
                "{}: scanned {} events, created {} deliveries",
                done.sink, done.scanned, done.created
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(refused) => Ok(super::refused_with_status(refused)),
    }
}

/// `outboxd config show`: the configuration as the daemon would read it
/// (no daemon, no database), secrets redacted.
pub fn config(config: Config, command: ConfigCommand) -> anyhow::Result<ExitCode> {
    let ConfigCommand::Show = command;
    print!("{}", toml::to_string_pretty(&config.redacted())?);
    Ok(ExitCode::SUCCESS)
}
