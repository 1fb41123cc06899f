//! Outbound HTTP to addresses a tenant names — its webhooks, its sessions' HTTP MCP servers —
//! made safe to point at the internet (docs/operations.md, "Webhooks and schedules").
//!
//! A tenant's URL must not become a way into the daemon's own network: the loopback interface,
//! private and link-local networks, carrier-grade NAT, and above all a cloud's metadata service,
//! whose credentials are the machine's. So every address a URL leads to is checked against
//! [`Policy`]: an IP literal before anything is sent, a name by [`Egress`]'s resolver, which
//! resolves it once, checks **every** address it gets and hands the client those addresses, so
//! that the connection goes to an address that was checked (no second lookup in which the name
//! could change). The client ignores proxies from the environment (a proxy would make the
//! connection, to wherever it likes) and follows no redirect (a redirect is a new URL, which the
//! caller sees as an answer and does not follow).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use url::{Host, Url};

/// Where outbound requests may go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Allow loopback, private, link-local and CGNAT addresses: for tests and private networks.
    /// Cloud metadata addresses stay refused.
    pub allow_private: bool,
}

/// Why a URL or an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} is a link-local or cloud metadata address, never reachable from forkd")]
    Metadata(IpAddr),
    #[error(
        "{addr} is {what}, which forkd does not reach for a tenant (an operator may allow \
         private addresses: [webhooks] allow_private)"
    )]
    Private { addr: IpAddr, what: &'static str },
    #[error("{0}: a URL here is http:// or https:// with a host")]
    Url(String),
    #[error("{host} did not resolve: {reason}")]
    Resolve { host: String, reason: String },
}

/// The blocks a tenant's URL may never lead to, even with `allow_private`: link-local (where
/// clouds serve instance metadata and credentials: 169.254.169.254, ECS's 169.254.170.2, EKS's
/// 169.254.170.23) and the other metadata services (AWS's IPv6 `fd00:ec2::/32`, Alibaba's
/// 100.100.100.200, Oracle's 192.0.0.192).
const METADATA_V4: &[&str] = &["169.254.0.0/16", "100.100.100.200/32", "192.0.0.192/32"];
const METADATA_V6: &[&str] = &["fe80::/10", "fd00:ec2::/32"];

/// How long a name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// IPv4 blocks refused unless `allow_private`, with what each is.
const BLOCKED_V4: &[(&str, &str)] = &[
    ("0.0.0.0/8", "an unspecified address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT address"),
    ("127.0.0.0/8", "a loopback address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
];

/// IPv6 blocks refused unless `allow_private` (embedded IPv4 forms are checked as IPv4).
const BLOCKED_V6: &[(&str, &str)] = &[
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("fc00::/7", "a unique local (private) address"),
    ("ff00::/8", "a multicast address"),
    ("::ffff:0:0/96", "an IPv4-mapped address"),
    ("64:ff9b:1::/48", "a local NAT64 address"),
];

impl Policy {
    /// Whether `addr` may be reached; IPv4-mapped, IPv4-compatible, NAT64 and 6to4 IPv6
    /// addresses are judged by the IPv4 address they carry.
    pub fn check(&self, addr: IpAddr) -> Result<(), Refusal> {
        match addr {
            IpAddr::V4(v4) => self.check_v4(v4, addr),
            IpAddr::V6(v6) => {
                let metadata = METADATA_V6
                    .iter()
                    .any(|net| net.parse::<Ipv6Net>().is_ok_and(|n| n.contains(&v6)));
                if metadata {
                    return Err(Refusal::Metadata(addr));
                }
                if let Some(v4) = embedded_v4(v6) {
                    return self.check_v4(v4, addr);
                }
                self.check_blocks(addr, BLOCKED_V6, |net| {
                    net.parse::<Ipv6Net>().is_ok_and(|n| n.contains(&v6))
                })
            }
        }
    }

    fn check_v4(&self, v4: Ipv4Addr, shown: IpAddr) -> Result<(), Refusal> {
        let metadata = METADATA_V4
            .iter()
            .any(|net| net.parse::<Ipv4Net>().is_ok_and(|n| n.contains(&v4)));
        if metadata {
            return Err(Refusal::Metadata(shown));
        }
        self.check_blocks(shown, BLOCKED_V4, |net| {
            net.parse::<Ipv4Net>().is_ok_and(|n| n.contains(&v4))
        })
    }

    fn check_blocks(
        &self,
        addr: IpAddr,
        blocks: &[(&str, &'static str)],
        contains: impl Fn(&str) -> bool,
    ) -> Result<(), Refusal> {
        if self.allow_private {
            return Ok(());
        }
        match blocks.iter().find(|(net, _)| contains(net)) {
            Some((_, what)) => Err(Refusal::Private { addr, what }),
            None => Ok(()),
        }
    }

    /// Checks every address; all of them, or the first refusal.
    pub fn check_all(&self, addrs: &[SocketAddr]) -> Result<(), Refusal> {
        addrs.iter().try_for_each(|a| self.check(a.ip()))
    }
}

/// The IPv4 address an IPv6 one carries: mapped (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`),
/// NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:AABB:CCDD::`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // `::` and `::1` are IPv6's own.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// A URL a tenant gave, parsed and its scheme and host checked (`http` or `https`, a host).
pub fn parse_url(text: &str) -> Result<Url, Refusal> {
    let url = Url::parse(text).map_err(|e| Refusal::Url(format!("{text}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(Refusal::Url(text.to_owned()));
    }
    Ok(url)
}

/// Outbound HTTP under a policy: the checks and the client that keeps to them.
#[derive(Debug, Clone)]
pub struct Egress {
    policy: Policy,
    client: reqwest::Client,
}

impl Egress {
    /// How long a connection may take to be made.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A client under `policy`, each request cut off after `timeout` when one is given (a
    /// webhook's attempt; an MCP server's event stream has none).
    pub fn new(policy: Policy, timeout: Option<Duration>) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckingResolver { policy }))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(
                timeout.map_or(Self::CONNECT_TIMEOUT, |t| t.min(Self::CONNECT_TIMEOUT)),
            );
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        Ok(Self {
            policy,
            client: builder.build()?,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The client: its resolver checks every name's addresses; a URL's IP literal must pass
    /// [`Egress::check_literal`] first (a literal is not resolved).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Checks a URL's host when it is an IP literal; a name is checked when it is resolved.
    pub fn check_literal(&self, url: &Url) -> Result<(), Refusal> {
        match url.host() {
            Some(Host::Ipv4(v4)) => self.policy.check(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => self.policy.check(IpAddr::V6(v6)),
            Some(Host::Domain(_)) => Ok(()),
            None => Err(Refusal::Url(url.to_string())),
        }
    }

    /// Parses and checks a URL now: its literal address, or every address its name resolves to.
    /// For when a URL is registered; each request is checked again as it connects.
    pub async fn check_url(&self, text: &str) -> Result<Url, Refusal> {
        let url = parse_url(text)?;
        self.check_literal(&url)?;
        if let Some(Host::Domain(name)) = url.host() {
            resolve_checked(self.policy, name).await?;
        }
        Ok(url)
    }
}

/// The refusal behind a failed request, if its resolver refused an address.
pub fn refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(r) = e.downcast_ref::<Refusal>() {
            return Some(r);
        }
        source = e.source();
    }
    None
}

/// Resolves `name` once and checks every address.
async fn resolve_checked(policy: Policy, name: &str) -> Result<Vec<SocketAddr>, Refusal> {
    let lookup = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, 0)))
        .await
        .map_err(|_| Refusal::Resolve {
            host: name.to_owned(),
            reason: format!("no answer within {RESOLVE_TIMEOUT:?}"),
        })?;
    let addrs: Vec<SocketAddr> = lookup
        .map_err(|e| Refusal::Resolve {
            host: name.to_owned(),
            reason: e.to_string(),
        })?
        .collect();
    if addrs.is_empty() {
        return Err(Refusal::Resolve {
            host: name.to_owned(),
            reason: "no address".to_owned(),
        });
    }
    policy.check_all(&addrs)?;
    Ok(addrs)
}

/// reqwest's resolver: the addresses a name resolves to, every one checked, or the refusal.
struct CheckingResolver {
    policy: Policy,
}

impl reqwest::dns::Resolve for CheckingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy;
        Box::pin(async move {
            let addrs = resolve_checked(policy, name.as_str()).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn refused(policy: Policy, addr: &str) -> bool {
        policy.check(addr.parse().expect("an address")).is_err()
    }

    #[test]
    fn private_and_local_addresses_are_refused_in_every_form() {
        let strict = Policy::default();
        for addr in [
            "127.0.0.1",
            "10.1.2.3",
            "172.31.255.255",
            "192.168.0.10",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "::1",
            "::",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:0101::1",
        ] {
            assert!(refused(strict, addr), "{addr} should be refused");
        }
        for addr in [
            "93.184.216.34",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!refused(strict, addr), "{addr} should be allowed");
        }
    }

    #[test]
    fn metadata_addresses_are_refused_even_when_private_ones_are_allowed() {
        let open = Policy {
            allow_private: true,
        };
        assert!(!refused(open, "127.0.0.1"));
        assert!(!refused(open, "10.0.0.1"));
        for addr in [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.1.1",
            "fe80::1",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "100.100.100.200",
            "192.0.0.192",
            "::ffff:169.254.169.254",
        ] {
            let err = open.check(addr.parse().expect("an address"));
            assert!(matches!(err, Err(Refusal::Metadata(_))), "{addr}: {err:?}");
        }
    }

    #[test]
    fn urls_need_http_and_a_host() {
        assert!(parse_url("https://example.com/hook").is_ok());
        assert!(parse_url("ftp://example.com/").is_err());
        assert!(parse_url("file:///etc/passwd").is_err());
        assert!(parse_url("not a url").is_err());
    }

    #[tokio::test]
    async fn a_name_is_checked_by_every_address_it_resolves_to() {
        let strict =
            Egress::new(Policy::default(), Some(Duration::from_secs(1))).expect("a client");
        let err = strict.check_url("http://localhost:9/").await;
        assert!(
            matches!(err, Err(Refusal::Private { .. })),
            "localhost resolves to loopback: {err:?}"
        );
        let err = strict.check_url("http://[::ffff:7f00:1]/").await;
        assert!(matches!(err, Err(Refusal::Private { .. })), "{err:?}");
    }

    #[tokio::test]
    async fn the_client_refuses_a_name_at_connection_and_says_why() {
        let strict =
            Egress::new(Policy::default(), Some(Duration::from_secs(1))).expect("a client");
        let err = strict
            .client()
            .get("http://localhost:9/")
            .send()
            .await
            .expect_err("refused");
        let why = refusal(&err).expect("the resolver's refusal");
        assert!(matches!(why, Refusal::Private { .. }), "{why}");
    }
}
