//! Secrets at rest: every credential outboxd keeps in its database is
//! stored sealed (AES-256-GCM) under a key the operator provides.
//!
//! Owns: the operator's keys ([`keyring`]: the key file format, the
//! current key) and where they come from — `secrets.key-file`,
//! `secrets.key` (`OUTBOXD_SECRETS__KEY`), or, for the embedded SQLite
//! default with neither, a key file generated into the data folder
//! ([`DEFAULT_KEY_FILE`], mode 0600, created atomically); the sealed form
//! of one value ([`seal`]: `enc:v1:<key-id>:<base64(nonce ‖ ciphertext ‖
//! tag)>`, bound by associated data to its context); the rule for which
//! configuration values are credentials ([`is_credential`]); reloading the
//! keyring from its file (at most every [`RELOAD_AT_MOST_EVERY`] when a
//! value names a key it does not hold, so a replica picks up a key added
//! to a shared key file) and appending a generated key to it; its
//! settings (`[secrets]`, [`settings`]).
//!
//! What a record looks like sealed, and when records are sealed, opened and
//! resealed, is `crate::destinations` business (`destinations::sealing`).
//!
//! Must never: log, return or put into an error a key or a plaintext
//! secret; write a key file anyone but its owner can read.

pub mod keyring;
pub mod seal;
pub mod settings;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

pub use keyring::{Keyring, KeyringError};
pub use seal::{is_sealed, key_id_of, SealError};

/// The key file the embedded default generates in its data folder when no
/// key is configured.
pub const DEFAULT_KEY_FILE: &str = "secrets.key";

/// Shortest time between two reloads of the key file caused by a value
/// sealed under a key id the ring does not hold (an operator's
/// `rotate-key` reloads at once): a record that cannot be opened is tried
/// again every second, and must not make every second a file read.
pub const RELOAD_AT_MOST_EVERY: Duration = Duration::from_secs(2);

/// The setting that names a key file, and its environment variable.
pub const KEY_FILE_SETTING: &str = "secrets.key-file (OUTBOXD_SECRETS__KEY_FILE)";
/// The setting that holds the keys, and its environment variable.
pub const KEY_SETTING: &str = "secrets.key (OUTBOXD_SECRETS__KEY)";

/// Key-name words that make a configuration value a credential (matched
/// in the key lower-cased with `_` and `.` read as `-`, anywhere in it:
/// `secret`, `client-secret`, `db_password`, `api-key`, `apikey`,
/// `auth-token`, `credentials`, `private-key`, `authorization`).
pub const CREDENTIAL_WORDS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "token",
    "api-key",
    "apikey",
    "credential",
    "private-key",
    "authorization",
];

/// Whether the configuration value `value` of key `key` is a credential,
/// so stored sealed and never shown: its key names one
/// ([`CREDENTIAL_WORDS`]), or it is a URL carrying a password
/// (`scheme://user:password@host…`, as `crate::redact::redact_url` finds
/// it).
pub fn is_credential(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase().replace(['_', '.'], "-");
    CREDENTIAL_WORDS.iter().any(|w| key.contains(w)) || crate::redact::redact_url(value) != value
}

/// Why the keys could not be loaded or a key added.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The key file or `secrets.key` does not parse (names the line).
    #[error(transparent)]
    Keyring(#[from] KeyringError),
    /// `--generate` without a key file of this daemon's to append to.
    #[error("the keys come from {0}, which outboxd cannot change: add a key there (as the last line), restart, and rotate again without --generate")]
    NotAFile(&'static str),
    /// No key at all (PostgreSQL without a configured key).
    #[error("no secrets key is configured: set {KEY_FILE_SETTING} or {KEY_SETTING}")]
    NoKey,
}

/// Where the keys come from.
#[derive(Debug, Clone)]
enum Source {
    /// Nowhere: nothing is sealed (PostgreSQL without a configured key).
    None,
    /// `secrets.key` (read once, at start).
    Value,
    /// A key file: configured, or generated into the data folder.
    File(PathBuf),
}

/// The keyring of this process and where it comes from; shared by every
/// room that seals or opens (`Arc<Secrets>`).
pub struct Secrets {
    source: Source,
    ring: RwLock<Arc<Keyring>>,
    last_reload: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("source", &self.source)
            .field("ring", &*self.ring())
            .finish()
    }
}

impl Secrets {
    fn with(source: Source, ring: Keyring) -> Arc<Secrets> {
        Arc::new(Secrets {
            source,
            ring: RwLock::new(Arc::new(ring)),
            last_reload: Mutex::new(None),
        })
    }

    /// No key: plain values open as themselves; nothing can be sealed.
    pub fn none() -> Arc<Secrets> {
        Secrets::with(Source::None, Keyring::default())
    }

    /// The keys of `secrets.key` (key-file lines separated by `,`).
    pub fn from_value(value: &str) -> Result<Arc<Secrets>, SecretsError> {
        Ok(Secrets::with(Source::Value, Keyring::parse_list(value)?))
    }

    /// The keys of the key file `path`. A file others may read is
    /// accepted, with a warning.
    pub fn from_file(path: &Path) -> Result<Arc<Secrets>, SecretsError> {
        let ring = read_file(path)?;
        warn_if_readable_by_others(path);
        Ok(Secrets::with(Source::File(path.to_path_buf()), ring))
    }

    /// The key file `<data_dir>/secrets.key`, generated (mode 0600, one
    /// fresh key, created atomically: written aside, then linked into
    /// place, so another process starting at once never reads half a
    /// file and never overwrites it) when it does not exist. Logs once
    /// when it generated the file.
    pub fn in_data_dir(data_dir: &Path) -> Result<Arc<Secrets>, SecretsError> {
        let path = data_dir.join(DEFAULT_KEY_FILE);
        if !path.exists() && create_key_file(&path)? {
            tracing::info!(
                key_file = %path.display(),
                "generated a secrets key file for the embedded store (secrets at rest are sealed under it; back it up with the database, or set {KEY_FILE_SETTING})"
            );
        }
        Secrets::from_file(&path)
    }

    /// The keys as configured: `key_file`, else `key`, else (when
    /// `data_dir` is given: the embedded default) the data folder's
    /// generated file, else none.
    pub fn load(
        key_file: Option<&Path>,
        key: Option<&str>,
        data_dir: Option<&Path>,
    ) -> Result<Arc<Secrets>, SecretsError> {
        match (key_file, key.filter(|k| !k.trim().is_empty()), data_dir) {
            (Some(path), _, _) => Secrets::from_file(path),
            (None, Some(value), _) => Secrets::from_value(value),
            (None, None, Some(dir)) => Secrets::in_data_dir(dir),
            (None, None, None) => Ok(Secrets::none()),
        }
    }

    /// The keyring now.
    pub fn ring(&self) -> Arc<Keyring> {
        self.ring.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether there is a key to seal with.
    pub fn has_key(&self) -> bool {
        self.ring().current().is_some()
    }

    /// The id of the key that seals now.
    pub fn current_key_id(&self) -> Option<String> {
        self.ring().current().map(str::to_string)
    }

    /// Where the keys come from, for messages: the key file's path,
    /// `secrets.key`, or `none`.
    pub fn source(&self) -> String {
        match &self.source {
            Source::None => "none".into(),
            Source::Value => "secrets.key".into(),
            Source::File(path) => path.display().to_string(),
        }
    }

    /// `plaintext` sealed under the current key, bound to `context`.
    pub fn seal(&self, context: &str, plaintext: &str) -> Result<String, SealError> {
        seal::seal(&self.ring(), context, plaintext)
    }

    /// The plaintext of `value` (a plain value as it is). A value under a
    /// key id the ring does not hold makes the ring reload from its file
    /// once (at most every [`RELOAD_AT_MOST_EVERY`]) before failing.
    pub fn open(&self, context: &str, value: &str) -> Result<Zeroizing<String>, SealError> {
        match seal::open(&self.ring(), context, value) {
            Err(SealError::UnknownKey { .. }) if self.reload_if_due() => {
                seal::open(&self.ring(), context, value)
            }
            other => other,
        }
    }

    /// Reload the ring from its key file when the last reload is
    /// [`RELOAD_AT_MOST_EVERY`] ago or more; whether it did.
    fn reload_if_due(&self) -> bool {
        {
            let mut last = self.last_reload.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < RELOAD_AT_MOST_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match self.reread() {
            Ok(ids) => {
                tracing::debug!(key_ids = ?ids, "secrets keyring read again for an unknown key id");
                true
            }
            Err(e) => {
                tracing::warn!("reloading the secrets keyring: {e}");
                false
            }
        }
    }

    /// Read the key file again (a key added as the new last line becomes
    /// current). The ring from `secrets.key`, or no key, stays as it is.
    ///
    /// Errors: the file no longer parses (the ring in use is kept).
    pub fn reload(&self) -> Result<(), SecretsError> {
        let ids = self.reread()?;
        if let Source::File(path) = &self.source {
            tracing::info!(key_file = %path.display(), key_ids = ?ids, "secrets keyring reloaded");
        }
        Ok(())
    }

    /// Read the key file again, if the keys come from one; the key ids
    /// now held.
    fn reread(&self) -> Result<Vec<String>, SecretsError> {
        let Source::File(path) = &self.source else {
            return Ok(self.ring().key_ids().to_vec());
        };
        let ring = read_file(path)?;
        let ids = ring.key_ids().to_vec();
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ring);
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        Ok(ids)
    }

    /// Append a freshly generated key to the key file as its new last
    /// line (the current key), then reload. Returns the new key id.
    ///
    /// Errors: the keys do not come from a file ([`SecretsError::NotAFile`]),
    /// the file cannot be written.
    pub fn generate_key(&self) -> Result<String, SecretsError> {
        let path = match &self.source {
            Source::File(path) => path.clone(),
            Source::Value => return Err(SecretsError::NotAFile(KEY_SETTING)),
            Source::None => return Err(SecretsError::NoKey),
        };
        self.reread()?;
        let line = keyring::generate_line(self.ring().key_ids());
        let io = |error| KeyringError::Io {
            path: path.display().to_string(),
            error,
        };
        let existing = std::fs::read(&path).map_err(io)?;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io)?;
        let mut text = Zeroizing::new(String::new());
        if !existing.is_empty() && !existing.ends_with(b"\n") {
            text.push('\n');
        }
        text.push_str(&line);
        text.push('\n');
        // One write of one short line: appended whole (O_APPEND).
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        self.reread()?;
        let id = line.split(' ').next().unwrap_or_default().to_string();
        tracing::info!(key_file = %path.display(), key_id = %id, "generated a new current secrets key");
        Ok(id)
    }
}

fn read_file(path: &Path) -> Result<Keyring, KeyringError> {
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|error| KeyringError::Io {
            path: path.display().to_string(),
            error,
        })?,
    );
    Keyring::parse(&text, &path.display().to_string())
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                key_file = %path.display(),
                mode = format!("{mode:o}"),
                "the secrets key file may be read by other users: chmod 600 it"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// Create the key file `path` with one generated key, mode 0600: written
/// to a file of its own beside it, synced, then hard-linked into place
/// (which fails rather than overwrite), so `path` never exists half
/// written. Returns false when another process created it first.
fn create_key_file(path: &Path) -> Result<bool, KeyringError> {
    let io = |error| KeyringError::Io {
        path: path.display().to_string(),
        error,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let aside = path.with_extension(format!("tmp-{}", hex::encode(rand::random::<[u8; 6]>())));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = (|| {
        let mut file = options.open(&aside)?;
        let line = keyring::generate_line(&[]);
        let text = Zeroizing::new(format!(
            "# outboxd secrets key file: one key per line, `KEY-ID BASE64-32-BYTES`.\n\
             # The last line is the current key (it seals); earlier ones only open.\n\
             # Remove a key only after `outboxd secrets rotate-key` reported none under it.\n\
             {}\n",
            *line
        ));
        file.write_all(text.as_bytes())?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&aside);
        return Err(io(e));
    }
    let linked = std::fs::hard_link(&aside, path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                if let Ok(d) = std::fs::File::open(dir) {
                    let _ = d.sync_all();
                }
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_by_key_name_or_a_password_in_a_url() {
        for key in [
            "secret",
            "client_secret",
            "DB.Password",
            "api-key",
            "apiKey",
            "auth-token",
            "credentials",
            "private_key",
            "authorization",
        ] {
            assert!(is_credential(key, "x"), "{key}");
        }
        for key in ["url", "payload", "exchange", "author"] {
            assert!(!is_credential(key, "https://example.com/x"), "{key}");
        }
        assert!(is_credential("url", "amqp://guest:guest@broker:5672/%2f"));
        assert!(!is_credential("url", "amqp://guest@broker:5672/%2f"));
    }

    #[test]
    fn the_data_folder_key_file_is_generated_once_owner_only_and_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let a = Secrets::in_data_dir(dir.path()).unwrap();
        let path = dir.path().join(DEFAULT_KEY_FILE);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let first = a.current_key_id().unwrap();
        let sealed = a.seal("d", "s").unwrap();
        // A second start reads the same file.
        let b = Secrets::in_data_dir(dir.path()).unwrap();
        assert_eq!(b.current_key_id().unwrap(), first);
        assert_eq!(*b.open("d", &sealed).unwrap(), "s");
        // A generated key becomes current; the old one still opens; the
        // other process picks it up on its next unknown key id.
        let second = a.generate_key().unwrap();
        assert_ne!(second, first);
        assert_eq!(a.current_key_id().unwrap(), second);
        let resealed = a.seal("d", "s").unwrap();
        assert_eq!(key_id_of(&resealed), Some(second.as_str()));
        assert_eq!(*b.open("d", &resealed).unwrap(), "s");
        assert_eq!(b.current_key_id().unwrap(), second);
        assert_eq!(*a.open("d", &sealed).unwrap(), "s");
        assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("tmp-")));
    }

    #[test]
    fn without_a_key_nothing_seals_and_plain_values_open() {
        let none = Secrets::none();
        assert!(!none.has_key());
        assert_eq!(none.seal("d", "s").unwrap_err(), SealError::NoKey);
        assert_eq!(*none.open("d", "plain").unwrap(), "plain");
        assert!(matches!(none.generate_key(), Err(SecretsError::NoKey)));
        let value = Secrets::from_value(&keyring::generate_line(&[])).unwrap();
        assert!(matches!(
            value.generate_key(),
            Err(SecretsError::NotAFile(_))
        ));
    }
}
