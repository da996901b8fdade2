//! Plugin manifests: the TOML file beside each component.
//!
//! Owns: the manifest's shape and defaults, `${VAR}` / `${VAR:-default}`
//! references to the host's environment, and the check that a manifest
//! targets a WIT version this host speaks.
//!
//! Must never: log or echo a configuration value (they may be secrets); let
//! an unknown key pass (it is an error naming the key).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Kept at this path for the settings that name it here.
pub use crate::interpolate::interpolate;
use crate::interpolate::{interpolate_checked, Interpolation};

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "outboxd:sink";
/// Its version. Manifests must target the same major version (for 0.x: the
/// same minor), per semver.
pub const WIT_VERSION: (u64, u64, u64) = (0, 1, 5);

/// A parsed, resolved manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Manifest {
    /// Sink name: what routes and the store call this sink. Lower-case
    /// letters, digits, `-` and `_`.
    pub name: String,
    /// The plugin's own version, for logs.
    pub version: String,
    /// Component file, relative to the manifest. Default `<name>.wasm`.
    /// Absent for a [`Builtin`] sink.
    pub component: Option<PathBuf>,
    /// A sink built into the host instead of a component (no `component`,
    /// `capabilities` or `config` then).
    #[serde(default)]
    pub builtin: Option<Builtin>,
    /// WIT package the component targets, e.g. `outboxd:sink@0.1.0`.
    pub wit: String,
    #[serde(default)]
    /// Deadline, fuel, memory and batch caps.
    pub limits: Limits,
    #[serde(default)]
    /// What the plugin may reach (hosts, exchanges).
    pub capabilities: Capabilities,
    /// Handed to the plugin's `init`. Values may reference the host's
    /// environment; never logged.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    #[serde(default)]
    /// Retry schedule, window and what a dead letter does to its stream.
    pub retry: RetryPolicy,
    /// Chained sink: this sink takes an event only after the same event was
    /// delivered to the sink named here (e.g. mark a document published
    /// only after the broker confirmed it). Events with no delivery to that
    /// sink are not held back.
    #[serde(default)]
    pub after: Option<String>,
    /// The manifest file this was read from (set by [`Manifest::parse`]).
    #[serde(skip)]
    pub file: PathBuf,
}

/// Sinks built into the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Builtin {
    /// Acknowledges every event without sending it anywhere: to drain a
    /// sink's backlog on purpose, or to measure outboxd without any sink's
    /// cost (the benchmark's native sink). Its deliveries end `delivered`.
    Discard,
}

/// Resource limits of one batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Limits {
    /// Linear memory cap per instance, MiB. Default 64.
    pub memory_mib: u64,
    /// Wall-clock deadline for one batch (instantiate, `init`, `deliver`).
    /// Default 30 s.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Most events per batch. Default 100.
    pub max_batch: u32,
    /// Most bytes of event data per batch (the first event of a batch goes
    /// out whatever its size). Default: [`DEFAULT_BATCH_BYTES_SHARE`] of
    /// `memory-mib` (8 MiB of the default 64 MiB), since a guest holds the
    /// whole batch in its memory, usually with a copy or two of its own.
    pub max_batch_bytes: Option<u64>,
    /// Most outbound HTTP requests one batch may send; past it a request
    /// is refused (`HTTP-request-denied`) without leaving the host.
    /// Default 1000 (ten per event of a full default batch).
    pub max_requests: u32,
    /// Most bytes of one HTTP response body the plugin may read; past it
    /// the body read fails with `HTTP-response-body-size`. Default 1 MiB.
    pub max_response_bytes: u64,
    /// Longest an HTTP request waits for the first byte of its response,
    /// counted from when the plugin hands it to the host (connecting and
    /// sending included). A plugin may ask for less through `wasi:http`'s
    /// `request-options`, never more. Past it the request fails with
    /// `HTTP-response-timeout`. Default 30 s
    /// ([`crate::limits::FIRST_BYTE_TIMEOUT`]).
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Longest silence between two bytes of a response once it has begun,
    /// in its head or its body. A plugin may ask for less, never more. Past
    /// it the request (or the body read) fails with
    /// `connection-read-timeout`. Default 10 s
    /// ([`crate::limits::BETWEEN_BYTES_TIMEOUT`]).
    ///
    /// Whatever the two timeouts, a response not complete shortly before
    /// the batch deadline ([`crate::limits::DEADLINE_MARGIN`] before it)
    /// fails with `HTTP-response-incomplete`, so a receiver that trickles
    /// its answer costs its own stream a retry, not the whole batch.
    #[serde(with = "humantime_serde")]
    pub between_bytes_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mib: 64,
            deadline: crate::limits::DEFAULT_BATCH_DEADLINE,
            max_batch: 100,
            max_batch_bytes: None,
            max_requests: 1000,
            max_response_bytes: 1 << 20,
            first_byte_timeout: crate::limits::FIRST_BYTE_TIMEOUT,
            between_bytes_timeout: crate::limits::BETWEEN_BYTES_TIMEOUT,
        }
    }
}

/// The default batch byte budget, as a fraction 1/N of the memory cap.
pub const DEFAULT_BATCH_BYTES_SHARE: u64 = 8;

impl Limits {
    /// Refuse values no batch could run with; the message names the key.
    fn check(&self) -> Result<(), String> {
        if self.memory_mib == 0 || self.memory_mib > 4096 {
            return Err("limits.memory-mib: must be between 1 and 4096".into());
        }
        let positive = [
            ("deadline", self.deadline),
            ("first-byte-timeout", self.first_byte_timeout),
            ("between-bytes-timeout", self.between_bytes_timeout),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(format!("limits.{key}: must be greater than 0s"));
        }
        let at_least_one = [
            ("max-batch", u64::from(self.max_batch)),
            ("max-batch-bytes", self.max_batch_bytes.unwrap_or(1)),
            ("max-requests", u64::from(self.max_requests)),
            ("max-response-bytes", self.max_response_bytes),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, n)| *n == 0) {
            return Err(format!("limits.{key}: must be at least 1"));
        }
        Ok(())
    }

    /// The batch byte budget: `max-batch-bytes`, else 1/[`DEFAULT_BATCH_BYTES_SHARE`]
    /// of the memory cap.
    pub fn batch_bytes(&self) -> u64 {
        self.max_batch_bytes
            .unwrap_or((self.memory_mib << 20) / DEFAULT_BATCH_BYTES_SHARE)
    }
}

/// What the plugin may reach.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Capabilities {
    /// Outbound HTTP allow-list: `scheme://host[:port]` patterns; `*.` before
    /// a host matches its subdomains, `*` as host or port matches any.
    /// Empty: `wasi:http` is not linked at all.
    #[serde(default)]
    pub http: Vec<String>,
    /// AMQP publishing (the `outboxd:sink/amqp` interface): one broker and
    /// the exchanges the plugin may publish to. Absent: every publish is
    /// refused as `not-allowed` without touching a broker.
    #[serde(default)]
    pub amqp: Option<AmqpCapability>,
}

/// `capabilities.amqp = { url = "amqp://…", exchanges = ["documents", "events.*"] }`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AmqpCapability {
    /// Broker URL, `amqp://user:password@host:port/vhost` or `amqps://…`
    /// (the vhost percent-encoded: `%2f` is `/`). Usually a `${VAR}`
    /// reference, since it carries a password; never logged with it.
    pub url: String,
    /// Exchange names the plugin may publish to; `*` matches any run of
    /// characters (`events.*`, `*`). `""` names the default exchange.
    pub exchanges: Vec<String>,
}

impl std::fmt::Debug for AmqpCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpCapability")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("exchanges", &self.exchanges)
            .finish()
    }
}

/// Retry schedule of this sink: exponential backoff with jitter, inside a
/// retry window counted from the first attempt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Growth per attempt. Default 2.
    pub factor: f64,
    /// Longest delay. Default 10 min.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// How long after the first attempt retries may go on before the
    /// delivery is dead-lettered. Default 24 h.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// What a dead letter does to the rest of its stream for this sink.
    /// Default [`OnDead::MoveOn`].
    pub on_dead: OnDead,
}

/// What happens behind a dead-lettered delivery (manifest `retry.on-dead`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnDead {
    /// The stream's next event becomes due: order holds among the events
    /// delivered, with a gap where the dead letter is. For sinks whose
    /// events stand alone (notifications, webhooks).
    #[default]
    MoveOn,
    /// Nothing later in the stream is delivered to this sink until the
    /// dead letter is replayed (it then goes first) or purged (the stream
    /// then moves on). For sinks that apply events as a sequence of
    /// changes, where skipping one corrupts the target.
    Block,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: crate::limits::DEFAULT_RETRY_BASE,
            factor: 2.0,
            cap: crate::limits::DEFAULT_RETRY_CAP,
            window: crate::limits::DEFAULT_RETRY_WINDOW,
            on_dead: OnDead::MoveOn,
        }
    }
}

/// Why a manifest was refused. Messages name the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: cannot read: {source}")]
    /// The manifest could not be read.
    Read {
        /// The manifest.
        file: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    /// The manifest is not valid (the message names the key).
    Invalid {
        /// The manifest.
        file: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
}

impl Manifest {
    /// Read, parse, resolve environment references and check a manifest.
    pub fn load(file: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(file).map_err(|source| ManifestError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Manifest::parse(&text, file)
    }

    /// As [`Manifest::load`], from text; `file` is used in messages and to
    /// resolve the component path.
    pub fn parse(text: &str, file: &Path) -> Result<Manifest, ManifestError> {
        Manifest::parse_with(text, file, None)
    }

    /// As [`Manifest::load`], but a `${VAR}` the host environment does not
    /// set is not an error: each one is listed (the key and the variable),
    /// and its value is left empty in `config` or replaced by a placeholder
    /// on the reserved `.invalid` domain (RFC 6761 §6.4) in a capability, so
    /// the manifest's grants keep their shape. For `outboxd plugin check`,
    /// which judges the component apart from what the daemon's environment
    /// will supply; the daemon itself uses [`Manifest::load`].
    pub fn load_unresolved(file: &Path) -> Result<(Manifest, Vec<Unresolved>), ManifestError> {
        let text = std::fs::read_to_string(file).map_err(|source| ManifestError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        let mut unresolved = Vec::new();
        let manifest = Manifest::parse_with(&text, file, Some(&mut unresolved))?;
        Ok((manifest, unresolved))
    }

    fn parse_with(
        text: &str,
        file: &Path,
        unresolved: Option<&mut Vec<Unresolved>>,
    ) -> Result<Manifest, ManifestError> {
        let invalid = |message: String| ManifestError::Invalid {
            file: file.to_path_buf(),
            message,
        };
        let mut m: Manifest =
            toml::from_str(text).map_err(|e| invalid(e.to_string().trim().to_string()))?;
        m.check_values().map_err(invalid)?;
        m.resolve_references(unresolved).map_err(invalid)?;
        if m.builtin.is_some() {
            m.check_builtin().map_err(invalid)?;
        } else {
            let component = m
                .component
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{}.wasm", m.name)));
            let base = file.parent().unwrap_or(Path::new("."));
            m.component = Some(base.join(component));
        }
        m.file = file.to_path_buf();
        Ok(m)
    }

    /// Refuse a name, WIT version, limit or retry factor no sink could run
    /// with; the message names the key.
    fn check_values(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(format!(
                "name {:?}: use lower-case letters, digits, '-' and '_'",
                self.name
            ));
        }
        check_wit(&self.wit)?;
        self.limits.check()?;
        if self.retry.factor < 1.0 || !self.retry.factor.is_finite() {
            return Err("retry.factor: must be at least 1".into());
        }
        Ok(())
    }

    /// Replace the `${VAR}` references of `config` and the capabilities.
    /// With `unresolved`, an unset variable is listed there and replaced by
    /// a placeholder (see [`Manifest::load_unresolved`]); without, it is an
    /// error naming the key.
    fn resolve_references(
        &mut self,
        mut unresolved: Option<&mut Vec<Unresolved>>,
    ) -> Result<(), String> {
        let mut resolve = |key: String, value: &str, placeholder: &str| match (
            interpolate_checked(value),
            unresolved.as_deref_mut(),
        ) {
            (Ok(v), _) => Ok(v),
            (Err(Interpolation::Unset(var)), Some(list)) => {
                list.push(Unresolved { key, var });
                Ok(placeholder.to_string())
            }
            (Err(e), _) => Err(format!("{key}: {e}")),
        };
        for (key, value) in self.config.iter_mut() {
            *value = resolve(format!("config.{key}"), value, "")?;
        }
        for (i, pattern) in self.capabilities.http.iter_mut().enumerate() {
            *pattern = resolve(
                format!("capabilities.http[{i}]"),
                pattern,
                "https://unresolved.invalid",
            )?;
        }
        if let Some(amqp) = &mut self.capabilities.amqp {
            amqp.url = resolve(
                "capabilities.amqp.url".into(),
                &amqp.url,
                "amqp://unresolved.invalid/%2f",
            )?;
            for (i, pattern) in amqp.exchanges.iter_mut().enumerate() {
                *pattern = resolve(
                    format!("capabilities.amqp.exchanges[{i}]"),
                    pattern,
                    "unresolved",
                )?;
            }
        }
        Ok(())
    }

    /// A [`Builtin`] sink has no component, capabilities or config.
    fn check_builtin(&self) -> Result<(), String> {
        let given = [
            (self.component.is_some(), "component"),
            (
                !self.capabilities.http.is_empty() || self.capabilities.amqp.is_some(),
                "capabilities",
            ),
            (!self.config.is_empty(), "config"),
        ];
        match given.iter().find(|(present, _)| *present) {
            Some((_, key)) => Err(format!("{key}: a builtin sink has none")),
            None => Ok(()),
        }
    }

    /// Path of the component file; `None` for a [`Builtin`] sink.
    pub fn component_path(&self) -> Option<&Path> {
        self.component.as_deref()
    }
}

/// Check `outboxd:sink@X.Y.Z` against [`WIT_VERSION`].
fn check_wit(wit: &str) -> Result<(), String> {
    let Some((package, version)) = wit.split_once('@') else {
        return Err(format!("wit {wit:?}: expected \"{WIT_PACKAGE}@<version>\""));
    };
    if package != WIT_PACKAGE {
        return Err(format!(
            "wit {wit:?}: this host implements {WIT_PACKAGE}, not {package}"
        ));
    }
    let parts: Vec<u64> = version
        .split('.')
        .map(|p| p.parse().unwrap_or(u64::MAX))
        .collect();
    let (major, minor) = (
        parts.first().copied().unwrap_or(u64::MAX),
        parts.get(1).copied().unwrap_or(u64::MAX),
    );
    let (hmaj, hmin, _) = WIT_VERSION;
    let compatible = major == hmaj && (hmaj != 0 || minor == hmin);
    if !compatible {
        return Err(format!(
            "wit {wit:?}: incompatible with this host's {WIT_PACKAGE}@{hmaj}.{hmin}.x"
        ));
    }
    Ok(())
}

/// A `${VAR}` reference in a manifest that the host environment leaves
/// unset (and that has no `:-default`), as [`Manifest::load_unresolved`]
/// lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The manifest key holding the reference, e.g. `config.secret`.
    pub key: String,
    /// The environment variable, e.g. `OUTBOXD_WEBHOOK_SECRET`.
    pub var: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "name = \"s\"\nversion = \"1\"\nwit = \"outboxd:sink@0.1.0\"\n";

    #[test]
    fn unknown_key_is_named() {
        let e =
            Manifest::parse(&format!("{MINIMAL}colour = 1\n"), Path::new("s.toml")).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = Manifest::parse(
            &format!("{MINIMAL}[limits]\nmemory = 1\n"),
            Path::new("s.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn a_builtin_sink_has_no_component_capabilities_or_config() {
        let text = format!("{MINIMAL}builtin = \"discard\"\n");
        let m = Manifest::parse(&text, Path::new("s.toml")).unwrap();
        assert_eq!(m.builtin, Some(Builtin::Discard));
        assert_eq!(m.component_path(), None);
        for extra in [
            "component = \"s.wasm\"\n",
            "[capabilities]\nhttp = [\"https://example.com\"]\n",
            "[config]\nurl = \"x\"\n",
        ] {
            let e = Manifest::parse(&format!("{text}{extra}"), Path::new("s.toml")).unwrap_err();
            assert!(e.to_string().contains("a builtin sink has none"), "{e}");
        }
        let e = Manifest::parse(
            &format!("{MINIMAL}builtin = \"echo\"\n"),
            Path::new("s.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("discard"), "{e}");
    }

    #[test]
    fn wit_major_version_checked() {
        let text = MINIMAL.replace("0.1.0", "0.2.0");
        let e = Manifest::parse(&text, Path::new("s.toml")).unwrap_err();
        assert!(e.to_string().contains("incompatible"), "{e}");
        assert!(Manifest::parse(&MINIMAL.replace("0.1.0", "0.1.7"), Path::new("s.toml")).is_ok());
    }

    #[test]
    fn amqp_capability_resolves_the_environment_and_hides_the_password() {
        std::env::set_var(
            "OUTBOXD_TEST_MANIFEST_AMQP",
            "amqp://app:s3cret@127.0.0.1:5672/%2f",
        );
        let text = format!(
            "{MINIMAL}[capabilities]\namqp = {{ url = \"${{OUTBOXD_TEST_MANIFEST_AMQP}}\", exchanges = [\"documents\", \"events.*\"] }}\n"
        );
        let m = Manifest::parse(&text, Path::new("s.toml")).unwrap();
        let amqp = m.capabilities.amqp.as_ref().unwrap();
        assert_eq!(amqp.url, "amqp://app:s3cret@127.0.0.1:5672/%2f");
        assert_eq!(amqp.exchanges, ["documents", "events.*"]);
        let shown = format!("{m:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("app:***@"),
            "{shown}"
        );
        let e = Manifest::parse(
            &format!("{MINIMAL}[capabilities]\namqp = {{ url = \"amqp://h\", queues = [] }}\n"),
            Path::new("s.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("queues"), "{e}");
    }

    #[test]
    fn environment_references() {
        std::env::set_var("OUTBOXD_TEST_MANIFEST_VAR", "v");
        assert_eq!(
            interpolate("a${OUTBOXD_TEST_MANIFEST_VAR}b").unwrap(),
            "avb"
        );
        assert_eq!(
            interpolate("${OUTBOXD_TEST_MANIFEST_UNSET:-d}").unwrap(),
            "d"
        );
        let e = interpolate("${OUTBOXD_TEST_MANIFEST_UNSET}").unwrap_err();
        assert!(e.contains("OUTBOXD_TEST_MANIFEST_UNSET"));
    }
}
