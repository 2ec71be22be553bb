//! Next-hop MAC addresses of the AF_XDP link, from the kernel's neighbour table: the kernel still
//! owns the interface and answers and sends ARP (RFC 826) and Neighbor Discovery (RFC 4861) for
//! it (the XDP program passes them), so the link reads its results: `/proc/net/arp` (proc(5):
//! IP address, HW type, flags, HW address, mask, device; flag `0x2` = complete) for IPv4 and
//! `ip -6 neigh show ADDRESS dev IFNAME` (ip-neighbour(8)) for IPv6.
//!
//! When the table has no entry, the link makes the kernel resolve one by sending it an empty UDP
//! datagram to the peer's discard port (9, RFC 863) from an ordinary socket, then reads the table
//! again every millisecond for at most [`RESOLVE_WAIT`]; a peer still unresolved is retried no
//! sooner than [`RETRY_AFTER`] later (packets to it are dropped and counted meanwhile, and the
//! transport retransmits them). A resolved address is kept for the link's lifetime.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

/// Longest a resolution waits for the kernel's answer.
pub const RESOLVE_WAIT: Duration = Duration::from_millis(100);
/// Least time between two resolutions of an unresolved peer.
pub const RETRY_AFTER: Duration = Duration::from_millis(250);
/// Most peers remembered (resolved or not).
const MAX_ENTRIES: usize = 4096;

/// The neighbours of one interface.
#[derive(Debug)]
pub(crate) struct KernelNeighbours {
    ifname: String,
    ifindex: u32,
    resolved: HashMap<IpAddr, [u8; 6]>,
    failed: HashMap<IpAddr, Instant>,
    /// Resolutions that had to ask the kernel (probe sent).
    pub(crate) probes: u64,
}

impl KernelNeighbours {
    pub(crate) fn new(ifname: &str, ifindex: u32) -> KernelNeighbours {
        KernelNeighbours {
            ifname: ifname.to_owned(),
            ifindex,
            resolved: HashMap::new(),
            failed: HashMap::new(),
            probes: 0,
        }
    }

    /// The MAC of `ip` on this interface; `None` while unresolved. `src`: the link's own
    /// address of that family (the probe's source).
    pub(crate) fn lookup(&mut self, ip: IpAddr, src: Option<IpAddr>) -> Option<[u8; 6]> {
        if let Some(mac) = self.resolved.get(&ip) {
            return Some(*mac);
        }
        if let Some(mac) = self.table(ip) {
            return Some(self.remember(ip, mac));
        }
        if self
            .failed
            .get(&ip)
            .is_some_and(|t| t.elapsed() < RETRY_AFTER)
        {
            return None;
        }
        self.probes += 1;
        self.probe(ip, src);
        let start = Instant::now();
        for _ in 0..RESOLVE_WAIT.as_millis() {
            std::thread::sleep(Duration::from_millis(1));
            if let Some(mac) = self.table(ip) {
                return Some(self.remember(ip, mac));
            }
            if start.elapsed() >= RESOLVE_WAIT {
                break;
            }
        }
        if self.failed.len() >= MAX_ENTRIES {
            self.failed.clear();
        }
        self.failed.insert(ip, Instant::now());
        None
    }

    fn remember(&mut self, ip: IpAddr, mac: [u8; 6]) -> [u8; 6] {
        self.failed.remove(&ip);
        if self.resolved.len() >= MAX_ENTRIES {
            self.resolved.clear();
        }
        self.resolved.insert(ip, mac);
        mac
    }

    /// The kernel's complete entry for `ip`, if any.
    fn table(&self, ip: IpAddr) -> Option<[u8; 6]> {
        match ip {
            IpAddr::V4(v4) => {
                let t = std::fs::read_to_string("/proc/net/arp").ok()?;
                arp_entry(&t, v4, &self.ifname)
            }
            IpAddr::V6(v6) => {
                let out = std::process::Command::new("ip")
                    .args(["-6", "neigh", "show", &v6.to_string(), "dev", &self.ifname])
                    .output()
                    .ok()?;
                ndisc_entry(&String::from_utf8_lossy(&out.stdout))
            }
        }
    }

    /// Makes the kernel resolve `ip`: an empty datagram to its discard port.
    fn probe(&self, ip: IpAddr, src: Option<IpAddr>) {
        let (bind, dst): (SocketAddr, SocketAddr) = match ip {
            IpAddr::V4(_) => (
                SocketAddr::new(src.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0),
                SocketAddr::new(ip, 9),
            ),
            IpAddr::V6(v6) => {
                let scope = if is_link_local(&v6) { self.ifindex } else { 0 };
                let src6 = match src {
                    Some(IpAddr::V6(s)) => s,
                    _ => Ipv6Addr::UNSPECIFIED,
                };
                let src_scope = if is_link_local(&src6) {
                    self.ifindex
                } else {
                    0
                };
                (
                    SocketAddr::V6(SocketAddrV6::new(src6, 0, 0, src_scope)),
                    SocketAddr::V6(SocketAddrV6::new(v6, 9, 0, scope)),
                )
            }
        };
        if let Ok(s) = UdpSocket::bind(bind) {
            let _ = s.send_to(&[], dst);
        }
    }
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    (parts.next().is_none() && mac != [0; 6]).then_some(mac)
}

/// The complete entry of `ip` on `dev` in `/proc/net/arp` text.
pub(crate) fn arp_entry(table: &str, ip: Ipv4Addr, dev: &str) -> Option<[u8; 6]> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [addr, _hw, flags, mac, _mask, d] if *d == dev && addr.parse() == Ok(ip) => {
                let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
                if flags & 0x2 == 0 {
                    return None;
                }
                parse_mac(mac)
            }
            _ => None,
        }
    })
}

/// The link-layer address in `ip -6 neigh show ADDRESS dev IFNAME` output, unless the entry is
/// `FAILED` or `INCOMPLETE`.
pub(crate) fn ndisc_entry(out: &str) -> Option<[u8; 6]> {
    out.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.iter().any(|w| *w == "FAILED" || *w == "INCOMPLETE") {
            return None;
        }
        let at = f.iter().position(|w| *w == "lladdr")?;
        parse_mac(f.get(at + 1)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arp_table_gives_complete_entries_of_the_device_only() {
        let t = "IP address       HW type     Flags       HW address            Mask     Device\n\
                 10.9.0.2         0x1         0x2         aa:bb:cc:dd:ee:01     *        xv0\n\
                 10.9.0.3         0x1         0x0         00:00:00:00:00:00     *        xv0\n\
                 10.9.0.4         0x1         0x2         aa:bb:cc:dd:ee:04     *        eth0\n";
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            arp_entry(t, ip("10.9.0.2"), "xv0"),
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01])
        );
        assert_eq!(arp_entry(t, ip("10.9.0.3"), "xv0"), None, "incomplete");
        assert_eq!(arp_entry(t, ip("10.9.0.4"), "xv0"), None, "other device");
        assert_eq!(arp_entry(t, ip("10.9.0.9"), "xv0"), None);
        assert_eq!(arp_entry("garbage", ip("10.9.0.2"), "xv0"), None);
    }

    #[test]
    fn ndisc_output_gives_usable_entries() {
        assert_eq!(
            ndisc_entry("fd00::2 lladdr 02:00:00:00:00:02 REACHABLE\n"),
            Some([2, 0, 0, 0, 0, 2])
        );
        assert_eq!(
            ndisc_entry("fd00::2 lladdr 02:00:00:00:00:02 STALE\n"),
            Some([2, 0, 0, 0, 0, 2])
        );
        assert_eq!(ndisc_entry("fd00::2 FAILED\n"), None);
        assert_eq!(ndisc_entry("fd00::2 lladdr zz:00 REACHABLE\n"), None);
        assert_eq!(ndisc_entry(""), None);
    }
}
