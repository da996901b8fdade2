//! The outbound HTTP policy of a plugin: the allow-list of its manifest's
//! `capabilities.http` and the address rule (see [`super`]).
//!
//! Owns: parsing the patterns, the decision for a request's scheme, host
//! and port, and for each address its host is or resolves to. Must never:
//! connect, resolve or send anything — it only decides.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

/// One `scheme://host[:port]` allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    scheme: String,
    /// Lower-case host; `*` any host; `*.example.com` its subdomains.
    host: String,
    /// `None` means any port.
    port: Option<u16>,
}

impl AllowRule {
    /// Parse a pattern. Without a port, the scheme's default port (80/443).
    pub fn parse(pattern: &str) -> Result<AllowRule, String> {
        let (scheme, rest) = pattern
            .split_once("://")
            .ok_or_else(|| format!("{pattern:?}: expected scheme://host[:port]"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{pattern:?}: scheme must be http or https"));
        }
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') || rest.is_empty() {
            return Err(format!(
                "{pattern:?}: expected scheme://host[:port], no path or userinfo"
            ));
        }
        let (host, port) = if let Some(stripped) = rest.strip_prefix('[') {
            let (h, after) = stripped
                .split_once(']')
                .ok_or_else(|| format!("{pattern:?}: unclosed ["))?;
            (format!("[{h}]"), after.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = match port {
            None => Some(default_port(&scheme)),
            Some("*") => None,
            Some(p) => Some(
                p.parse()
                    .map_err(|_| format!("{pattern:?}: bad port {p:?}"))?,
            ),
        };
        Ok(AllowRule {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether this rule names `host` itself (no wildcard host) for this
    /// scheme and port. Only such a rule reaches a loopback or private
    /// address.
    fn names(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.scheme == scheme
            && self.port.is_none_or(|p| p == port)
            && self.host != "*"
            && !self.host.starts_with("*.")
            && self.host == host
    }

    /// Whether this rule names address `ip` for this scheme and port.
    fn names_address(&self, scheme: &str, ip: IpAddr, port: u16) -> bool {
        self.scheme == scheme
            && self.port.is_none_or(|p| p == port)
            && parse_ip(&self.host) == Some(ip)
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        if self.scheme != scheme || self.port.is_some_and(|p| p != port) {
            return false;
        }
        if self.host == "*" || self.host == host {
            return true;
        }
        match self.host.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => false,
        }
    }
}

pub(super) fn default_port(scheme: &str) -> u16 {
    if scheme == "https" {
        443
    } else {
        80
    }
}

/// `text` in lower case, borrowed when it is already (schemes and host
/// names compare case-insensitively, RFC 3986 §3.1 and §3.2.2; nearly
/// every URL writes them lower-case, so a request costs no allocation).
fn lowered(text: &str) -> Cow<'_, str> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(text.to_ascii_lowercase())
    } else {
        Cow::Borrowed(text)
    }
}

/// `127.0.0.1` or `[::1]` as an address; `None` for a name.
pub(super) fn parse_ip(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

/// What kind of internal address `ip` is, or `None` for a public one.
/// IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) count as their IPv4.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_unspecified() || a == 0 {
                Some("unspecified")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if v4.is_private() {
                Some("private")
            } else if a == 100 && (64..128).contains(&b) {
                // RFC 6598 shared address space: internal to a carrier or cloud.
                Some("private")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal_kind(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else {
                None
            }
        }
    }
}

/// A plugin's outbound HTTP policy.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    rules: Vec<AllowRule>,
    /// The manifest's patterns as written (resolved), for messages.
    patterns: Vec<String>,
}

impl EgressPolicy {
    /// Build from the manifest's patterns. Errors name the bad pattern.
    pub fn new(patterns: &[String]) -> Result<EgressPolicy, String> {
        Ok(EgressPolicy {
            rules: patterns
                .iter()
                .map(|p| AllowRule::parse(p))
                .collect::<Result<_, _>>()?,
            patterns: patterns.to_vec(),
        })
    }

    /// The grant as the manifest states it, for a message naming it:
    /// `capabilities.http = ["http://127.0.0.1:9090"]`.
    pub fn grant(&self) -> String {
        format!("capabilities.http = {:?}", self.patterns)
    }

    /// Whether `uri` may be called; `Err` says why not.
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        let scheme = lowered(uri.scheme_str().unwrap_or(""));
        let authority = uri.authority().ok_or("request has no host")?;
        if authority.as_str().contains('@') {
            return Err("userinfo in the request URL is not allowed".into());
        }
        let host = lowered(authority.host());
        let port = authority
            .port_u16()
            .unwrap_or_else(|| default_port(&scheme));
        if !self.rules.iter().any(|r| r.allows(&scheme, &host, port)) {
            return Err(format!(
                "{scheme}://{host}:{port} is not in the plugin's allow-list"
            ));
        }
        if let Some(ip) = parse_ip(&host) {
            self.check_address(&scheme, &host, SocketAddr::new(ip, port))?;
        }
        Ok(())
    }

    /// Whether `addr`, which `host` is or resolved to, may be connected to
    /// for a `scheme` request: a public address always (the name was
    /// checked by [`EgressPolicy::check`]); an internal one only when a rule
    /// names the host or the address exactly (module note).
    pub fn check_address(&self, scheme: &str, host: &str, addr: SocketAddr) -> Result<(), String> {
        let Some(kind) = internal_kind(addr.ip()) else {
            return Ok(());
        };
        let port = addr.port();
        if self
            .rules
            .iter()
            .any(|r| r.names(scheme, host, port) || r.names_address(scheme, addr.ip(), port))
        {
            return Ok(());
        }
        let via = if parse_ip(host).is_some() {
            String::new()
        } else {
            format!("{host} resolves to ")
        };
        Err(format!(
            "{via}{}, a {kind} address; only an allow-list entry naming it exactly \
             (e.g. \"{scheme}://{host}:{port}\") reaches it, a wildcard does not",
            addr.ip()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(patterns: &[&str], uri: &str) -> bool {
        let p =
            EgressPolicy::new(&patterns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.check(&uri.parse().unwrap()).is_ok()
    }

    #[test]
    fn scheme_and_host_match_in_any_case() {
        assert!(check(&["https://example.com"], "HTTPS://Example.COM/x"));
        assert!(check(
            &["https://*.example.com"],
            "https://API.example.com/"
        ));
        assert!(!check(&["https://example.com"], "https://EXAMPLE.org/"));
    }

    #[test]
    fn scheme_host_and_port_are_all_checked() {
        assert!(check(&["http://127.0.0.1:9090"], "http://127.0.0.1:9090/x"));
        assert!(!check(
            &["http://127.0.0.1:9090"],
            "http://127.0.0.1:9091/x"
        ));
        assert!(!check(
            &["http://127.0.0.1:9090"],
            "https://127.0.0.1:9090/x"
        ));
        assert!(!check(
            &["https://example.com"],
            "https://example.com:8443/"
        ));
        assert!(check(&["https://example.com"], "https://example.com/"));
        assert!(check(&["https://*.example.com"], "https://a.example.com/"));
        assert!(!check(&["https://*.example.com"], "https://example.com/"));
        assert!(!check(
            &["https://*.example.com"],
            "https://evilexample.com/"
        ));
        assert!(check(&["http://localhost:*"], "http://localhost:1234/"));
        assert!(!check(
            &["http://localhost:*"],
            "http://user:pw@localhost:1234/"
        ));
        assert!(check(&["http://[::1]:80"], "http://[::1]/"));
    }

    #[test]
    fn internal_addresses_need_an_entry_naming_them_exactly() {
        // Named exactly: allowed.
        assert!(check(&["http://127.0.0.1:9090"], "http://127.0.0.1:9090/x"));
        assert!(check(&["http://127.0.0.1:*"], "http://127.0.0.1:9090/x"));
        assert!(check(&["https://10.1.2.3"], "https://10.1.2.3/"));
        // A wildcard does not reach loopback, private, link-local,
        // unspecified or unique-local addresses ...
        for uri in [
            "http://127.0.0.1:9090/",
            "http://127.9.9.9/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://0.0.0.0:80/",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://[::ffff:127.0.0.1]/",
        ] {
            assert!(
                !check(&["http://*:*"], uri),
                "{uri} must need an explicit entry"
            );
        }
        // ... but public ones are fine.
        assert!(check(&["http://*:*"], "http://93.184.216.34/"));
        assert!(check(&["http://*:*"], "http://[2001:db8::1]/"));
        // The refusal says what the address is and what to write.
        let p = EgressPolicy::new(&["http://*:*".to_string()]).unwrap();
        let e = p
            .check(&"http://127.0.0.1:9090/".parse().unwrap())
            .unwrap_err();
        assert!(
            e.contains("loopback") && e.contains("http://127.0.0.1:9090"),
            "{e}"
        );
    }

    #[test]
    fn a_name_resolving_to_an_internal_address_needs_the_name_or_the_address() {
        let addr: SocketAddr = "10.0.0.5:443".parse().unwrap();
        let policy = |p: &[&str]| {
            EgressPolicy::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        assert!(policy(&["https://internal.corp"])
            .check_address("https", "internal.corp", addr)
            .is_ok());
        assert!(policy(&["https://10.0.0.5"])
            .check_address("https", "internal.corp", addr)
            .is_ok());
        let e = policy(&["https://*.corp"])
            .check_address("https", "internal.corp", addr)
            .unwrap_err();
        assert!(
            e.contains("internal.corp resolves to 10.0.0.5, a private address"),
            "{e}"
        );
        assert!(policy(&["https://*"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        // The entry must match the scheme and port too.
        assert!(policy(&["http://internal.corp"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        assert!(policy(&["https://internal.corp:8443"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        // A public address needs nothing more than the name's own check.
        let public: SocketAddr = "93.184.216.34:443".parse().unwrap();
        assert!(policy(&["https://*"])
            .check_address("https", "example.com", public)
            .is_ok());
    }
}
