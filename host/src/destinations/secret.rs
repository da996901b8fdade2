//! Signing secrets of destinations.
//!
//! Owns: generating a Standard Webhooks secret (`whsec_` and the base64 of
//! [`SECRET_BYTES`] random bytes; <https://www.standardwebhooks.com/>,
//! "Signature scheme": secrets of 24 to 64 bytes) and the default grace
//! period of a rotation.
//!
//! Must never: log or return a secret except the one answer that creates
//! or rotates it.

use std::time::Duration;

use base64::Engine;

/// Random bytes in a generated secret (192 bits).
pub const SECRET_BYTES: usize = 24;

/// How long the previous secret keeps signing after a rotation unless the
/// request says otherwise: 24 h, as Svix keeps an old endpoint secret.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);

/// A fresh `whsec_…` secret.
pub fn generate() -> String {
    let bytes: [u8; SECRET_BYTES] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_secrets_are_standard_webhooks_keys_and_differ() {
        let (a, b) = (super::generate(), super::generate());
        assert_ne!(a, b);
        let key = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            a.strip_prefix("whsec_").unwrap(),
        )
        .unwrap();
        assert_eq!(key.len(), super::SECRET_BYTES);
    }
}
