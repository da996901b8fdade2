//! `batchalias`: a sink that hands the host, in one `http-batch.start`
//! call, 1,024 request records whose bodies all point at the same 1 MiB
//! of its memory — a gibibyte to copy out of 1 MiB held. The host must
//! refuse it (hostcall fuel) before it copies, not run out of memory.
//!
//! The records are written by hand at the canonical ABI's offsets and
//! passed to the raw import, since bindings that own each body cannot
//! alias one.

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "sink",
    });
}

use bindings::{Event, Outcome};

/// Requests started, each with the whole body.
const REQUESTS: usize = 1024;

/// The one body every request points at.
const BODY_BYTES: usize = 1 << 20;

/// `tuple<u64, request>`: the tag at 0, the record at 8 (aligned to 8);
/// in the record, `method` at 0, `url` at 8, `headers` at 16, `body` at
/// 24, `timeout-ms` at 32, `keep-body-bytes` at 48; 64 bytes in all.
const TAGGED_SIZE: usize = 64;

#[cfg(target_arch = "wasm32")]
// The WIT package's version (wit/sink.wit): the import must name it.
#[link(wasm_import_module = "outboxd:sink/http-batch@0.1.5")]
extern "C" {
    #[link_name = "start"]
    fn start(list: *const u8, len: usize);
}

struct BatchAlias;

impl bindings::Guest for BatchAlias {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn deliver(batch: Vec<Event>) -> Vec<Outcome> {
        let method = b"POST";
        let url = b"http://127.0.0.1:9/alias";
        let body = vec![b'x'; BODY_BYTES];
        let mut records = vec![0u64; REQUESTS * TAGGED_SIZE / 8];
        let bytes = records.as_mut_ptr().cast::<u8>();
        let put = |at: usize, value: u32| unsafe {
            bytes.add(at).cast::<u32>().write_unaligned(value);
        };
        for i in 0..REQUESTS {
            let record = i * TAGGED_SIZE + 8;
            put(record, method.as_ptr() as u32);
            put(record + 4, method.len() as u32);
            put(record + 8, url.as_ptr() as u32);
            put(record + 12, url.len() as u32);
            // No headers: pointer 0, length 0.
            put(record + 24, body.as_ptr() as u32);
            put(record + 28, body.len() as u32);
        }
        #[cfg(target_arch = "wasm32")]
        unsafe {
            start(bytes, REQUESTS);
        }
        batch.iter().map(|_| Outcome::Delivered).collect()
    }
}

bindings::export!(BatchAlias with_types_in bindings);
