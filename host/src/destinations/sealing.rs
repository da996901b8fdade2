//! Destination records sealed at rest.
//!
//! Owns: which values of a [`Destination`] are secret — `secret`,
//! `previous_secret`, and every `config` value that is a credential
//! (`crate::secrets::is_credential`: its key names one, or it is a URL
//! with a password) — and that each is stored sealed
//! (`enc:v1:<key-id>:…`, see `crate::secrets::seal`) bound to the
//! destination's name ([`context`]), so a sealed value copied into another
//! destination does not open; sealing a record before it is written
//! ([`seal_record`]); opening one where its plugin's configuration is built
//! ([`Destination::plugin_config`]) or where an admin action compares it
//! ([`open_record`]); sealing every plain value at start and re-sealing
//! every value under the current key on `rotate-key` ([`reseal_all`]:
//! each record re-put revision-checked, retried when changed meanwhile);
//! counting the sealed values under each key id ([`census`]).
//!
//! A destination's records stay sealed in memory (the live snapshot holds
//! them as stored): a plaintext exists only in the configuration handed to
//! its plugin, and in the admin action that is writing it.
//!
//! Must never: write a record with a plain secret when a key is
//! configured; show a secret value (sealed or plain) in a view; stop
//! routing to a destination whose values cannot be opened (routing needs
//! no secret).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Destination;
use crate::secrets::{self, is_credential, is_sealed, SealError, Secrets};
use crate::store::{PutMode, Store, StoreError};

/// How many times [`reseal_all`] re-reads and re-seals a record that was
/// changed between its read and its write before reporting it failed.
pub const RESEAL_ATTEMPTS: u32 = 10;

/// The associated data a value of destination `name` is sealed with.
pub fn context(name: &str) -> String {
    format!("destination:{name}")
}

/// A value of a destination that could not be sealed or opened.
#[derive(Debug, Clone, thiserror::Error)]
#[error("destination {destination:?}, {field}: {source}")]
pub struct SealingError {
    /// The destination.
    pub destination: String,
    /// The value, as the API names it (`secret`, `previous_secret`,
    /// `config.password`).
    pub field: String,
    /// Why.
    pub source: SealError,
}

impl SealingError {
    /// The key id the value is sealed under, when that key is missing.
    pub fn missing_key(&self) -> Option<&str> {
        match &self.source {
            SealError::UnknownKey { key_id } => Some(key_id),
            _ => None,
        }
    }
}

impl Destination {
    /// Every secret value of the record, named as the API names it.
    fn secret_values_mut(&mut self) -> Vec<(String, &mut String)> {
        let mut out = Vec::new();
        if let Some(s) = self.secret.as_mut() {
            out.push(("secret".to_string(), s));
        }
        if let Some(s) = self.previous_secret.as_mut() {
            out.push(("previous_secret".to_string(), s));
        }
        for (key, value) in self.config.iter_mut() {
            if is_sealed(value) || is_credential(key, value) {
                out.push((format!("config.{key}"), value));
            }
        }
        out
    }

    /// Every secret value of the record, named as the API names it.
    pub fn secret_values(&self) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        if let Some(s) = &self.secret {
            out.push(("secret".to_string(), s.as_str()));
        }
        if let Some(s) = &self.previous_secret {
            out.push(("previous_secret".to_string(), s.as_str()));
        }
        for (key, value) in &self.config {
            if is_sealed(value) || is_credential(key, value) {
                out.push((format!("config.{key}"), value.as_str()));
            }
        }
        out
    }

    /// The configuration its plugin's `init` gets on top of the manifest's
    /// at Unix ms `now_ms`: its `config`, `secret`, and `previous-secret`
    /// while the rotation grace period lasts — each sealed value opened
    /// with `secrets` (plain ones, written before sealing or without a
    /// key, as they are). The one place a destination's plaintext secrets
    /// are made.
    ///
    /// Errors: a value sealed under a key id the keyring does not hold
    /// (after reloading it from its file once), or one that does not
    /// open — naming the destination, the field and the key id.
    pub fn plugin_config(
        &self,
        now_ms: i64,
        secrets: &Secrets,
    ) -> Result<BTreeMap<String, String>, SealingError> {
        let ctx = context(&self.name);
        let open = |field: &str, value: &str| {
            secrets
                .open(&ctx, value)
                .map(|plain| plain.to_string())
                .map_err(|source| SealingError {
                    destination: self.name.clone(),
                    field: field.to_string(),
                    source,
                })
        };
        let mut config = BTreeMap::new();
        for (key, value) in &self.config {
            let value = if is_sealed(value) {
                open(&format!("config.{key}"), value)?
            } else {
                value.clone()
            };
            config.insert(key.clone(), value);
        }
        if let Some(secret) = &self.secret {
            config.insert("secret".into(), open("secret", secret)?);
        }
        if self.in_grace(now_ms) {
            if let Some(previous) = &self.previous_secret {
                config.insert("previous-secret".into(), open("previous_secret", previous)?);
            }
        }
        Ok(config)
    }

    /// Whether the previous secret still signs at Unix ms `now_ms`.
    pub fn in_grace(&self, now_ms: i64) -> bool {
        self.previous_secret.is_some() && self.previous_until_ms.is_some_and(|u| now_ms < u)
    }
}

/// `d` with every plain secret value sealed under the current key (sealed
/// ones are kept as they are).
///
/// Errors: a secret value and no key ([`SealError::NoKey`]), naming it.
pub fn seal_record(d: &Destination, secrets: &Secrets) -> Result<Destination, SealingError> {
    let mut sealed = d.clone();
    let ctx = context(&d.name);
    for (field, value) in sealed.secret_values_mut() {
        if !is_sealed(value) {
            *value = secrets.seal(&ctx, value).map_err(|source| SealingError {
                destination: d.name.clone(),
                field,
                source,
            })?;
        }
    }
    Ok(sealed)
}

/// `d` with every sealed value opened: what an admin action compares a
/// request with. Never stored, never shown.
pub fn open_record(d: &Destination, secrets: &Secrets) -> Result<Destination, SealingError> {
    let mut open = d.clone();
    let ctx = context(&d.name);
    for (field, value) in open.secret_values_mut() {
        if is_sealed(value) {
            *value = secrets
                .open(&ctx, value)
                .map_err(|source| SealingError {
                    destination: d.name.clone(),
                    field,
                    source,
                })?
                .to_string();
        }
    }
    Ok(open)
}

/// What [`reseal_all`] did, counted in values (a destination holds up to
/// a secret, a previous secret and its credential config values).
#[derive(Debug, Default, Clone, Serialize)]
pub struct Resealed {
    /// The key everything is sealed under now.
    pub key_id: Option<String>,
    /// Values sealed afresh under it: plain ones, and (on rotation) those
    /// under an older key.
    pub resealed: u64,
    /// Values already under it, left alone.
    pub already_current: u64,
    /// Destinations that could not be resealed, with why (a value under a
    /// key the keyring does not hold; a record changed
    /// [`RESEAL_ATTEMPTS`] times in a row).
    pub failed: Vec<FailedRecord>,
}

/// A destination [`reseal_all`] could not reseal.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct FailedRecord {
    /// Its name.
    pub destination: String,
    /// Why.
    pub error: String,
}

/// Seal every plain secret value of every stored destination under the
/// current key and, when `rotate`, re-seal every value sealed under an
/// older key too. Each changed record is re-put only if its revision is
/// the one read; a record changed meanwhile is read and resealed again
/// (at most [`RESEAL_ATTEMPTS`] times). Running it again changes nothing.
///
/// Errors: the store; a record that cannot be resealed is reported in
/// [`Resealed::failed`] and left as it was.
pub async fn reseal_all(
    store: &dyn Store,
    secrets: &Secrets,
    rotate: bool,
) -> Result<Resealed, StoreError> {
    let mut report = Resealed {
        key_id: secrets.current_key_id(),
        ..Default::default()
    };
    if !secrets.has_key() {
        return Ok(report);
    }
    for row in store.destinations().await? {
        let name = row.name.clone();
        let mut row = Some(row);
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let current = match row.take() {
                Some(r) => r,
                None => match store
                    .destinations()
                    .await?
                    .into_iter()
                    .find(|r| r.name == name)
                {
                    Some(r) => r,
                    None => break Ok((0, 0)), // deleted meanwhile
                },
            };
            let d: Destination = match serde_json::from_str(&current.record) {
                Ok(d) => d,
                Err(e) => break Err(format!("unreadable record: {e}")),
            };
            let (next, resealed, kept) = match reseal_record(&d, secrets, rotate) {
                Ok(x) => x,
                Err(e) => break Err(e.to_string()),
            };
            if resealed == 0 {
                break Ok((0, kept));
            }
            let text =
                serde_json::to_string(&next).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if store
                .put_destination(
                    &name,
                    &next.sink,
                    &text,
                    PutMode::Revision(current.revision),
                )
                .await?
                .is_some()
            {
                break Ok((resealed, kept));
            }
            if attempts >= RESEAL_ATTEMPTS {
                break Err(format!(
                    "changed {RESEAL_ATTEMPTS} times while being resealed; run rotate-key again"
                ));
            }
        };
        match outcome {
            Ok((resealed, kept)) => {
                report.resealed += resealed;
                report.already_current += kept;
            }
            Err(error) => report.failed.push(FailedRecord {
                destination: name,
                error,
            }),
        }
    }
    Ok(report)
}

/// `d` with its plain values sealed and (when `rotate`) its values under
/// older keys resealed under the current one; how many values changed and
/// how many were already under the current key.
fn reseal_record(
    d: &Destination,
    secrets: &Secrets,
    rotate: bool,
) -> Result<(Destination, u64, u64), SealingError> {
    let current = secrets.current_key_id();
    let ctx = context(&d.name);
    let mut next = d.clone();
    let (mut resealed, mut kept) = (0, 0);
    for (field, value) in next.secret_values_mut() {
        let under = secrets::key_id_of(value).map(str::to_string);
        let err = |source| SealingError {
            destination: d.name.clone(),
            field: field.clone(),
            source,
        };
        if is_sealed(value) && (under == current || !rotate) {
            kept += u64::from(under == current);
            continue;
        }
        let plain = secrets.open(&ctx, value).map_err(err)?;
        *value = secrets.seal(&ctx, &plain).map_err(err)?;
        resealed += 1;
    }
    Ok((next, resealed, kept))
}

/// How many secret values are stored under each key id, and how many in
/// the clear.
#[derive(Debug, Default, Clone, Serialize, serde::Deserialize)]
pub struct Census {
    /// Sealed values by the key id they are under.
    pub by_key: BTreeMap<String, u64>,
    /// Values stored in the clear.
    pub plain: u64,
    /// Destinations whose records do not parse (not counted).
    pub unreadable: u64,
}

/// Count the secret values of every stored destination by key id.
pub async fn census(store: &dyn Store) -> Result<Census, StoreError> {
    let mut census = Census::default();
    for row in store.destinations().await? {
        let Ok(d) = serde_json::from_str::<Destination>(&row.record) else {
            census.unreadable += 1;
            continue;
        };
        for (_, value) in d.secret_values() {
            match secrets::key_id_of(value) {
                Some(id) => *census.by_key.entry(id.to_string()).or_default() += 1,
                None if is_sealed(value) => {
                    *census.by_key.entry("(malformed)".into()).or_default() += 1
                }
                None => census.plain += 1,
            }
        }
    }
    Ok(census)
}

/// At start: seal every plain secret when there is a key (a database
/// written before sealing, or on PostgreSQL before a key was configured),
/// and say what is still open to reading: plain values without a key (a
/// warning naming the setting), values under key ids the keyring lacks.
pub async fn at_start(store: &dyn Store, secrets: &Secrets) -> Result<(), StoreError> {
    let before = census(store).await?;
    if before.plain > 0 && !secrets.has_key() {
        tracing::warn!(
            plain = before.plain,
            "destination secrets are stored in the clear and no secrets key is configured: set {} or {}; they are sealed at the first start with a key (until then delivery goes on, and new secrets are refused)",
            secrets::KEY_FILE_SETTING,
            secrets::KEY_SETTING,
        );
    }
    if before.plain > 0 && secrets.has_key() {
        let done = reseal_all(store, secrets, false).await?;
        tracing::info!(
            sealed = done.resealed,
            key_id = ?done.key_id,
            failed = done.failed.len(),
            "sealed the destination secrets stored in the clear"
        );
        for f in &done.failed {
            tracing::warn!(destination = %f.destination, "not sealed: {}", f.error);
        }
    }
    let ring = secrets.ring();
    let missing: Vec<&String> = before.by_key.keys().filter(|id| !ring.has(id)).collect();
    if !missing.is_empty() {
        tracing::error!(
            key_ids = ?missing,
            key_source = %secrets.source(),
            "destination secrets are sealed under keys the keyring does not hold: their destinations wait (nothing is lost) until the key is added"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> std::sync::Arc<Secrets> {
        Secrets::from_value(&crate::secrets::keyring::generate_line(&[])).unwrap()
    }

    fn destination(name: &str) -> Destination {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "sink": "webhook",
            "config": {
                "url": "https://hooks.example/in",
                "broker": "amqp://app:hunter2@mq.example/%2f",
                "api_token": "tok_live_123",
                "payload": "awareness",
            },
            "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "previous_secret": "whsec_b2xkc2VjcmV0",
            "previous_until_ms": i64::MAX,
        }))
        .unwrap()
    }

    #[test]
    fn every_credential_is_sealed_and_opens_only_for_its_destination() {
        let secrets = secrets();
        let plain = destination("a");
        let sealed = seal_record(&plain, &secrets).unwrap();
        let text = serde_json::to_string(&sealed).unwrap();
        for needle in ["MfKQ9r8G", "b2xkc2Vj", "hunter2", "tok_live"] {
            assert!(!text.contains(needle), "{needle} in {text}");
        }
        assert_eq!(sealed.config["url"], "https://hooks.example/in");
        assert_eq!(sealed.config["payload"], "awareness");
        let fields: Vec<String> = sealed.secret_values().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "secret",
                "previous_secret",
                "config.api_token",
                "config.broker"
            ]
        );
        // Sealing again keeps what is sealed.
        assert_eq!(seal_record(&sealed, &secrets).unwrap(), sealed);
        assert_eq!(open_record(&sealed, &secrets).unwrap(), plain);
        let config = sealed.plugin_config(0, &secrets).unwrap();
        assert_eq!(config["secret"], "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert_eq!(config["previous-secret"], "whsec_b2xkc2VjcmV0");
        assert_eq!(config["broker"], "amqp://app:hunter2@mq.example/%2f");
        // Moved into another destination's record: refused, named.
        let mut moved = destination("b");
        moved.secret = sealed.secret.clone();
        let e = moved.plugin_config(0, &secrets).unwrap_err();
        assert_eq!((e.destination.as_str(), e.field.as_str()), ("b", "secret"));
        assert!(matches!(e.source, SealError::Rejected { .. }), "{e}");
    }

    #[test]
    fn views_show_no_value_sealed_or_plain() {
        let secrets = secrets();
        for d in [
            destination("a"),
            seal_record(&destination("a"), &secrets).unwrap(),
        ] {
            let shown = serde_json::to_string(&d.redacted()).unwrap();
            for needle in ["whsec_", "hunter2", "tok_live", "enc:"] {
                assert!(!shown.contains(needle), "{needle} in {shown}");
            }
            assert!(shown.contains("\"has_secret\":true"), "{shown}");
            assert!(shown.contains("\"api_token\":\"***\""), "{shown}");
        }
    }

    #[test]
    fn without_a_key_a_secret_is_refused_and_a_record_without_one_is_not() {
        let none = Secrets::none();
        let e = seal_record(&destination("a"), &none).unwrap_err();
        assert_eq!((e.field.as_str(), &e.source), ("secret", &SealError::NoKey));
        let mut bare = destination("a");
        bare.secret = None;
        bare.previous_secret = None;
        bare.config.retain(|k, _| k == "url");
        assert_eq!(seal_record(&bare, &none).unwrap(), bare);
        // Plain records (written before sealing) still open as they are.
        assert_eq!(
            destination("a").plugin_config(0, &none).unwrap()["secret"],
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        );
    }
}
