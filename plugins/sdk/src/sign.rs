//! Message authentication codes for a sink that signs what it sends
//! (`outboxd:sink/hmac`, since WIT 0.1.3): the host computes them
//! natively, with the CPU's SHA extensions where it has them. SHA-256 in
//! WebAssembly costs about 22,000 instructions for a Standard Webhooks
//! signature; through the host the shipped webhook sink spends 1.4 µs
//! less CPU a request (bench/results/2026-12-05-outbound-host-copies.md).
//!
//! Built for another target than WebAssembly (a sink's unit tests), the
//! same function is computed in Rust, so tests see the same bytes.
//!
//! Must never: give a result other than RFC 2104's for any key length.

/// HMAC-SHA-256 (RFC 2104 over FIPS 180-4 SHA-256) of `message` under
/// `key`: 32 bytes. Any key length (a key longer than 64 bytes is hashed
/// first, as RFC 2104 says).
#[cfg(target_arch = "wasm32")]
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mac = crate::bindings::outboxd::sink::hmac::sha256(key, message);
    let mut out = [0; 32];
    // The host answers 32 bytes; anything else would leave zeros, which
    // no receiver accepts as a signature.
    let n = mac.len().min(32);
    out[..n].copy_from_slice(&mac[..n]);
    out
}

/// HMAC-SHA-256 (RFC 2104 over FIPS 180-4 SHA-256) of `message` under
/// `key`: 32 bytes, computed in Rust (this build is not WebAssembly).
#[cfg(not(target_arch = "wasm32"))]
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use hmac::{KeyInit as _, Mac as _};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4231_test_case_2() {
        let hex: String = hmac_sha256(b"Jefe", b"what do ya want for nothing?")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
