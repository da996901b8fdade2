//! The configuration a sink's `init` accepted, kept for the instance's one
//! `deliver` call (the host instantiates a sink afresh for each batch and
//! calls `init` first).
//!
//! Must never: deliver with a configuration `init` refused; before a
//! successful `init` every event answers `retry`.

use std::sync::{Mutex, PoisonError};

use crate::{log, outcome, Event, Level, Outcome};

/// A slot for the parsed configuration, meant for a `static`.
#[derive(Debug)]
pub struct Configured<C> {
    slot: Mutex<Option<C>>,
}

impl<C> Configured<C> {
    pub const fn new() -> Configured<C> {
        Configured {
            slot: Mutex::new(None),
        }
    }

    /// Parses `config` with `parse` and keeps it; `Err` is `parse`'s, for
    /// `init` to return.
    pub fn init(
        &self,
        config: &[(String, String)],
        parse: impl FnOnce(&[(String, String)]) -> Result<C, String>,
    ) -> Result<(), String> {
        let parsed = parse(config)?;
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(parsed);
        Ok(())
    }

    /// `deliver(config, batch)` with the kept configuration, the outcomes
    /// summed up in a debug log line; without one, every event answers
    /// `retry` ("sink not initialised").
    pub fn deliver(
        &self,
        batch: &[Event],
        deliver: impl FnOnce(&C, &[Event]) -> Vec<Outcome>,
    ) -> Vec<Outcome> {
        let guard = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(config) = guard.as_ref() else {
            log(Level::Error, "deliver called before a successful init");
            return batch
                .iter()
                .map(|_| outcome::retry("sink not initialised"))
                .collect();
        };
        let outcomes = deliver(config, batch);
        log(Level::Debug, &outcome::summary(&outcomes));
        outcomes
    }
}

impl<C> Default for Configured<C> {
    fn default() -> Self {
        Configured::new()
    }
}
