//! The `outboxd:sink/http-batch` imports as the linker gives them: each
//! request record read where the guest wrote it, not lifted into owned
//! strings first.
//!
//! A request of the shipped `webhook` sink carries about fifteen headers.
//! Lifted as `bindgen!` lifts it, that is a `String` per name, a `Vec` per
//! value, one for the method, the URL and the body — some thirty host
//! allocations and copies per request — before `http` parses the names
//! and allocates them again. Here wasmtime lifts only pointers and lengths
//! ([`WasmStr`], [`WasmList`]: bounds-checked, and charged to the store's
//! hostcall fuel as an owned lift is, so a list aliasing one string a
//! million times is refused as `answer too large` just the same), and
//! `egress::prepare` copies the header values and the body out together,
//! into one buffer hyper sends from, with the URL and the header names
//! parsed once per batch (`egress::Recent`). Measured with callgrind, the
//! webhook bench's requests cost 10% fewer instructions this way
//! (bench/results/2026-12-05-outbound-host-copies.md).
//!
//! Owns: the `send-batch`, `start` and `wait` definitions, and the record
//! type they read ([`GuestRequest`]). The checks and the sending are
//! `egress`'s.
//!
//! Must never: keep a borrow of guest memory past the call that lent it,
//! or read a request past [`egress::MAX_REQUESTS_PER_CALL`] in flight (it
//! is answered `HTTP-request-denied` unread).

use std::borrow::Cow;

use wasmtime::component::{ComponentType, Lift, Linker, WasmList, WasmStr};
use wasmtime::{AsContext, AsContextMut, StoreContextMut};

use super::egress::{self, Prepared, Recent, RequestView};
use super::host_state::HostState;
use super::manifest::{WIT_PACKAGE, WIT_VERSION};

/// One `http-batch.request` record, as pointers into the guest's memory.
/// Field by field the WIT's (`wit/sink.wit`); wasmtime checks the shape
/// against the guest's import when the plugin is linked.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct GuestRequest {
    method: WasmStr,
    url: WasmStr,
    headers: WasmList<(WasmStr, WasmList<u8>)>,
    body: WasmList<u8>,
    #[component(name = "timeout-ms")]
    timeout_ms: Option<u64>,
    #[component(name = "keep-body-bytes")]
    keep_body_bytes: u32,
}

/// The instance name the imports are defined under,
/// `outboxd:sink/http-batch@<WIT version>`; a guest built against an
/// earlier 0.1 version links to it by semver.
fn instance_name() -> String {
    let (major, minor, patch) = WIT_VERSION;
    format!("{WIT_PACKAGE}/http-batch@{major}.{minor}.{patch}")
}

/// Define `send-batch`, `start` and `wait` in `linker`.
///
/// # Errors
///
/// wasmtime's, when a name is already defined.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut instance = linker.instance(&instance_name())?;
    instance.func_wrap_async(
        "send-batch",
        |mut store: StoreContextMut<'_, HostState>, (requests,): (WasmList<GuestRequest>,)| {
            let prepared = requests
                .iter(&mut store)
                .and_then(|records| records.collect::<wasmtime::Result<Vec<_>>>())
                .and_then(|records| {
                    prepare_all(&mut store, &records, egress::MAX_REQUESTS_PER_CALL)
                });
            Box::new(async move {
                let prepared = prepared?;
                let sending = store.data_mut().http_batch().hooks.send_batch(prepared);
                Ok((sending.await,))
            })
        },
    )?;
    instance.func_wrap(
        "start",
        |mut store: StoreContextMut<'_, HostState>,
         (requests,): (WasmList<(u64, GuestRequest)>,)| {
            let room = store.data_mut().http_batch().in_flight.room();
            let (tags, records): (Vec<u64>, Vec<GuestRequest>) = requests
                .iter(&mut store)?
                .collect::<wasmtime::Result<Vec<_>>>()?
                .into_iter()
                .unzip();
            let prepared = prepare_all(&mut store, &records, room)?;
            let state = store.data_mut().http_batch();
            state
                .in_flight
                .start(state.hooks, tags.into_iter().zip(prepared).collect());
            Ok(())
        },
    )?;
    instance.func_wrap_async(
        "wait",
        |mut store: StoreContextMut<'_, HostState>, (): ()| {
            Box::new(async move { Ok((store.data_mut().http_batch().in_flight.wait().await,)) })
        },
    )?;
    Ok(())
}

/// Every request of `requests` prepared, in order; those past the first
/// `room` are [`Prepared::OverCap`], unread. What they parse in common is
/// kept in the batch's [`Recent`].
fn prepare_all(
    store: &mut StoreContextMut<'_, HostState>,
    requests: &[GuestRequest],
    room: usize,
) -> wasmtime::Result<Vec<Prepared>> {
    // Taken out while guest memory is borrowed, and put back after.
    let mut recent = std::mem::take(store.data_mut().http_batch().recent);
    let mut scratch = Vec::new();
    let prepared = requests
        .iter()
        .enumerate()
        .map(|(index, request)| match index < room {
            true => prepare(store, request, &mut scratch, &mut recent),
            false => Ok(Prepared::OverCap),
        })
        .collect();
    *store.data_mut().http_batch().recent = recent;
    prepared
}

/// `request` read in place and made ready ([`egress::prepare`]).
/// `scratch` holds its header records between calls, so a call reuses one
/// vector for all its requests.
///
/// # Errors
///
/// A string that is not UTF-8 (the canonical ABI's rule, as an owned lift
/// enforces it), or a list past the hostcall fuel: the call traps.
fn prepare(
    store: &mut StoreContextMut<'_, HostState>,
    request: &GuestRequest,
    scratch: &mut Vec<(WasmStr, WasmList<u8>)>,
    recent: &mut Recent,
) -> wasmtime::Result<Prepared> {
    scratch.clear();
    for header in request.headers.iter(store.as_context_mut())? {
        scratch.push(header?);
    }
    let memory = store.as_context();
    let mut headers: Vec<(Cow<'_, str>, &[u8])> = Vec::with_capacity(scratch.len());
    for (name, value) in scratch.iter() {
        headers.push((name.to_str(&memory)?, value.as_le_slice(&memory)));
    }
    let method = request.method.to_str(&memory)?;
    let url = request.url.to_str(&memory)?;
    let view = RequestView {
        method: &method,
        url: &url,
        headers: &headers,
        body: request.body.as_le_slice(&memory),
        timeout_ms: request.timeout_ms,
        keep_body_bytes: request.keep_body_bytes,
    };
    Ok(egress::prepare(&view, recent))
}
