//! One builder for the set-up most tests share: a daemon in this process
//! with webhook sinks, each POSTing to a real receiver on loopback of its
//! own and signing with a secret of its own.
//!
//! ```ignore
//! let h = Harness::new().webhook("hook", "").start().await;
//! h.daemon.post_event(&event("e1", "s", "t", json!({}))).await;
//! assert!(eventually(T, || h.hook("hook").receiver.count() == 1).await);
//! ```

use outboxd::config::Config;

use super::{new_secret, PluginsDir, Receiver, TestDaemon};

/// A webhook sink of a [`Harness`]: its name, receiver and signing secret.
pub struct Hook {
    pub name: String,
    pub receiver: Receiver,
    pub secret: String,
}

/// A running daemon with its plugins folder and webhook sinks.
pub struct Harness {
    pub daemon: TestDaemon,
    pub plugins: PluginsDir,
    pub hooks: Vec<Hook>,
}

impl Harness {
    /// A builder with no sinks yet.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> HarnessBuilder {
        HarnessBuilder {
            hooks: Vec::new(),
            adjust: None,
        }
    }

    /// The daemon, the receiver of its one webhook sink, and the plugins
    /// folder (keep it: dropping it deletes the folder, and the daemon then
    /// sees its sink removed). Panics unless there is exactly one sink.
    pub fn single(mut self) -> (TestDaemon, Receiver, PluginsDir) {
        assert_eq!(
            self.hooks.len(),
            1,
            "single() needs exactly one webhook sink"
        );
        let hook = self.hooks.remove(0);
        (self.daemon, hook.receiver, self.plugins)
    }

    /// The sink named `name`. Panics when there is none (a test error).
    pub fn hook(&self, name: &str) -> &Hook {
        self.hooks
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no webhook sink {name:?} in this harness"))
    }
}

/// A webhook sink to make: name, manifest `[config]` lines added, and the
/// body of its `[limits]` (none: the harness's defaults).
type HookSpec = (String, String, Option<String>);

/// What a [`Harness`] is made of; [`HarnessBuilder::start`] makes it.
pub struct HarnessBuilder {
    hooks: Vec<HookSpec>,
    adjust: Option<Adjust>,
}

/// A change to the daemon's configuration before it starts.
type Adjust = Box<dyn FnOnce(&mut Config)>;

impl HarnessBuilder {
    /// A webhook sink `name` with its own receiver and secret; `extra` is
    /// appended to its manifest's `[config]` (see
    /// [`PluginsDir::add_webhook`]).
    pub fn webhook(mut self, name: &str, extra: &str) -> HarnessBuilder {
        self.hooks.push((name.to_string(), extra.to_string(), None));
        self
    }

    /// As [`HarnessBuilder::webhook`], with the body of its `[limits]`.
    pub fn webhook_with_limits(mut self, name: &str, limits: &str, extra: &str) -> Self {
        self.hooks.push((
            name.to_string(),
            extra.to_string(),
            Some(limits.to_string()),
        ));
        self
    }

    /// Change the daemon's configuration before it starts.
    pub fn config(mut self, adjust: impl FnOnce(&mut Config) + 'static) -> HarnessBuilder {
        self.adjust = Some(Box::new(adjust));
        self
    }

    /// Start the receivers, write the plugins folder, start the daemon.
    pub async fn start(self) -> Harness {
        let plugins = PluginsDir::new();
        let mut hooks = Vec::new();
        for (name, extra, limits) in self.hooks {
            let receiver = Receiver::start().await;
            let secret = new_secret();
            let allow = [receiver.origin()];
            match limits {
                None => plugins.add_webhook(&name, &receiver.url(), &allow, &secret, &extra),
                Some(limits) => plugins.add_webhook_with_limits(
                    &name,
                    &receiver.url(),
                    &allow,
                    &secret,
                    &limits,
                    &extra,
                ),
            }
            hooks.push(Hook {
                name,
                receiver,
                secret,
            });
        }
        let adjust = self.adjust;
        let daemon = TestDaemon::start_with(plugins.path(), move |c| {
            if let Some(adjust) = adjust {
                adjust(c)
            }
        })
        .await;
        Harness {
            daemon,
            plugins,
            hooks,
        }
    }
}
