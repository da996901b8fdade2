//! Applying a store's migrations one at a time: what sqlx's
//! `Migrator::run` does, step by step, so `outboxd migrate` can show each
//! migration as it lands (a long one — an index over a large table — is
//! then seen to be the one running).
//!
//! Owns: the order and the checks of sqlx's own run (the migration lock, a
//! dirty version, an applied migration that is missing or was changed).
//! Must never: apply a migration sqlx's run would refuse, or apply one
//! without the lock.

use std::collections::HashMap;

use sqlx::migrate::{Migrate, MigrateError, Migrator};

/// Called with each migration's name once it is applied.
pub type OnApplied<'f> = dyn FnMut(&str) + Send + 'f;

/// Apply `migrator`'s pending migrations on `conn` in version order under
/// the migration lock, calling `applied` with each one's name
/// (`VERSION_description`, as [`super::plan::pending_migrations`] names
/// it) once it is applied. Errors as sqlx's `Migrator::run`:
/// [`MigrateError::Dirty`] for a migration that failed half-way before,
/// [`MigrateError::VersionMissing`] for an applied migration this binary
/// does not know, [`MigrateError::VersionMismatch`] for one whose file
/// changed since it was applied. The lock is released on error too.
pub async fn run_each<C: Migrate + Send>(
    migrator: &Migrator,
    conn: &mut C,
    applied: &mut OnApplied<'_>,
) -> Result<(), MigrateError> {
    if migrator.locking {
        conn.lock().await?;
    }
    let result = apply_pending(migrator, conn, applied).await;
    if migrator.locking {
        let unlocked = conn.unlock().await;
        result?;
        return unlocked;
    }
    result
}

async fn apply_pending<C: Migrate + Send>(
    migrator: &Migrator,
    conn: &mut C,
    applied: &mut OnApplied<'_>,
) -> Result<(), MigrateError> {
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version));
    }
    let done: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations()
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.to_vec()))
        .collect();
    if !migrator.ignore_missing {
        if let Some(version) = done.keys().find(|v| !migrator.version_exists(**v)) {
            return Err(MigrateError::VersionMissing(*version));
        }
    }
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        match done.get(&migration.version) {
            Some(checksum) if checksum[..] != migration.checksum[..] => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => {
                conn.apply(migration).await?;
                applied(&format!(
                    "{}_{}",
                    migration.version,
                    migration.description.replace(' ', "_")
                ));
            }
        }
    }
    Ok(())
}
