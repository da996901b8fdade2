//! Producer tokens: their shape, their generation and their digest.
//!
//! Owns: the token format `obx_<id>_<secret>` — `<id>` is
//! [`ID_HEX`] lower-case hex digits that name the token (shown in lists,
//! stored in the clear), `<secret>` the unpadded base64url of
//! [`SECRET_BYTES`] random bytes — and the SHA-256 digest by which a token
//! is stored and checked. A 256-bit random secret needs no slow password
//! hash: a digest of it cannot be guessed back (as GitHub and Svix store
//! their API tokens).
//!
//! Must never: keep, log or return a token except the one answer that
//! creates or rotates it; compare digests other than in constant time.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every token starts with this, so a secret scanner can find a leaked one.
pub const PREFIX: &str = "obx_";

/// Hex digits of a token's id (48 bits: unique among the producers of one
/// deployment, not a secret).
pub const ID_HEX: usize = 12;

/// Random bytes in a token's secret part (256 bits).
pub const SECRET_BYTES: usize = 32;

/// Length of the secret part: unpadded base64url of [`SECRET_BYTES`].
const SECRET_CHARS: usize = (SECRET_BYTES * 4).div_ceil(3);

/// A freshly generated token: the whole token (shown once) and what is
/// stored of it.
pub struct Generated {
    /// `obx_<id>_<secret>`: given to the producer, never stored.
    pub token: String,
    /// The token's id.
    pub id: String,
    /// Hex SHA-256 of the whole token.
    pub sha256: String,
}

/// A new random token.
pub fn generate() -> Generated {
    let id: [u8; ID_HEX / 2] = rand::random();
    let secret: [u8; SECRET_BYTES] = rand::random();
    let id = hex::encode(id);
    let token = format!(
        "{PREFIX}{id}_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    let sha256 = digest(&token);
    Generated { token, id, sha256 }
}

/// Hex SHA-256 of `token`.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The id of `token` when it has the token shape exactly (no whitespace,
/// no padding, nothing before or after); `None` otherwise.
pub fn id_of(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_at_checked(ID_HEX)?;
    let secret = secret.strip_prefix('_')?;
    let id_ok = id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let secret_ok = secret.len() == SECRET_CHARS
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (id_ok && secret_ok).then_some(id)
}

/// Whether `token`'s digest is `stored` (hex), compared in constant time.
pub fn matches(token: &str, stored: &str) -> bool {
    let given = Sha256::digest(token.as_bytes());
    match hex::decode(stored) {
        Ok(stored) if stored.len() == given.len() => given.as_slice().ct_eq(&stored).into(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_parses_and_matches_only_its_digest() {
        let g = generate();
        assert_eq!(id_of(&g.token), Some(g.id.as_str()));
        assert!(matches(&g.token, &g.sha256));
        let other = generate();
        assert!(!matches(&other.token, &g.sha256));
        assert_ne!(g.token, other.token);
    }

    #[test]
    fn near_tokens_are_not_tokens() {
        let g = generate();
        for bad in [
            format!("{}\n", g.token),
            format!(" {}", g.token),
            format!("{}=", g.token),
            g.token[..g.token.len() - 1].to_string(),
            g.token.replacen("obx_", "obx-", 1),
            g.token.to_uppercase(),
            String::new(),
        ] {
            assert_eq!(id_of(&bad), None, "{bad:?}");
        }
    }
}
