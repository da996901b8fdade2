//! Outbound HTTP for plugins, in six rooms: the allow-list and address
//! rule ([`policy`]), the guarded connector and pooled client
//! ([`connector`]), the certificates HTTPS trusts ([`trust`]), the
//! response timeouts ([`watch`]), the `wasi:http` hooks that use them
//! ([`hooks`]), and the `http-batch` interface, many requests per call
//! through the same checks ([`batch`]).
//!
//! Owns: the decision whether a plugin's `wasi:http` request may leave the
//! host (scheme, host and effective port against the manifest's patterns;
//! userinfo refused; the `Host` header forced to the checked authority), the
//! address rule, and sending allowed requests over a keep-alive client per
//! plugin (wasmtime's default sender opens a connection per request; a
//! pooled one measured 1.2–1.5× faster here, docs/measurements.md), HTTP/1.1
//! or, where a TLS receiver offers it by ALPN, HTTP/2. Timeouts a guest
//! sets are clamped to host ceilings.
//!
//! The address rule: a request whose host is, or resolves to, a loopback,
//! link-local, private (RFC 1918, ULA), unspecified or "this network"
//! address is refused unless a rule names that host or that address
//! exactly — `http://127.0.0.1:8080`, `https://internal.corp`; a wildcard
//! (`*`, `*.example.com`, `http://*:*`) never reaches such an address. The
//! rule is applied by the client's connector ([`connector`]), which
//! resolves the name itself and connects only to the addresses it checked,
//! so a name that resolves differently between check and connect (DNS
//! rebinding) gains nothing. Each plugin has its own client, because the
//! connector carries that plugin's policy and a pooled connection must
//! never serve a plugin whose policy did not allow it.
//!
//! Must never: send a request that was not checked, connect to an address
//! that was not checked, or let a guest choose a timeout longer than the
//! ceiling.

mod batch;
mod connector;
mod hooks;
mod policy;
mod trust;
mod watch;

pub use batch::{
    prepare, AnswerHeaders, InFlight, Prepared, Recent, RequestView, MAX_REQUESTS_PER_CALL,
};
pub use connector::{http_client, ConnectError, GuardedConnector, HttpClient};
pub use hooks::{wit_name, Denials, EgressHooks};
pub use policy::{internal_kind, AllowRule, EgressPolicy};
pub use trust::{client_tls, webpki_only, EgressConfig, TrustError};
pub use watch::{Metered, Stall, Timeouts};
