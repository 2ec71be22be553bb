//! Ethernet frames of the VFIO link: sorting what arrives (RoCEv2, ARP, IPv6 Neighbor
//! Discovery, anything else) and writing what leaves, with the `roce` crate's header views.
//!
//! Received frames are checked in this order and dropped (counted by the caller) at the first
//! failure: Ethernet header present; destination this host's MAC, broadcast, or IPv6 multicast
//! (33:33:..); no VLAN tag; then by EtherType: ARP (Ethernet/IPv4 only, RFC 826), IPv4 (header
//! checksum, no fragment, no options beyond the IHL, destination this host: `roce::ipv4`), IPv6
//! (destination this host, or the solicited-node multicast address of one of its addresses for
//! Neighbor Discovery); then UDP to port 4791 with a consistent length (the RoCEv2 datagram goes
//! to the engine, which checks the ICRC: it covers the UDP payload and the invariant IP and UDP
//! fields, so the UDP checksum is not verified again), or ICMPv6 Neighbor Solicitation /
//! Advertisement with hop limit 255, a valid checksum and a target address (RFC 4861 §7.1; the
//! message itself is `roce::ndisc`'s to read and write).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce::ethernet::{self, Address, EtherType};
use roce::ipv4::{self, Ecn, IpProtocol};
use roce::{arp, ipv6, ndisc, udp};

use crate::engine::{Datagram, Transmit, IPV4_IDENT};

/// This host's addresses on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalAddrs {
    /// The NIC's MAC address.
    pub(crate) mac: [u8; 6],
    /// The IPv4 address, if configured.
    pub(crate) ipv4: Option<Ipv4Addr>,
    /// The IPv6 link-local address (`fe80::` + EUI-64 of the MAC).
    pub(crate) ipv6_ll: Ipv6Addr,
}

impl LocalAddrs {
    fn owns_v6(&self, ip: &Ipv6Addr) -> bool {
        *ip == self.ipv6_ll
    }
}

/// Why a received frame was not for the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ignored {
    /// Sent to another MAC (a hub or a promiscuous device delivers everything).
    NotForUs,
    /// Malformed or truncated headers.
    Malformed,
    /// A protocol this link does not serve (VLAN, other EtherType, other IP protocol or port,
    /// other ICMPv6 type).
    Unsupported,
}

/// A received frame, sorted.
#[derive(Debug)]
pub(crate) enum Received<'a> {
    /// A RoCEv2 datagram for the engine.
    Roce(Datagram<'a>),
    /// An ARP request or reply (Ethernet/IPv4).
    Arp {
        /// Request (1) or reply (2).
        request: bool,
        sender_mac: [u8; 6],
        sender_ip: Ipv4Addr,
        target_ip: Ipv4Addr,
    },
    /// A Neighbor Solicitation for one of this host's addresses.
    NeighborSolicit {
        /// Source address of the solicitation (unspecified `::` during DAD).
        src_ip: Ipv6Addr,
        /// Ethernet source.
        src_mac: [u8; 6],
        /// The Source Link-Layer Address option, if present.
        sender_ll: Option<[u8; 6]>,
        /// The address asked about.
        target: Ipv6Addr,
    },
    /// A Neighbor Advertisement.
    NeighborAdvert {
        /// The address advertised.
        target: Ipv6Addr,
        /// Its MAC: the Target Link-Layer Address option, else the Ethernet source.
        mac: [u8; 6],
    },
    /// Not for the engine.
    Ignored(Ignored),
}

/// Sorts a received frame (without FCS). Never panics.
pub(crate) fn classify<'a>(frame: &'a [u8], me: &LocalAddrs) -> Received<'a> {
    use Received::Ignored as Ign;
    let Ok(eth) = ethernet::Frame::new_checked(frame) else {
        return Ign(Ignored::Malformed);
    };
    let dst = eth.dst_addr();
    let v6_multicast = dst.0[0] == 0x33 && dst.0[1] == 0x33;
    if dst.0 != me.mac && !dst.is_broadcast() && !v6_multicast {
        return Ign(Ignored::NotForUs);
    }
    if eth.has_vlan_tag() {
        return Ign(Ignored::Unsupported);
    }
    let src_mac = eth.src_addr().0;
    let payload = frame.get(eth.header_len()..).unwrap_or_default();
    match eth.ethertype() {
        EtherType::Arp => classify_arp(payload),
        EtherType::Ipv4 => classify_ipv4(payload, me),
        EtherType::Ipv6 => classify_ipv6(payload, src_mac, me),
        _ => Ign(Ignored::Unsupported),
    }
}

fn classify_arp(payload: &[u8]) -> Received<'_> {
    let Ok(p) = arp::Packet::new_checked(payload) else {
        return Received::Ignored(Ignored::Malformed);
    };
    match arp::Repr::parse(&p) {
        Ok(arp::Repr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        }) => {
            let request = match operation {
                arp::Operation::Request => true,
                arp::Operation::Reply => false,
                _ => return Received::Ignored(Ignored::Unsupported),
            };
            Received::Arp {
                request,
                sender_mac: source_hardware_addr.0,
                sender_ip: source_protocol_addr,
                target_ip: target_protocol_addr,
            }
        }
        _ => Received::Ignored(Ignored::Malformed),
    }
}

/// The UDP datagram inside an IP payload, if it is RoCEv2: (src port, UDP payload).
fn rocev2_udp(ip_payload: &[u8]) -> Result<(u16, &[u8]), Ignored> {
    let u = udp::Packet::new_checked(ip_payload).map_err(|_| Ignored::Malformed)?;
    if usize::from(u.len()) != ip_payload.len() {
        return Err(Ignored::Malformed);
    }
    if u.dst_port() != udp::ROCEV2_PORT {
        return Err(Ignored::Unsupported);
    }
    Ok((u.src_port(), &ip_payload[udp::HEADER_LEN..]))
}

fn classify_ipv4<'a>(payload: &'a [u8], me: &LocalAddrs) -> Received<'a> {
    let Ok(p) = ipv4::Packet::new_checked(payload) else {
        return Received::Ignored(Ignored::Malformed);
    };
    let Ok(ip) = ipv4::Repr::parse(&p) else {
        return Received::Ignored(Ignored::Malformed);
    };
    if Some(ip.dst_addr) != me.ipv4 {
        return Received::Ignored(Ignored::NotForUs);
    }
    if ip.protocol != IpProtocol::Udp {
        return Received::Ignored(Ignored::Unsupported);
    }
    let start = usize::from(p.header_len());
    let Some(l4) = payload.get(start..start + ip.payload_len) else {
        return Received::Ignored(Ignored::Malformed);
    };
    match rocev2_udp(l4) {
        Ok((src_port, udp_payload)) => Received::Roce(Datagram {
            src_ip: IpAddr::V4(ip.src_addr),
            dst_ip: IpAddr::V4(ip.dst_addr),
            src_port,
            dst_port: udp::ROCEV2_PORT,
            ecn: ip.ecn,
            dscp: ip.dscp,
            hop_limit: ip.hop_limit,
            ip_ident: Some(ip.ident),
            payload: udp_payload,
        }),
        Err(why) => Received::Ignored(why),
    }
}

/// The solicited-node multicast address of `ip` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX.
pub(crate) fn solicited_node(ip: &Ipv6Addr) -> Ipv6Addr {
    ndisc::solicited_node_addr(ip)
}

/// The Ethernet multicast address of an IPv6 multicast address (RFC 2464 §7): 33:33 + low 32 bits.
pub(crate) fn ipv6_multicast_mac(ip: &Ipv6Addr) -> [u8; 6] {
    ndisc::multicast_mac(ip).0
}

fn classify_ipv6<'a>(payload: &'a [u8], src_mac: [u8; 6], me: &LocalAddrs) -> Received<'a> {
    let Ok(p) = ipv6::Packet::new_checked(payload) else {
        return Received::Ignored(Ignored::Malformed);
    };
    let Ok(ip) = ipv6::Repr::parse(&p) else {
        return Received::Ignored(Ignored::Malformed);
    };
    let Some(l4) = payload.get(ipv6::HEADER_LEN..ipv6::HEADER_LEN + ip.payload_len) else {
        return Received::Ignored(Ignored::Malformed);
    };
    let for_us = me.owns_v6(&ip.dst_addr);
    match ip.next_header {
        IpProtocol::Udp if for_us => match rocev2_udp(l4) {
            Ok((src_port, udp_payload)) => Received::Roce(Datagram {
                src_ip: IpAddr::V6(ip.src_addr),
                dst_ip: IpAddr::V6(ip.dst_addr),
                src_port,
                dst_port: udp::ROCEV2_PORT,
                ecn: ip.ecn,
                dscp: ip.dscp,
                hop_limit: ip.hop_limit,
                // IPv6 has no identification; any Some value makes the engine check the ICRC.
                ip_ident: Some(0),
                payload: udp_payload,
            }),
            Err(why) => Received::Ignored(why),
        },
        IpProtocol::Icmpv6 if for_us || ip.dst_addr == solicited_node(&me.ipv6_ll) => {
            classify_ndp(&ip, l4, src_mac, me)
        }
        _ if !for_us => Received::Ignored(Ignored::NotForUs),
        _ => Received::Ignored(Ignored::Unsupported),
    }
}

fn classify_ndp<'a>(
    ip: &ipv6::Repr,
    icmp: &[u8],
    src_mac: [u8; 6],
    me: &LocalAddrs,
) -> Received<'a> {
    match icmp.first().copied().map(ndisc::Message::from) {
        None => return Received::Ignored(Ignored::Malformed),
        Some(ndisc::Message::NeighborSolicit | ndisc::Message::NeighborAdvert) => {}
        Some(_) => return Received::Ignored(Ignored::Unsupported),
    }
    // RFC 4861 §7.1.1 / §7.1.2: at least 24 bytes, hop limit 255 (not forwarded), code 0,
    // checksum valid, target not multicast, no option of length 0.
    let parsed = ndisc::Packet::new_checked(icmp).and_then(|p| ndisc::Repr::parse(ip, &p));
    match parsed {
        Ok(ndisc::Repr::NeighborSolicit {
            target_addr,
            source_ll_addr,
        }) => {
            if !me.owns_v6(&target_addr) {
                return Received::Ignored(Ignored::NotForUs);
            }
            Received::NeighborSolicit {
                src_ip: ip.src_addr,
                src_mac,
                sender_ll: source_ll_addr.map(|a| a.0),
                target: target_addr,
            }
        }
        Ok(ndisc::Repr::NeighborAdvert {
            target_addr,
            target_ll_addr,
            ..
        }) => Received::NeighborAdvert {
            target: target_addr,
            mac: target_ll_addr.map_or(src_mac, |a| a.0),
        },
        Err(_) => Received::Ignored(Ignored::Malformed),
    }
}

// ---------------------------------------------------------------- building

/// Bytes of the Ethernet, IP and UDP headers in front of a RoCEv2 UDP payload sent to `dst`.
pub(crate) fn roce_headers_len(dst: &IpAddr) -> usize {
    ethernet::HEADER_LEN
        + match dst {
            IpAddr::V4(_) => ipv4::HEADER_LEN,
            IpAddr::V6(_) => ipv6::HEADER_LEN,
        }
        + udp::HEADER_LEN
}

/// Writes the Ethernet, IP and UDP headers of the engine's packet `tx` into `buf`, ending right
/// before `payload_at` where its UDP payload (`tx.len` bytes) already is; returns where the frame
/// starts. The IP header carries exactly the fields the ICRC assumed: IPv4 identification
/// [`IPV4_IDENT`], Don't Fragment, TTL / hop limit, DSCP, ECN (and the IPv6 flow label, which the
/// ICRC masks). The UDP checksum is 0, as Linux rxe sends it (RFC 6935 for IPv6). `None` when the
/// addresses mix families or the headers do not fit before `payload_at`.
pub(crate) fn write_roce_headers(
    buf: &mut [u8],
    payload_at: usize,
    tx: &Transmit,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) -> Option<usize> {
    let start = payload_at.checked_sub(roce_headers_len(&tx.dst_ip))?;
    let udp_len = udp::HEADER_LEN + tx.len;
    let frame = buf.get_mut(start..payload_at)?;
    let (eth_buf, rest) = frame.split_at_mut(ethernet::HEADER_LEN);
    let ethertype = match (tx.src_ip, tx.dst_ip) {
        (IpAddr::V4(src_addr), IpAddr::V4(dst_addr)) => {
            let (ip_buf, _) = rest.split_at_mut(ipv4::HEADER_LEN);
            ipv4::Repr {
                src_addr,
                dst_addr,
                protocol: IpProtocol::Udp,
                payload_len: udp_len,
                hop_limit: tx.hop_limit,
                dscp: tx.dscp,
                ecn: tx.ecn,
                ident: IPV4_IDENT,
                dont_frag: true,
            }
            .emit(&mut ipv4::Packet::new_unchecked(ip_buf));
            EtherType::Ipv4
        }
        (IpAddr::V6(src_addr), IpAddr::V6(dst_addr)) => {
            let (ip_buf, _) = rest.split_at_mut(ipv6::HEADER_LEN);
            ipv6::Repr {
                src_addr,
                dst_addr,
                next_header: IpProtocol::Udp,
                payload_len: udp_len,
                hop_limit: tx.hop_limit,
                dscp: tx.dscp,
                ecn: tx.ecn,
                flow_label: tx.flow_label & ipv6::FLOW_LABEL_MASK,
            }
            .emit(&mut ipv6::Packet::new_unchecked(ip_buf));
            EtherType::Ipv6
        }
        _ => return None,
    };
    let udp_at = rest.len() - udp::HEADER_LEN;
    udp::Repr {
        src_port: tx.src_port,
        dst_port: tx.dst_port,
        payload_len: tx.len,
    }
    .emit(
        &mut udp::Packet::new_unchecked(&mut rest[udp_at..]),
        udp::ChecksumMode::Zero,
    );
    ethernet::Repr {
        src_addr: Address(src_mac),
        dst_addr: Address(dst_mac),
        vlan: None,
        ethertype,
    }
    .emit(&mut ethernet::Frame::new_unchecked(eth_buf));
    Some(start)
}

/// Bytes of an ARP frame (Ethernet header and ARP packet, before padding).
pub(crate) const ARP_FRAME_LEN: usize = ethernet::HEADER_LEN + arp::HEADER_LEN;

/// Writes an ARP request (`reply: None`, broadcast) or reply (`reply: Some(mac)`, unicast) into
/// `buf` (at least [`ARP_FRAME_LEN`] bytes) and returns its length.
pub(crate) fn write_arp(
    buf: &mut [u8],
    me: &LocalAddrs,
    my_ip: Ipv4Addr,
    target_ip: Ipv4Addr,
    reply_to: Option<[u8; 6]>,
) -> Option<usize> {
    let frame = buf.get_mut(..ARP_FRAME_LEN)?;
    let (eth_buf, arp_buf) = frame.split_at_mut(ethernet::HEADER_LEN);
    let (operation, dst, target_hw) = match reply_to {
        Some(mac) => (arp::Operation::Reply, Address(mac), Address(mac)),
        None => (
            arp::Operation::Request,
            Address::BROADCAST,
            Address::UNSPECIFIED,
        ),
    };
    ethernet::Repr {
        src_addr: Address(me.mac),
        dst_addr: dst,
        vlan: None,
        ethertype: EtherType::Arp,
    }
    .emit(&mut ethernet::Frame::new_unchecked(eth_buf));
    arp::Repr::EthernetIpv4 {
        operation,
        source_hardware_addr: Address(me.mac),
        source_protocol_addr: my_ip,
        target_hardware_addr: target_hw,
        target_protocol_addr: target_ip,
    }
    .emit(&mut arp::Packet::new_unchecked(arp_buf));
    Some(ARP_FRAME_LEN)
}

/// Writes a Neighbor Solicitation for `target` (to its solicited-node multicast address, with
/// this host's link-layer address) into `buf`; returns its length.
pub(crate) fn write_neighbor_solicit(
    buf: &mut [u8],
    me: &LocalAddrs,
    target: &Ipv6Addr,
) -> Option<usize> {
    let dst = solicited_node(target);
    let ns = ndisc::Repr::NeighborSolicit {
        target_addr: *target,
        source_ll_addr: Some(Address(me.mac)),
    };
    write_nd(buf, me, ipv6_multicast_mac(&dst), dst, &ns)
}

/// Writes a solicited Neighbor Advertisement of this host's `target` address to `dst_ip` at
/// `dst_mac` (or to all-nodes when the solicitation came from `::`); returns its length.
pub(crate) fn write_neighbor_advert(
    buf: &mut [u8],
    me: &LocalAddrs,
    dst_ip: &Ipv6Addr,
    dst_mac: [u8; 6],
    target: &Ipv6Addr,
) -> Option<usize> {
    let na = |flags| ndisc::Repr::NeighborAdvert {
        flags,
        target_addr: *target,
        target_ll_addr: Some(Address(me.mac)),
    };
    if dst_ip.is_unspecified() {
        // RFC 4861 §7.2.4: a solicitation from the unspecified address is answered to all-nodes,
        // unsolicited.
        let all = ndisc::ALL_NODES;
        let flags = ndisc::NeighborFlags::OVERRIDE;
        return write_nd(buf, me, ipv6_multicast_mac(&all), all, &na(flags));
    }
    let flags = ndisc::NeighborFlags::SOLICITED | ndisc::NeighborFlags::OVERRIDE;
    write_nd(buf, me, dst_mac, *dst_ip, &na(flags))
}

/// Writes the Ethernet and IPv6 headers and the Neighbor Discovery message `nd` (its checksum
/// included) from this host's link-local address to `dst_ip` at `dst_mac`; returns the length.
fn write_nd(
    buf: &mut [u8],
    me: &LocalAddrs,
    dst_mac: [u8; 6],
    dst_ip: Ipv6Addr,
    nd: &ndisc::Repr,
) -> Option<usize> {
    let len = ethernet::HEADER_LEN + ipv6::HEADER_LEN + nd.buffer_len();
    let frame = buf.get_mut(..len)?;
    let (eth_buf, rest) = frame.split_at_mut(ethernet::HEADER_LEN);
    let (ip_buf, icmp) = rest.split_at_mut(ipv6::HEADER_LEN);
    ethernet::Repr {
        src_addr: Address(me.mac),
        dst_addr: Address(dst_mac),
        vlan: None,
        ethertype: EtherType::Ipv6,
    }
    .emit(&mut ethernet::Frame::new_unchecked(eth_buf));
    ipv6::Repr {
        src_addr: me.ipv6_ll,
        dst_addr: dst_ip,
        next_header: IpProtocol::Icmpv6,
        payload_len: nd.buffer_len(),
        hop_limit: ndisc::HOP_LIMIT,
        dscp: 0,
        ecn: Ecn::NotEct,
        flow_label: 0,
    }
    .emit(&mut ipv6::Packet::new_unchecked(ip_buf));
    nd.emit(
        &me.ipv6_ll,
        &dst_ip,
        &mut ndisc::Packet::new_unchecked(icmp),
    );
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::Gid;

    fn me() -> LocalAddrs {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        LocalAddrs {
            mac,
            ipv4: Some(Ipv4Addr::new(198, 18, 0, 10)),
            ipv6_ll: Gid::link_local_from_mac(mac).to_ipv6(),
        }
    }

    fn peer() -> LocalAddrs {
        let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
        LocalAddrs {
            mac,
            ipv4: Some(Ipv4Addr::new(198, 18, 0, 1)),
            ipv6_ll: Gid::link_local_from_mac(mac).to_ipv6(),
        }
    }

    #[test]
    fn arp_request_and_reply_round_trip() {
        let (a, b) = (me(), peer());
        let mut buf = [0u8; 64];
        let n = write_arp(&mut buf, &a, a.ipv4.unwrap(), b.ipv4.unwrap(), None).unwrap();
        match classify(&buf[..n], &b) {
            Received::Arp {
                request: true,
                sender_mac,
                sender_ip,
                target_ip,
            } => {
                assert_eq!(sender_mac, a.mac);
                assert_eq!(sender_ip, a.ipv4.unwrap());
                assert_eq!(target_ip, b.ipv4.unwrap());
            }
            other => panic!("{other:?}"),
        }
        let n = write_arp(&mut buf, &b, b.ipv4.unwrap(), a.ipv4.unwrap(), Some(a.mac)).unwrap();
        assert!(matches!(
            classify(&buf[..n], &a),
            Received::Arp { request: false, sender_mac, .. } if sender_mac == b.mac
        ));
        // A reply to someone else's MAC is not ours.
        assert!(matches!(
            classify(&buf[..n], &peer()),
            Received::Ignored(Ignored::NotForUs)
        ));
    }

    #[test]
    fn neighbor_discovery_round_trip() {
        let (a, b) = (me(), peer());
        let mut buf = [0u8; 128];
        let n = write_neighbor_solicit(&mut buf, &a, &b.ipv6_ll).unwrap();
        assert_eq!(&buf[..2], &[0x33, 0x33]);
        let (src_ip, src_mac) = match classify(&buf[..n], &b) {
            Received::NeighborSolicit {
                src_ip,
                src_mac,
                sender_ll,
                target,
            } => {
                assert_eq!(target, b.ipv6_ll);
                assert_eq!(sender_ll, Some(a.mac));
                (src_ip, src_mac)
            }
            other => panic!("{other:?}"),
        };
        // Not for a third host.
        let mut c = peer();
        c.ipv6_ll = "fe80::1".parse().unwrap();
        assert!(matches!(
            classify(&buf[..n], &c),
            Received::Ignored(Ignored::NotForUs)
        ));
        let n = write_neighbor_advert(&mut buf, &b, &src_ip, src_mac, &b.ipv6_ll).unwrap();
        match classify(&buf[..n], &a) {
            Received::NeighborAdvert { target, mac } => {
                assert_eq!(target, b.ipv6_ll);
                assert_eq!(mac, b.mac);
            }
            other => panic!("{other:?}"),
        }
        // A corrupted checksum is refused.
        buf[n - 1] ^= 1;
        assert!(matches!(
            classify(&buf[..n], &a),
            Received::Ignored(Ignored::Malformed)
        ));
    }

    #[test]
    fn neighbor_discovery_wire_bytes() {
        // The ICMPv6 messages after the Ethernet and IPv6 headers, checksums computed independently
        // (the golden bytes of roce::ndisc's tests use the same two hosts).
        const NS: [u8; 32] = [
            0x87, 0x00, 0x85, 0x9a, 0x00, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x50, 0x54, 0x00, 0xff, 0xfe, 0xab, 0xcd, 0xef, 0x01, 0x01, 0x52, 0x54,
            0x00, 0x12, 0x34, 0x56,
        ];
        const NA: [u8; 32] = [
            0x88, 0x00, 0x39, 0x97, 0x60, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x50, 0x54, 0x00, 0xff, 0xfe, 0xab, 0xcd, 0xef, 0x02, 0x01, 0x52, 0x54,
            0x00, 0xab, 0xcd, 0xef,
        ];
        let (a, b) = (me(), peer());
        let headers = ethernet::HEADER_LEN + ipv6::HEADER_LEN;
        let frame_len = headers + NS.len();
        let mut buf = [0xa5u8; 128];
        let n = write_neighbor_solicit(&mut buf, &a, &b.ipv6_ll).unwrap();
        assert_eq!(n, frame_len);
        assert_eq!(&buf[..6], &[0x33, 0x33, 0xff, 0xab, 0xcd, 0xef]);
        assert_eq!(&buf[6..12], &a.mac);
        assert_eq!(&buf[12..14], &[0x86, 0xdd]);
        // IPv6: version 6, payload 32 bytes, next header 58, hop limit 255, to ff02::1:ffab:cdef.
        assert_eq!(&buf[14..22], &[0x60, 0, 0, 0, 0, 32, 58, 255]);
        assert_eq!(&buf[38..54], &solicited_node(&b.ipv6_ll).octets());
        assert_eq!(buf[headers..n], NS);
        let n = write_neighbor_advert(&mut buf, &b, &a.ipv6_ll, a.mac, &b.ipv6_ll).unwrap();
        assert_eq!(n, frame_len);
        assert_eq!(&buf[..6], &a.mac);
        assert_eq!(buf[headers..n], NA);
        // To all-nodes, unsolicited, when the solicitation came from `::`.
        let n =
            write_neighbor_advert(&mut buf, &b, &Ipv6Addr::UNSPECIFIED, a.mac, &b.ipv6_ll).unwrap();
        assert_eq!(&buf[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(buf[headers + 4], 0x20, "Override only");
        assert_eq!(buf[headers..headers + 2], [0x88, 0]);
        assert_eq!(n, frame_len);
    }

    #[test]
    fn roce_headers_round_trip_v4_and_v6() {
        let (a, b) = (me(), peer());
        for v6 in [false, true] {
            let (src_ip, dst_ip) = if v6 {
                (IpAddr::V6(a.ipv6_ll), IpAddr::V6(b.ipv6_ll))
            } else {
                (IpAddr::V4(a.ipv4.unwrap()), IpAddr::V4(b.ipv4.unwrap()))
            };
            let tx = Transmit {
                src_ip,
                dst_ip,
                src_port: 0xc0de,
                dst_port: udp::ROCEV2_PORT,
                ecn: Ecn::Ect0,
                dscp: 26,
                hop_limit: 64,
                flow_label: 0x12345,
                len: 5,
            };
            let mut buf = [0xa5u8; 200];
            let at = 100;
            buf[at..at + 5].copy_from_slice(b"hello");
            let start = write_roce_headers(&mut buf, at, &tx, a.mac, b.mac).unwrap();
            assert_eq!(at - start, roce_headers_len(&dst_ip));
            match classify(&buf[start..at + 5], &b) {
                Received::Roce(d) => {
                    assert_eq!(d.src_ip, src_ip);
                    assert_eq!(d.dst_ip, dst_ip);
                    assert_eq!(d.src_port, 0xc0de);
                    assert_eq!(d.ecn, Ecn::Ect0);
                    assert_eq!(d.dscp, 26);
                    assert_eq!(d.hop_limit, 64);
                    assert_eq!(d.payload, b"hello");
                    assert_eq!(d.ip_ident, Some(0));
                }
                other => panic!("{other:?}"),
            }
            // Not to us: ignored. Truncated: malformed.
            assert!(matches!(
                classify(&buf[start..at + 5], &a),
                Received::Ignored(Ignored::NotForUs)
            ));
            assert!(matches!(
                classify(&buf[start..at + 2], &b),
                Received::Ignored(Ignored::Malformed)
            ));
        }
    }

    #[test]
    fn classify_never_panics() {
        let b = peer();
        let mut frame = vec![0u8; 120];
        frame[..6].copy_from_slice(&b.mac);
        for ethertype in [0x0806u16, 0x0800, 0x86dd, 0x8100] {
            frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
            for len in 0..frame.len() {
                for fill in [0u8, 0x45, 0x60, 0xff] {
                    let mut f = frame.clone();
                    f[14..].fill(fill);
                    let _ = classify(&f[..len], &b);
                }
            }
        }
    }
}
