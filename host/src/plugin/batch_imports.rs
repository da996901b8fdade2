//! The `outboxd:sink/http-batch` imports as the linker gives them: each
//! request record copied out of guest memory in one pass, not lifted
//! field by field into owned strings.
//!
//! A request of the shipped `webhook` sink carries about sixteen headers.
//! Lifted as `bindgen!` lifts it, that is a `String` per name, a `Vec` per
//! value, one for the method, the URL and the body — some thirty host
//! allocations and copies per request — before `http` parses the names
//! and allocates them again. Lifted as pointers (wasmtime's [`WasmStr`]
//! and [`WasmList`]), it still looks the guest's memory up four times a
//! header and computes each field's offset as it goes. Here a record of
//! a UTF-8 guest (every Rust, C, Go, Python and JavaScript component) is
//! read at the canonical ABI's offsets ([`CopiedRequest`]): its strings
//! and bytes copied into two buffers, each range bounds-checked and
//! charged to the store's hostcall fuel before it is copied, as wasmtime
//! charges an owned lift — so records aliasing one body a thousand times
//! are refused as `answer too large`, never copied. A UTF-16 or Latin-1
//! guest's record is lifted by wasmtime and read in place. `egress`
//! then parses the URL and the header names once per batch
//! (`egress::Recent`). Counted with callgrind, the first step took the
//! webhook bench's requests 10% fewer instructions
//! (bench/results/2026-12-05-outbound-host-copies.md), the one-pass copy
//! 3% fewer again (bench/results/2026-12-05-guest-allocator.md).
//!
//! The record's layout is wasmtime's `__internal` interface (`Lift`,
//! `LiftContext`), which moves between wasmtime versions: wasmtime is
//! pinned to one, `RequestShape` type-checks the record against the
//! guest's import, and a unit test checks the offsets against wasmtime's
//! own computation.
//!
//! Owns: the `send-batch`, `start`, `wait` and `keep-response-headers`
//! definitions, and the record type they read ([`GuestRequest`]). The
//! checks, the sending and the answers are `egress`'s.
//!
//! Must never: keep a borrow of guest memory past the call that lent it,
//! copy more out of it than the hostcall fuel allows, or send a request
//! past [`egress::MAX_REQUESTS_PER_CALL`] in flight (it is answered
//! `HTTP-request-denied`).

use std::borrow::Cow;

use bytes::Bytes;
use wasmtime::component::__internal::{
    wasmtime_environ::component::StringEncoding, CanonicalAbiInfo, InstanceType, InterfaceType,
    LiftContext,
};
use wasmtime::component::{ComponentType, Lift, Linker, WasmList, WasmStr};
use wasmtime::{AsContext, AsContextMut, StoreContextMut};

use super::egress::{self, Prepared, Recent, RequestView};
use super::host_state::HostState;
use super::manifest::{WIT_PACKAGE, WIT_VERSION};

/// One `http-batch.request` record as a UTF-8 guest wrote it, copied out
/// of its memory in one pass (see [`CopiedRequest`]); or, from a guest
/// whose strings are UTF-16 or Latin-1, as pointers that wasmtime lifted,
/// read in place when it is prepared.
pub enum GuestRequest {
    /// Copied in one pass: every Rust, C, Go, Python and JavaScript
    /// component's case.
    Copied(CopiedRequest),
    /// Lifted field by field by wasmtime.
    InPlace(RequestShape),
}

/// The `http-batch.request` record field by field, as the WIT
/// (`wit/sink.wit`) has it; wasmtime checks the shape against the guest's
/// import when the plugin is linked. [`GuestRequest`] is laid out and
/// type-checked as this.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct RequestShape {
    method: WasmStr,
    url: WasmStr,
    headers: WasmList<(WasmStr, WasmList<u8>)>,
    body: WasmList<u8>,
    #[component(name = "timeout-ms")]
    timeout_ms: Option<u64>,
    #[component(name = "keep-body-bytes")]
    keep_body_bytes: u32,
}

/// A request's strings and bytes copied out of guest memory together.
/// wasmtime's field-by-field lift looks up the guest's memory for every
/// string and list (four times a header) and computes each field's offset
/// as it goes: about 11,000 instructions a request of the `webhook` sink
/// (16 headers). Read here at the canonical ABI's offsets, with the same
/// bounds checks, UTF-8 checks and hostcall fuel, the request costs 4,800
/// fewer, the copy included.
pub struct CopiedRequest {
    /// The method, the URL and each header name, one after another.
    text: String,
    method_end: usize,
    url_end: usize,
    /// Per header, where its name ends in `text` and its value in `bytes`.
    ends: Vec<(usize, usize)>,
    /// Every header value, then the body: the layout the request is
    /// sent from ([`RequestView::copied`]).
    bytes: Bytes,
    timeout_ms: Option<u64>,
    keep_body_bytes: u32,
}

// SAFETY: laid out, flattened and type-checked exactly as `RequestShape`,
// whose implementation wasmtime derives from the same fields.
unsafe impl ComponentType for GuestRequest {
    type Lower = <RequestShape as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <RequestShape as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <RequestShape as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: every read of guest memory is bounds-checked (`guest_slice`).
unsafe impl Lift for GuestRequest {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        RequestShape::linear_lift_from_flat(cx, ty, src).map(GuestRequest::InPlace)
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        match cx.options().string_encoding {
            StringEncoding::Utf8 => copy_request(cx, bytes).map(GuestRequest::Copied),
            _ => RequestShape::linear_lift_from_memory(cx, ty, bytes).map(GuestRequest::InPlace),
        }
    }
}

/// Where each field of the record sits (canonical ABI, 32-bit memory):
/// `method`, `url`, `headers` and `body` are a pointer and a length each;
/// `timeout-ms` is a discriminant byte and, 8-aligned, a `u64`;
/// `keep-body-bytes` a `u32`. `the_record_offsets_are_the_canonical_abis`
/// checks them against wasmtime's own computation.
mod offsets {
    pub const METHOD: usize = 0;
    pub const URL: usize = 8;
    pub const HEADERS: usize = 16;
    pub const BODY: usize = 24;
    pub const TIMEOUT: usize = 32;
    pub const TIMEOUT_VALUE: usize = 40;
    pub const KEEP: usize = 48;
    /// One `tuple<string, list<u8>>`: name pointer and length, value
    /// pointer and length.
    pub const HEADER_SIZE: usize = 16;
}

/// The little-endian `u32` at `at` of `bytes`, as a `usize`.
fn word(bytes: &[u8], at: usize) -> usize {
    let mut le = [0; 4];
    le.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(le) as usize
}

/// `len` bytes of guest memory at `ptr`, charged to the hostcall fuel;
/// an error when they are not all inside the memory (the message is
/// wasmtime's for the same case).
fn guest_slice<'a>(
    cx: &mut LiftContext<'_>,
    memory: &'a [u8],
    ptr: usize,
    len: usize,
) -> wasmtime::Result<&'a [u8]> {
    let Some(slice) = ptr.checked_add(len).and_then(|end| memory.get(ptr..end)) else {
        wasmtime::bail!("string pointer/length out of bounds of memory");
    };
    cx.consume_fuel(len)?;
    Ok(slice)
}

/// The record in `record` (its [`RequestShape::ABI`] size), its strings
/// checked as UTF-8 and everything copied out (see [`CopiedRequest`]).
fn copy_request(cx: &mut LiftContext<'_>, record: &[u8]) -> wasmtime::Result<CopiedRequest> {
    use offsets::*;
    let memory = cx.memory();
    let method = guest_slice(cx, memory, word(record, METHOD), word(record, METHOD + 4))?;
    let url = guest_slice(cx, memory, word(record, URL), word(record, URL + 4))?;
    let body = guest_slice(cx, memory, word(record, BODY), word(record, BODY + 4))?;
    let (list_ptr, count) = (word(record, HEADERS), word(record, HEADERS + 4));
    if list_ptr % 4 != 0 {
        wasmtime::bail!("list pointer is not aligned");
    }
    let Some(list) = count
        .checked_mul(HEADER_SIZE)
        .and_then(|len| list_ptr.checked_add(len))
        .and_then(|end| memory.get(list_ptr..end))
    else {
        wasmtime::bail!("list pointer/length out of bounds of memory");
    };
    // Charged as wasmtime charges lifting the list itself.
    cx.consume_fuel_array(count, std::mem::size_of::<(WasmStr, WasmList<u8>)>())?;
    let mut headers = Vec::with_capacity(count);
    let (mut text_len, mut bytes_len) = (method.len() + url.len(), body.len());
    for header in list.chunks_exact(HEADER_SIZE) {
        let name = guest_slice(cx, memory, word(header, 0), word(header, 4))?;
        let value = guest_slice(cx, memory, word(header, 8), word(header, 12))?;
        text_len += name.len();
        bytes_len += value.len();
        headers.push((std::str::from_utf8(name)?, value));
    }
    let mut text = String::with_capacity(text_len);
    text.push_str(std::str::from_utf8(method)?);
    let method_end = text.len();
    text.push_str(std::str::from_utf8(url)?);
    let url_end = text.len();
    let mut bytes = Vec::with_capacity(bytes_len);
    let mut ends = Vec::with_capacity(count);
    for (name, value) in headers {
        text.push_str(name);
        bytes.extend_from_slice(value);
        ends.push((text.len(), bytes.len()));
    }
    bytes.extend_from_slice(body);
    let timeout_ms = match record[TIMEOUT] {
        0 => None,
        1 => {
            let mut le = [0; 8];
            le.copy_from_slice(&record[TIMEOUT_VALUE..TIMEOUT_VALUE + 8]);
            Some(u64::from_le_bytes(le))
        }
        _ => wasmtime::bail!("invalid option discriminant"),
    };
    Ok(CopiedRequest {
        text,
        method_end,
        url_end,
        ends,
        bytes: Bytes::from(bytes),
        timeout_ms,
        keep_body_bytes: word(record, KEEP) as u32,
    })
}

impl CopiedRequest {
    /// The request as [`egress::prepare`] reads it.
    fn prepare(&self, recent: &mut Recent) -> Prepared {
        let mut headers: Vec<(Cow<'_, str>, &[u8])> = Vec::with_capacity(self.ends.len());
        let (mut name_at, mut value_at) = (self.url_end, 0);
        for &(name_end, value_end) in &self.ends {
            headers.push((
                Cow::Borrowed(&self.text[name_at..name_end]),
                &self.bytes[value_at..value_end],
            ));
            (name_at, value_at) = (name_end, value_end);
        }
        let view = RequestView {
            method: &self.text[..self.method_end],
            url: &self.text[self.method_end..self.url_end],
            headers: &headers,
            body: &self.bytes[value_at..],
            timeout_ms: self.timeout_ms,
            keep_body_bytes: self.keep_body_bytes,
            copied: Some(&self.bytes),
        };
        egress::prepare(&view, recent)
    }
}

/// The instance name the imports are defined under,
/// `outboxd:sink/http-batch@<WIT version>`; a guest built against an
/// earlier 0.1 version links to it by semver.
fn instance_name() -> String {
    let (major, minor, patch) = WIT_VERSION;
    format!("{WIT_PACKAGE}/http-batch@{major}.{minor}.{patch}")
}

/// Define `send-batch`, `start`, `wait` and `keep-response-headers` in
/// `linker`.
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
    instance.func_wrap_async(
        "start",
        |mut store: StoreContextMut<'_, HostState>,
         (requests,): (WasmList<(u64, GuestRequest)>,)| {
            let started = start(&mut store, &requests);
            Box::new(async move {
                started?;
                // Hand the new requests to their connections before the
                // guest goes on building the next ones.
                store.data_mut().http_batch().in_flight.drive().await;
                Ok(())
            })
        },
    )?;
    instance.func_wrap_async(
        "wait",
        |mut store: StoreContextMut<'_, HostState>, (): ()| {
            Box::new(async move { Ok((store.data_mut().http_batch().in_flight.wait().await,)) })
        },
    )?;
    instance.func_wrap(
        "keep-response-headers",
        |mut store: StoreContextMut<'_, HostState>, (names,): (Vec<String>,)| {
            store.data_mut().http_batch().hooks.answer_headers =
                egress::AnswerHeaders::only(names.iter().map(String::as_str));
            Ok(())
        },
    )?;
    Ok(())
}

/// `start`'s records read out of guest memory, checked and started in
/// list order (the ones past the room left answered unsent).
fn start(
    store: &mut StoreContextMut<'_, HostState>,
    requests: &WasmList<(u64, GuestRequest)>,
) -> wasmtime::Result<()> {
    let room = store.data_mut().http_batch().in_flight.room();
    let (tags, records): (Vec<u64>, Vec<GuestRequest>) = requests
        .iter(&mut *store)?
        .collect::<wasmtime::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let prepared = prepare_all(store, &records, room)?;
    let state = store.data_mut().http_batch();
    state
        .in_flight
        .start(state.hooks, tags.into_iter().zip(prepared).collect());
    Ok(())
}

/// Every request of `requests` prepared, in order; those past the first
/// `room` are [`Prepared::OverCap`], never sent. What they parse in common is
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

/// `request` made ready ([`egress::prepare`]): a copied one as it is,
/// one lifted by wasmtime read in place. `scratch` holds the latter's
/// header records between calls, so a call reuses one vector for all its
/// requests.
///
/// # Errors
///
/// A string that is not valid in the guest's encoding (the canonical
/// ABI's rule, as an owned lift enforces it), or a list past the hostcall
/// fuel: the call traps.
fn prepare(
    store: &mut StoreContextMut<'_, HostState>,
    request: &GuestRequest,
    scratch: &mut Vec<(WasmStr, WasmList<u8>)>,
    recent: &mut Recent,
) -> wasmtime::Result<Prepared> {
    let request = match request {
        GuestRequest::Copied(copied) => return Ok(copied.prepare(recent)),
        GuestRequest::InPlace(shape) => shape,
    };
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
        copied: None,
    };
    Ok(egress::prepare(&view, recent))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hard-coded offsets are where wasmtime's canonical ABI puts
    /// each field of the record, and the record's size is what wasmtime
    /// hands `linear_lift_from_memory`.
    #[test]
    fn the_record_offsets_are_the_canonical_abis() {
        let string = || CanonicalAbiInfo::POINTER_PAIR;
        let option_u64 = <Option<u64> as ComponentType>::ABI;
        let fields = [
            string(),
            string(),
            string(),
            string(),
            option_u64,
            <u32 as ComponentType>::ABI,
        ];
        let mut at = 0;
        let offsets: Vec<usize> = fields
            .iter()
            .map(|f| f.next_field32_size(&mut at))
            .collect();
        use offsets::*;
        assert_eq!(offsets, [METHOD, URL, HEADERS, BODY, TIMEOUT, KEEP]);
        assert_eq!(
            TIMEOUT_VALUE - TIMEOUT,
            <Option<u64> as ComponentType>::ABI.align32 as usize,
            "an option's payload follows its discriminant at the payload's alignment"
        );
        assert_eq!(
            <(WasmStr, WasmList<u8>) as ComponentType>::SIZE32,
            HEADER_SIZE
        );
        // `keep-body-bytes`, then padding to the record's 8-byte alignment.
        assert_eq!(<RequestShape as ComponentType>::SIZE32, KEEP + 8);
    }
}
