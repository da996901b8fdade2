//! Progress of a long CLI operation (a replay or purge of many dead
//! letters, migrations applied one by one, a backfill): a bar on a terminal (`indicatif`, on stderr), one plain line
//! per step when stderr is not a terminal (a pipe, a CI log), so a script
//! reading stdout sees only the result.
//!
//! Owns: drawing progress. Must never: write to stdout (the command's
//! answer is there), or decide how the work is split.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A count of `total` things being worked through, shown as it moves.
pub struct Progress {
    what: &'static str,
    total: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Start showing `what` (`"replaying dead letters"`) out of `total`.
    pub fn new(what: &'static str, total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed})")
                    .expect("a fixed template")
                    .progress_chars("=> "),
            );
            bar.set_message(what);
            bar
        });
        if bar.is_none() {
            eprintln!("{what}: 0 of {total}");
        }
        Progress { what, total, bar }
    }

    /// `done` of the total are done.
    pub fn set(&self, done: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(done),
            None => eprintln!("{}: {done} of {}", self.what, self.total),
        }
    }

    /// `done` of the total are done, the last being `label` (a
    /// migration's name): shown beside the bar, or at the end of the
    /// plain line.
    pub fn step(&self, done: u64, label: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("{} ({label})", self.what));
                bar.set_position(done);
            }
            None => eprintln!("{}: {done} of {} ({label})", self.what, self.total),
        }
    }

    /// Stop showing progress (the bar is cleared; the caller prints the
    /// result).
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Work the CLI hands over whole and waits for (a backfill, which the
/// daemon does in one request and answers with its counts): a spinner
/// with the time elapsed on a terminal, one plain line when not.
pub struct Waiting {
    bar: Option<ProgressBar>,
}

impl Waiting {
    /// Start showing that `what` (`"backfilling webhook"`) is under way.
    pub fn new(what: String) -> Waiting {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .expect("a fixed template"),
            );
            bar.set_message(what.clone());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            eprintln!("{what}: waiting for the daemon");
        }
        Waiting { bar }
    }

    /// Stop showing it (the caller prints the result).
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
