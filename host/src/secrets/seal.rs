//! The sealed form of one secret value.
//!
//! Owns: the format `enc:v1:<key-id>:<base64(nonce ‖ ciphertext ‖ tag)>`
//! — AES-256-GCM (NIST SP 800-38D) with a random 96-bit nonce per value
//! (SP 800-38D §8.2.2, the RBG-based construction: under one key the
//! nonces of at most 2³² values may be random, far beyond the secrets a
//! database holds; rotate-key starts a new key long before), a 128-bit
//! tag, standard base64 with padding — and the associated data that binds
//! a value to where it belongs (`outboxd:v1:<key-id>:<context>`, the
//! context being e.g. the destination's name), so a value copied to
//! another destination, or relabelled with another key id, does not open.
//!
//! A value is *sealed* when it starts with `enc:`; anything else is a
//! *plain* value (written before sealing existed, or on a store without a
//! key) and opens as itself.
//!
//! Must never: return or log a plaintext except from [`open`] to its
//! caller; put a plaintext into an error.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use zeroize::Zeroizing;

use super::keyring::Keyring;

/// What every sealed value starts with; a value that does not is plain.
pub const PREFIX: &str = "enc:";

/// The format version written now.
pub const VERSION: &str = "v1";

/// Bytes of a nonce: 96 bits, the length SP 800-38D §5.2.1.1 recommends.
pub const NONCE_BYTES: usize = 12;

/// Bytes of the authentication tag (128 bits).
pub const TAG_BYTES: usize = 16;

/// Why a value could not be sealed or opened. Names the key id, never a
/// plaintext or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// There is no key to seal with.
    #[error("no secrets key is configured")]
    NoKey,
    /// Sealed under a key the ring does not hold.
    #[error("sealed under key id {key_id:?}, which is not in the keyring")]
    UnknownKey {
        /// The key id of the value.
        key_id: String,
    },
    /// The tag did not verify: another key of the same id, a value moved
    /// from another place (associated data), or altered bytes.
    #[error("does not open under key id {key_id:?}: the key differs, or the value was altered or copied from another destination")]
    Rejected {
        /// The key id of the value.
        key_id: String,
    },
    /// Starts with `enc:` but is not `enc:v1:<key-id>:<base64>`.
    #[error("is not a sealed value of a known format: {0}")]
    Malformed(String),
}

/// Whether `value` is sealed (starts with `enc:`).
pub fn is_sealed(value: &str) -> bool {
    value.starts_with(PREFIX)
}

/// The key id of a sealed value, if it is one of the known format.
pub fn key_id_of(value: &str) -> Option<&str> {
    parse(value).ok().map(|(id, _)| id)
}

fn aad(key_id: &str, context: &str) -> Vec<u8> {
    format!("outboxd:{VERSION}:{key_id}:{context}").into_bytes()
}

/// `plaintext` sealed under the ring's current key, bound to `context`.
///
/// Errors: [`SealError::NoKey`] when the ring holds no key.
pub fn seal(ring: &Keyring, context: &str, plaintext: &str) -> Result<String, SealError> {
    let key_id = ring.current().ok_or(SealError::NoKey)?;
    let cipher: &Aes256Gcm = ring.cipher(key_id).ok_or(SealError::NoKey)?;
    let nonce_bytes: [u8; NONCE_BYTES] = rand::random();
    let aad = aad(key_id, context);
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce_bytes),
            Payload {
                msg: plaintext.as_bytes(),
                aad: &aad,
            },
        )
        // AES-GCM encryption fails only for a message past 2^36 bytes.
        .map_err(|_| SealError::Malformed("value too long to seal".into()))?;
    let mut body = Vec::with_capacity(NONCE_BYTES + sealed.len());
    body.extend_from_slice(&nonce_bytes);
    body.extend_from_slice(&sealed);
    Ok(format!(
        "{PREFIX}{VERSION}:{key_id}:{}",
        base64::engine::general_purpose::STANDARD.encode(body)
    ))
}

/// Split a sealed value into its key id and its bytes.
fn parse(value: &str) -> Result<(&str, Vec<u8>), SealError> {
    let rest = value
        .strip_prefix(PREFIX)
        .ok_or_else(|| SealError::Malformed("no `enc:` prefix".into()))?;
    let (version, rest) = rest
        .split_once(':')
        .ok_or_else(|| SealError::Malformed("no version".into()))?;
    if version != VERSION {
        return Err(SealError::Malformed(format!(
            "format version {version:?} is not {VERSION:?} (written by a newer outboxd?)"
        )));
    }
    let (key_id, encoded) = rest
        .split_once(':')
        .ok_or_else(|| SealError::Malformed("no key id".into()))?;
    let body = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| SealError::Malformed(format!("key id {key_id:?}: body is not base64")))?;
    if body.len() < NONCE_BYTES + TAG_BYTES {
        return Err(SealError::Malformed(format!(
            "key id {key_id:?}: body of {} bytes is shorter than a nonce and a tag",
            body.len()
        )));
    }
    Ok((key_id, body))
}

/// The plaintext of `value` bound to `context`: a plain value as it is, a
/// sealed one opened with its key from `ring`.
///
/// Errors: the key id is not in the ring ([`SealError::UnknownKey`]), the
/// tag does not verify ([`SealError::Rejected`]), the value is malformed,
/// or the plaintext is not UTF-8 (malformed).
pub fn open(ring: &Keyring, context: &str, value: &str) -> Result<Zeroizing<String>, SealError> {
    if !is_sealed(value) {
        return Ok(Zeroizing::new(value.to_string()));
    }
    let (key_id, body) = parse(value)?;
    let cipher = ring.cipher(key_id).ok_or_else(|| SealError::UnknownKey {
        key_id: key_id.to_string(),
    })?;
    let (nonce, sealed) = body.split_at(NONCE_BYTES);
    let aad = aad(key_id, context);
    let plain = Zeroizing::new(
        cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Rejected {
                key_id: key_id.to_string(),
            })?,
    );
    match std::str::from_utf8(&plain) {
        Ok(text) => Ok(Zeroizing::new(text.to_string())),
        Err(_) => Err(SealError::Malformed(format!(
            "key id {key_id:?}: plaintext is not UTF-8"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(lines: &[(&str, u8)]) -> Keyring {
        let text: Vec<String> = lines
            .iter()
            .map(|(id, b)| {
                format!(
                    "{id} {}",
                    base64::engine::general_purpose::STANDARD.encode([*b; 32])
                )
            })
            .collect();
        Keyring::parse(&text.join("\n"), "test").unwrap()
    }

    #[test]
    fn a_sealed_value_round_trips_and_shows_nothing_of_the_plaintext() {
        let ring = ring(&[("k1", 1)]);
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let a = seal(&ring, "dest-a", secret).unwrap();
        let b = seal(&ring, "dest-a", secret).unwrap();
        assert!(a.starts_with("enc:v1:k1:"), "{a}");
        assert_ne!(a, b, "a fresh nonce per value");
        assert!(!a.contains("MfKQ9r8G"));
        assert_eq!(key_id_of(&a), Some("k1"));
        assert_eq!(*open(&ring, "dest-a", &a).unwrap(), secret);
        assert_eq!(*open(&ring, "dest-a", "plain").unwrap(), "plain");
    }

    #[test]
    fn another_context_or_an_altered_value_does_not_open() {
        let ring = ring(&[("k1", 1)]);
        let a = seal(&ring, "dest-a", "s3cret").unwrap();
        assert_eq!(
            open(&ring, "dest-b", &a).unwrap_err(),
            SealError::Rejected {
                key_id: "k1".into()
            }
        );
        // Relabelled with another key id the ring holds: the associated
        // data names the key id, so it fails even under the same bytes.
        let other = ring_with_same_bytes();
        let relabelled = a.replacen("enc:v1:k1:", "enc:v1:k2:", 1);
        assert!(matches!(
            open(&other, "dest-a", &relabelled),
            Err(SealError::Rejected { .. })
        ));
        let mut bytes = a.clone().into_bytes();
        let last = bytes.len() - 3;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        assert!(open(&ring, "dest-a", &String::from_utf8(bytes).unwrap()).is_err());
    }

    fn ring_with_same_bytes() -> Keyring {
        ring(&[("k1", 1), ("k2", 1)])
    }

    #[test]
    fn an_unknown_key_id_is_named() {
        let old = ring(&[("2026-old", 1)]);
        let new = ring(&[("2026-new", 2)]);
        let a = seal(&old, "d", "x").unwrap();
        let e = open(&new, "d", &a).unwrap_err();
        assert_eq!(
            e,
            SealError::UnknownKey {
                key_id: "2026-old".into()
            }
        );
        assert!(e.to_string().contains("\"2026-old\""), "{e}");
        // Both keys in the ring: the old value opens, new ones seal under
        // the last.
        let both = ring(&[("2026-old", 1), ("2026-new", 2)]);
        assert_eq!(*open(&both, "d", &a).unwrap(), "x");
        assert!(seal(&both, "d", "x")
            .unwrap()
            .starts_with("enc:v1:2026-new:"));
    }

    #[test]
    fn malformed_values_are_refused() {
        let ring = ring(&[("k1", 1)]);
        for bad in [
            "enc:",
            "enc:v2:k1:AAAA",
            "enc:v1:k1",
            "enc:v1:k1:!!",
            "enc:v1:k1:AAAA",
        ] {
            assert!(
                matches!(open(&ring, "d", bad), Err(SealError::Malformed(_))),
                "{bad}"
            );
        }
        assert_eq!(
            seal(&Keyring::default(), "d", "x").unwrap_err(),
            SealError::NoKey
        );
    }
}
