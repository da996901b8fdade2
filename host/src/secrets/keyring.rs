//! The operator's keys: parsing a key file, and the ring of AES-256 keys
//! sealed values are opened with.
//!
//! Owns: the key file format — one key per line, `KEY-ID BASE64-32-BYTES`
//! (standard base64 of 32 random bytes, with its padding), `#` starting a
//! comment, blank lines ignored; the **last** key is the current one (it
//! seals), every earlier one only opens — and generating a key line.
//!
//! Must never: put a key's bytes into an error, a log line or a `Debug`
//! form (errors name the line and the key id only).

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::KeyInit;
use aes_gcm::Aes256Gcm;
use base64::Engine;
use zeroize::Zeroizing;

/// Bytes of one key: AES-256.
pub const KEY_BYTES: usize = 32;

/// Longest key id, bytes.
pub const MAX_KEY_ID_BYTES: usize = 64;

/// Why a key file (or `secrets.key`) was refused. Each names where: the
/// source (a file's path, or `secrets.key`) and the line (1-based; for
/// `secrets.key`, the entry between commas).
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// A line that is not `KEY-ID BASE64-32-BYTES`.
    #[error("{source_name} line {line}: {problem}")]
    Line {
        /// Where the keys came from.
        source_name: String,
        /// 1-based line (or entry) number.
        line: usize,
        /// What is wrong with it (never the key's bytes).
        problem: String,
    },
    /// No key at all.
    #[error("{0}: holds no key (expected lines `KEY-ID BASE64-32-BYTES`)")]
    Empty(String),
    /// The file could not be read or written.
    #[error("secrets key file {path}: {error}")]
    Io {
        /// The key file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

/// One key of the ring.
struct Key {
    cipher: Aes256Gcm,
}

/// The keys sealed values are opened with, by id, and the current one
/// (which seals). Its `Debug` form shows key ids only.
#[derive(Default)]
pub struct Keyring {
    keys: BTreeMap<String, Key>,
    current: Option<String>,
    /// Key ids in file order.
    order: Vec<String>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("key_ids", &self.order)
            .field("current", &self.current)
            .finish()
    }
}

impl Keyring {
    /// Parse `text`: lines of `KEY-ID BASE64-32-BYTES` (for `secrets.key`,
    /// see [`Keyring::parse_list`]). `source_name` names where it came
    /// from in errors.
    ///
    /// Errors: a line without both parts, a key id that is not 1 to
    /// [`MAX_KEY_ID_BYTES`] of letters, digits, `-`, `_`, `.`, a key id
    /// given twice, a key that is not base64 of [`KEY_BYTES`] bytes — each
    /// naming the line; no key at all.
    pub fn parse(text: &str, source_name: &str) -> Result<Keyring, KeyringError> {
        let mut ring = Keyring::default();
        for (i, raw) in text.split('\n').enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let refuse = |problem: String| KeyringError::Line {
                source_name: source_name.to_string(),
                line,
                problem,
            };
            let mut parts = content.split_whitespace();
            let (Some(id), Some(encoded), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(refuse(
                    "expected `KEY-ID BASE64-32-BYTES` (two parts separated by a space)".into(),
                ));
            };
            check_key_id(id).map_err(refuse)?;
            if ring.keys.contains_key(id) {
                return Err(refuse(format!("key id {id:?} is given twice")));
            }
            let bytes = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| refuse(format!("the key of {id:?} is not standard base64")))?,
            );
            if bytes.len() != KEY_BYTES {
                return Err(refuse(format!(
                    "the key of {id:?} is {} bytes; it must be {KEY_BYTES} (AES-256)",
                    bytes.len()
                )));
            }
            let cipher = Aes256Gcm::new_from_slice(&bytes)
                .map_err(|_| refuse(format!("the key of {id:?} is not an AES-256 key")))?;
            ring.keys.insert(id.to_string(), Key { cipher });
            ring.order.push(id.to_string());
            ring.current = Some(id.to_string());
        }
        if ring.keys.is_empty() {
            return Err(KeyringError::Empty(source_name.to_string()));
        }
        Ok(ring)
    }

    /// Parse the value of `secrets.key`: the lines of a key file separated
    /// by `,` (an environment variable holds one line), each entry numbered
    /// as a line in errors.
    pub fn parse_list(value: &str) -> Result<Keyring, KeyringError> {
        Keyring::parse(&value.replace(',', "\n"), "secrets.key")
    }

    /// The id of the key that seals (the last one given).
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    /// Every key id, in the order given.
    pub fn key_ids(&self) -> &[String] {
        &self.order
    }

    /// Whether the ring holds key `id`.
    pub fn has(&self, id: &str) -> bool {
        self.keys.contains_key(id)
    }

    /// The cipher of key `id`.
    pub(super) fn cipher(&self, id: &str) -> Option<&Aes256Gcm> {
        self.keys.get(id).map(|k| &k.cipher)
    }
}

/// Whether `id` may name a key: 1 to [`MAX_KEY_ID_BYTES`] bytes of ASCII
/// letters, digits, `-`, `_`, `.` (so it can stand between the `:` of a
/// sealed value).
pub fn check_key_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_KEY_ID_BYTES {
        return Err(format!(
            "key id {id:?} must be 1 to {MAX_KEY_ID_BYTES} bytes"
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "key id {id:?} may hold only letters, digits, `-`, `_` and `.`"
        ));
    }
    Ok(())
}

/// A fresh key line, `KEY-ID BASE64-32-BYTES`, with a key id not in
/// `taken`: `k` and the UTC date and time (`k20261204T1351Z`), suffixed
/// when taken. The key is 32 bytes of the thread's CSPRNG (ChaCha, seeded
/// from the operating system).
pub fn generate_line(taken: &[String]) -> Zeroizing<String> {
    let now = time::OffsetDateTime::now_utc();
    let base = format!(
        "k{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    );
    let mut id = base.clone();
    let mut n = 1;
    while taken.contains(&id) {
        n += 1;
        id = format!("{base}.{n}");
    }
    let key = Zeroizing::new(rand::random::<[u8; KEY_BYTES]>());
    Zeroizing::new(format!(
        "{id} {}",
        base64::engine::general_purpose::STANDARD.encode(*key)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([byte; KEY_BYTES])
    }

    #[test]
    fn the_last_key_is_current_and_comments_are_skipped() {
        let text = format!(
            "# keys of outboxd\n\nold {}\n  new {}   # added 2026-12-04\n",
            key(1),
            key(2)
        );
        let ring = Keyring::parse(&text, "keys.txt").unwrap();
        assert_eq!(ring.current(), Some("new"));
        assert_eq!(ring.key_ids(), ["old", "new"]);
        let env = format!("a {},b {}", key(1), key(2));
        assert_eq!(Keyring::parse_list(&env).unwrap().current(), Some("b"));
        let e = Keyring::parse_list(&format!("a {},b", key(1))).unwrap_err();
        assert!(e.to_string().starts_with("secrets.key line 2: "), "{e}");
    }

    #[test]
    fn file_errors_name_the_line_and_never_the_key() {
        let cases = [
            (format!("ok {}\nbroken\n", key(1)), 2, "two parts"),
            (
                format!("ok {}\n\nbad:id {}\n", key(1), key(2)),
                3,
                "may hold only",
            ),
            (format!("a {}\na {}\n", key(1), key(2)), 2, "given twice"),
            ("a not-base64!\n".to_string(), 1, "not standard base64"),
            (
                format!(
                    "# c\nshort {}\n",
                    base64::engine::general_purpose::STANDARD.encode([7u8; 16])
                ),
                2,
                "16 bytes; it must be 32",
            ),
        ];
        for (text, line, why) in cases {
            let e = Keyring::parse(&text, "/etc/outboxd/keys").unwrap_err();
            let shown = e.to_string();
            assert!(
                shown.starts_with(&format!("/etc/outboxd/keys line {line}: ")),
                "{shown}"
            );
            assert!(shown.contains(why), "{shown}");
            assert!(
                !shown.contains(&key(1)) && !shown.contains(&key(2)),
                "{shown}"
            );
        }
        assert!(matches!(
            Keyring::parse("# nothing\n", "f"),
            Err(KeyringError::Empty(_))
        ));
    }

    #[test]
    fn generated_lines_parse_with_a_fresh_id() {
        let first = generate_line(&[]);
        let id = first.split(' ').next().unwrap().to_string();
        let second = generate_line(std::slice::from_ref(&id));
        let ring = Keyring::parse(&format!("{}\n{}\n", *first, *second), "f").unwrap();
        assert_eq!(ring.key_ids().len(), 2);
        assert_ne!(ring.key_ids()[0], ring.key_ids()[1]);
        assert!(!format!("{ring:?}").contains(first.split(' ').nth(1).unwrap()));
    }
}
