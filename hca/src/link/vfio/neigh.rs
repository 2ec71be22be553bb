//! Neighbour resolution: which MAC address an IP address has on the link.
//!
//! A RoCEv2 packet is an Ethernet frame, so before the first packet to a peer leaves, the
//! driver needs the peer's MAC address: for IPv4 it asks with ARP (RFC 826: a broadcast request,
//! a unicast reply), for IPv6 with Neighbor Discovery (RFC 4861: a Neighbor Solicitation to the
//! target's solicited-node multicast address, answered by a Neighbor Advertisement). The driver
//! answers both for its own addresses, so that Linux rxe on the other side can reach it.
//!
//! The table holds static entries (configured, never replaced), learned entries (from replies,
//! and from requests that name this host, RFC 826's merge rule and RFC 4861 §7.2.3), and
//! incomplete entries with the frames waiting for them (bounded; a request is repeated every
//! [`RETRY_INTERVAL`] up to [`MAX_PROBES`] times, then the frames are dropped and counted).
//! Learned entries do not age: the link's peers are the test hosts and switches of one segment.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::engine::Instant;

/// Time between two requests for an unresolved address.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// Requests sent for one address before its waiting frames are dropped.
pub const MAX_PROBES: u32 = 12;
/// Frames kept per unresolved address.
pub const MAX_PENDING_PER_NEIGHBOUR: usize = 64;
/// Frames kept for all unresolved addresses together.
pub const MAX_PENDING: usize = 1024;

/// How an entry came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighbourState {
    /// Configured; never changed by what arrives.
    Static,
    /// Learned from an ARP or NDP message.
    Learned,
}

#[derive(Debug)]
enum Entry {
    Known {
        mac: [u8; 6],
        state: NeighbourState,
    },
    Incomplete {
        probes: u32,
        last_probe: Instant,
        /// Whole frames (Ethernet destination to fill in at offset 0..6) waiting.
        waiting: Vec<Vec<u8>>,
    },
}

/// What the table wants done after a lookup or a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing.
    None,
    /// Send a request (ARP request / Neighbor Solicitation) for this address.
    Probe(IpAddr),
}

/// Counters of the neighbour table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeighbourCounters {
    /// Requests sent (ARP requests, Neighbor Solicitations).
    pub probes_sent: u64,
    /// Replies sent (ARP replies, Neighbor Advertisements).
    pub replies_sent: u64,
    /// Entries learned or updated.
    pub learned: u64,
    /// Frames queued while their neighbour was resolved.
    pub queued: u64,
    /// Frames dropped: their neighbour never answered, or the queue was full.
    pub dropped: u64,
}

/// The neighbour table.
#[derive(Debug, Default)]
pub(crate) struct Neighbours {
    entries: HashMap<IpAddr, Entry>,
    pending: usize,
    pub(crate) counters: NeighbourCounters,
}

impl Neighbours {
    /// Adds a static entry.
    pub(crate) fn add_static(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.entries.insert(
            ip,
            Entry::Known {
                mac,
                state: NeighbourState::Static,
            },
        );
    }

    /// The MAC of `ip`, if resolved.
    pub(crate) fn lookup(&self, ip: &IpAddr) -> Option<[u8; 6]> {
        match self.entries.get(ip) {
            Some(Entry::Known { mac, .. }) => Some(*mac),
            _ => None,
        }
    }

    /// The entries resolved, with how.
    pub(crate) fn entries(&self) -> Vec<(IpAddr, [u8; 6], NeighbourState)> {
        self.entries
            .iter()
            .filter_map(|(ip, e)| match e {
                Entry::Known { mac, state } => Some((*ip, *mac, *state)),
                Entry::Incomplete { .. } => None,
            })
            .collect()
    }

    /// Queues `frame` (a whole frame, destination MAC to be filled in; an empty one only starts
    /// the resolution) for unresolved `ip`. Returns `Probe` when a request should go out now (the
    /// first frame for the address).
    pub(crate) fn queue(&mut self, ip: IpAddr, frame: &[u8], now: Instant) -> Action {
        let entry = self.entries.entry(ip).or_insert_with(|| Entry::Incomplete {
            probes: 0,
            last_probe: now,
            waiting: Vec::new(),
        });
        match entry {
            Entry::Known { .. } => Action::None,
            Entry::Incomplete {
                probes,
                last_probe,
                waiting,
            } => {
                if frame.is_empty() {
                    // Nothing to keep: the caller only wants the address resolved.
                } else if waiting.len() >= MAX_PENDING_PER_NEIGHBOUR || self.pending >= MAX_PENDING
                {
                    self.counters.dropped += 1;
                } else {
                    waiting.push(frame.to_vec());
                    self.pending += 1;
                    self.counters.queued += 1;
                }
                if *probes == 0 {
                    *probes = 1;
                    *last_probe = now;
                    self.counters.probes_sent += 1;
                    Action::Probe(ip)
                } else {
                    Action::None
                }
            }
        }
    }

    /// Records that `ip` is at `mac` (a reply, or a request naming this host). A static entry is
    /// kept. Returns the frames that waited for it (their destination MAC still to be filled in).
    pub(crate) fn learn(&mut self, ip: IpAddr, mac: [u8; 6]) -> Vec<Vec<u8>> {
        if mac == [0; 6] || mac[0] & 1 == 1 {
            // An unspecified or multicast "address" is nobody's.
            return Vec::new();
        }
        match self.entries.get_mut(&ip) {
            Some(Entry::Known {
                state: NeighbourState::Static,
                ..
            }) => Vec::new(),
            Some(Entry::Known { mac: m, .. }) => {
                if *m != mac {
                    *m = mac;
                    self.counters.learned += 1;
                }
                Vec::new()
            }
            Some(Entry::Incomplete { waiting, .. }) => {
                let frames = std::mem::take(waiting);
                self.pending -= frames.len();
                self.entries.insert(
                    ip,
                    Entry::Known {
                        mac,
                        state: NeighbourState::Learned,
                    },
                );
                self.counters.learned += 1;
                frames
            }
            None => {
                self.entries.insert(
                    ip,
                    Entry::Known {
                        mac,
                        state: NeighbourState::Learned,
                    },
                );
                self.counters.learned += 1;
                Vec::new()
            }
        }
    }

    /// Whether an entry (known or being resolved) exists for `ip`: RFC 826 updates only those
    /// from requests not addressed to this host.
    pub(crate) fn knows(&self, ip: &IpAddr) -> bool {
        self.entries.contains_key(ip)
    }

    /// Repeats requests that are due and gives up on addresses that never answered; returns the
    /// addresses to probe now.
    pub(crate) fn on_timer(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut probe = Vec::new();
        let mut dead = Vec::new();
        for (ip, e) in self.entries.iter_mut() {
            if let Entry::Incomplete {
                probes,
                last_probe,
                waiting,
            } = e
            {
                if now.saturating_duration_since(*last_probe) < RETRY_INTERVAL {
                    continue;
                }
                if *probes >= MAX_PROBES {
                    self.counters.dropped += waiting.len() as u64;
                    self.pending -= waiting.len();
                    dead.push(*ip);
                } else {
                    *probes += 1;
                    *last_probe = now;
                    self.counters.probes_sent += 1;
                    probe.push(*ip);
                }
            }
        }
        for ip in dead {
            self.entries.remove(&ip);
        }
        probe
    }

    /// When [`Neighbours::on_timer`] next has work (`None`: nothing is being resolved).
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| match e {
                Entry::Incomplete { last_probe, .. } => {
                    Some(last_probe.saturating_add(RETRY_INTERVAL))
                }
                Entry::Known { .. } => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    #[test]
    fn queue_probe_learn_flush() {
        let mut n = Neighbours::default();
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let t0 = Instant::ZERO;
        assert_eq!(n.queue(ip, b"one", t0), Action::Probe(ip));
        assert_eq!(n.queue(ip, b"two", t0), Action::None);
        assert_eq!(n.lookup(&ip), None);
        assert!(n.on_timer(t0).is_empty(), "not due yet");
        let t1 = t0.saturating_add(RETRY_INTERVAL);
        assert_eq!(n.on_timer(t1), vec![ip]);
        let frames = n.learn(ip, MAC);
        assert_eq!(frames, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(n.lookup(&ip), Some(MAC));
        assert_eq!(n.pending, 0);
        assert_eq!(n.next_timer(), None);
    }

    #[test]
    fn gives_up_and_counts() {
        let mut n = Neighbours::default();
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        let mut t = Instant::ZERO;
        n.queue(ip, b"x", t);
        for _ in 0..MAX_PROBES + 1 {
            t = t.saturating_add(RETRY_INTERVAL);
            n.on_timer(t);
        }
        assert_eq!(n.counters.dropped, 1);
        assert_eq!(n.pending, 0);
        assert!(!n.knows(&ip));
    }

    #[test]
    fn static_entries_win_and_queues_are_bounded() {
        let mut n = Neighbours::default();
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 4));
        n.add_static(ip, MAC);
        assert!(n.learn(ip, [2, 0, 0, 0, 0, 7]).is_empty());
        assert_eq!(n.lookup(&ip), Some(MAC));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
        for _ in 0..MAX_PENDING_PER_NEIGHBOUR + 5 {
            n.queue(other, b"f", Instant::ZERO);
        }
        assert_eq!(n.counters.dropped, 5);
        assert!(
            n.learn(other, [1, 0, 0, 0, 0, 0]).is_empty(),
            "multicast is refused"
        );
    }
}
