//! One builder for the set-up most tests share: a daemon in this process
//! with webhook sinks, each POSTing to a real receiver on loopback of its
//! own and signing with a secret of its own, plus whatever else the test
//! writes into the plugins folder ([`HarnessBuilder::plugins`]: other
//! components, manifests, broken files) and its configuration
//! ([`HarnessBuilder::config`]).
//!
//! ```ignore
//! let h = Harness::new().webhook("hook", "").start().await;
//! h.daemon.post_event(&event("e1", "s", "t", json!({}))).await;
//! assert!(eventually(T, || h.hook("hook").receiver.count() == 1).await);
//! ```

use std::path::Path;

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
            writes: Vec::new(),
        }
    }

    /// The daemon, the receiver of its one webhook sink, and the plugins
    /// folder (keep it: dropping it deletes the folder, and the daemon then
    /// sees its sink removed). Panics unless there is exactly one sink.
    pub fn single(self) -> (TestDaemon, Receiver, PluginsDir) {
        let (daemon, hook, plugins) = self.single_hook();
        (daemon, hook.receiver, plugins)
    }

    /// As [`Harness::single`], with the whole sink (its signing secret
    /// too).
    pub fn single_hook(mut self) -> (TestDaemon, Hook, PluginsDir) {
        assert_eq!(
            self.hooks.len(),
            1,
            "single() needs exactly one webhook sink"
        );
        let hook = self.hooks.remove(0);
        (self.daemon, hook, self.plugins)
    }

    /// The daemon and the plugins folder, for a harness without webhook
    /// sinks (keep the folder, as for [`Harness::single`]).
    pub fn into_daemon(self) -> (TestDaemon, PluginsDir) {
        (self.daemon, self.plugins)
    }

    /// The sink named `name`. Panics when there is none (a test error).
    pub fn hook(&self, name: &str) -> &Hook {
        self.hooks
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no webhook sink {name:?} in this harness"))
    }
}

/// A webhook sink to make.
struct HookSpec {
    name: String,
    /// Lines added to its manifest's `[config]`.
    extra: String,
    /// The body of its `[limits]` (none: the harness's defaults).
    limits: Option<String>,
    /// The origins it may reach (none: its own receiver's only).
    allow: Option<Vec<String>>,
}

/// What a [`Harness`] is made of; [`HarnessBuilder::start`] makes it.
pub struct HarnessBuilder {
    hooks: Vec<HookSpec>,
    adjust: Option<Adjust>,
    writes: Vec<Write>,
}

/// A change to the daemon's configuration before it starts.
type Adjust = Box<dyn FnOnce(&mut Config)>;

/// Something written into the plugins folder before the daemon starts.
type Write = Box<dyn FnOnce(&PluginsDir)>;

impl HarnessBuilder {
    /// A webhook sink `name` with its own receiver and secret; `extra` is
    /// appended to its manifest's `[config]` (see
    /// [`PluginsDir::add_webhook`]).
    pub fn webhook(mut self, name: &str, extra: &str) -> HarnessBuilder {
        self.hooks.push(HookSpec {
            name: name.to_string(),
            extra: extra.to_string(),
            limits: None,
            allow: None,
        });
        self
    }

    /// As [`HarnessBuilder::webhook`], with the body of its `[limits]`.
    pub fn webhook_with_limits(mut self, name: &str, limits: &str, extra: &str) -> Self {
        self.hooks.push(HookSpec {
            name: name.to_string(),
            extra: extra.to_string(),
            limits: Some(limits.to_string()),
            allow: None,
        });
        self
    }

    /// As [`HarnessBuilder::webhook`] with no `extra`, allowed to reach
    /// `allow` (origins, or patterns such as `http://*:*`) in place of its
    /// own receiver.
    pub fn webhook_allowing(mut self, name: &str, allow: &[String]) -> HarnessBuilder {
        self.hooks.push(HookSpec {
            name: name.to_string(),
            extra: String::new(),
            limits: None,
            allow: Some(allow.to_vec()),
        });
        self
    }

    /// Sink `name` running the component at `component`, with `extra`
    /// appended to its manifest (see [`PluginsDir::add_component`]).
    pub fn component(self, name: &str, component: &Path, extra: &str) -> HarnessBuilder {
        let (name, component, extra) =
            (name.to_string(), component.to_path_buf(), extra.to_string());
        self.plugins(move |plugins| plugins.add_component(&name, &component, &extra))
    }

    /// Write into the plugins folder once the webhook sinks are in it (in
    /// the order given): another component or manifest, a broken file, an
    /// edit of a sink's manifest.
    pub fn plugins(mut self, write: impl FnOnce(&PluginsDir) + 'static) -> HarnessBuilder {
        self.writes.push(Box::new(write));
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
        for HookSpec {
            name,
            extra,
            limits,
            allow,
        } in self.hooks
        {
            let receiver = Receiver::start().await;
            let secret = new_secret();
            let allow = allow.unwrap_or_else(|| vec![receiver.origin()]);
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
        for write in self.writes {
            write(&plugins);
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
