//! Global identifiers (GIDs).
//!
//! A **GID** is the 128-bit address of an InfiniBand port (IBTA vol. 1 §4.1.1): a 64-bit subnet prefix
//! followed by a 64-bit interface ID, laid out exactly like an IPv6 address. On RoCEv2 a port's GID table
//! holds the IP addresses of its network interface (IBTA Annex A17, RoCEv2): IPv6 addresses as they are, IPv4
//! addresses as IPv4-mapped IPv6 addresses `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2). The GID chosen for a
//! connection (source GID, destination GID in the address handle) becomes the IP source and destination
//! address of its packets. The default GID 0 of an Ethernet port is the link-local address derived from
//! the MAC address (`fe80::/64` + modified EUI-64, RFC 4291 §2.5.1 and Appendix A).

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier, in network byte order (IBTA vol. 1 §4.1.1; rdma-core `union ibv_gid`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid([u8; 16]);

impl Gid {
    /// Length of a GID in bytes.
    pub const LEN: usize = 16;

    /// The zero GID `::` (an unused GID table entry in rdma-core / Linux).
    pub const ZERO: Gid = Gid([0; 16]);

    /// A GID from its 16 bytes in network byte order (as in a GRH or `ibv_gid.raw`).
    #[inline]
    pub const fn from_bytes(bytes: [u8; 16]) -> Gid {
        Gid(bytes)
    }

    /// The 16 bytes in network byte order.
    #[inline]
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// A GID from its two 64-bit halves (host-order values of `ibv_gid.global.subnet_prefix` and
    /// `.interface_id`, which rdma-core stores big-endian).
    #[inline]
    pub const fn from_parts(subnet_prefix: u64, interface_id: u64) -> Gid {
        Gid((((subnet_prefix as u128) << 64) | interface_id as u128).to_be_bytes())
    }

    /// The upper 64 bits, the subnet prefix (IBTA vol. 1 §4.1.1; `fe80::` = 0xFE80_0000_0000_0000 for
    /// link-local GIDs).
    #[inline]
    pub const fn subnet_prefix(&self) -> u64 {
        (u128::from_be_bytes(self.0) >> 64) as u64
    }

    /// The lower 64 bits, the interface ID (IBTA vol. 1 §4.1.1; the port GUID on InfiniBand, a modified
    /// EUI-64 or IPv4-mapped address on RoCE).
    #[inline]
    pub const fn interface_id(&self) -> u64 {
        u128::from_be_bytes(self.0) as u64
    }

    /// `true` for the zero GID `::`.
    #[inline]
    pub const fn is_zero(&self) -> bool {
        u128::from_be_bytes(self.0) == 0
    }

    /// `true` for an IPv4-mapped GID `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2): the GID of an IPv4 address
    /// on RoCEv2, whose packets are sent over IPv4.
    #[inline]
    pub const fn is_ipv4_mapped(&self) -> bool {
        (u128::from_be_bytes(self.0) >> 32) == 0xFFFF
    }

    /// The link-local GID of an Ethernet port: `fe80::/64` followed by the modified EUI-64 interface ID of
    /// `mac` (RFC 4291 §2.5.1 and Appendix A: insert `ff:fe` between the third and fourth MAC bytes and
    /// flip the universal/local bit, 0x02 of the first byte). This is GID index 0 of a RoCE port.
    ///
    /// Example: MAC `52:54:00:12:34:56` gives `fe80::5054:ff:fe12:3456`.
    pub const fn link_local_from_mac(mac: [u8; 6]) -> Gid {
        Gid([
            0xFE,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            mac[0] ^ 0x02,
            mac[1],
            mac[2],
            0xFF,
            0xFE,
            mac[3],
            mac[4],
            mac[5],
        ])
    }

    /// The GID as an IPv6 address (IPv4-mapped GIDs stay IPv4-mapped).
    #[inline]
    pub const fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from_bits(u128::from_be_bytes(self.0))
    }

    /// The IP address the GID stands for on RoCEv2: IPv4 for an IPv4-mapped GID, IPv6 otherwise.
    #[inline]
    pub const fn to_ip(&self) -> IpAddr {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2).
    fn from(addr: Ipv4Addr) -> Gid {
        Gid(addr.to_ipv6_mapped().octets())
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Gid {
        Gid(addr.octets())
    }
}

impl From<IpAddr> for Gid {
    /// IPv4 addresses become IPv4-mapped GIDs, IPv6 addresses are taken as they are.
    fn from(addr: IpAddr) -> Gid {
        match addr {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Ipv6Addr {
        gid.to_ipv6()
    }
}

impl From<[u8; 16]> for Gid {
    fn from(bytes: [u8; 16]) -> Gid {
        Gid(bytes)
    }
}

impl From<Gid> for [u8; 16] {
    fn from(gid: Gid) -> [u8; 16] {
        gid.0
    }
}

impl fmt::Display for Gid {
    /// The GID as an IPv6 address (RFC 5952 text form), as `ibv_devinfo -v` and
    /// `/sys/class/infiniband/*/ports/*/gids/*` show it; IPv4-mapped GIDs print as `::ffff:a.b.c.d`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::string::ToString;

    #[test]
    fn ipv4_mapped() {
        let gid = Gid::from(Ipv4Addr::new(192, 168, 0, 7));
        assert_eq!(
            gid.as_bytes(),
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 0, 7]
        );
        assert!(gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), IpAddr::V4(Ipv4Addr::new(192, 168, 0, 7)));
        assert_eq!(gid.to_string(), "::ffff:192.168.0.7");
        assert_eq!(gid.subnet_prefix(), 0);
        assert_eq!(gid.interface_id(), 0x0000_FFFF_C0A8_0007);
        assert_eq!(Gid::from(IpAddr::V4(Ipv4Addr::new(192, 168, 0, 7))), gid);
    }

    #[test]
    fn ipv6() {
        let addr: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let gid = Gid::from(addr);
        assert!(!gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), IpAddr::V6(addr));
        assert_eq!(gid.to_string(), "2001:db8::1");
        assert_eq!(Ipv6Addr::from(gid), addr);
        assert_eq!(gid.subnet_prefix(), 0x2001_0DB8_0000_0000);
        assert_eq!(gid.interface_id(), 1);
        assert_eq!(
            Gid::from_parts(gid.subnet_prefix(), gid.interface_id()),
            gid
        );
        assert_eq!(std::format!("{gid:?}"), "Gid(2001:db8::1)");
        // IPv4-compatible (deprecated, ::a.b.c.d) is not IPv4-mapped.
        let compat = Gid::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
        assert!(!compat.is_ipv4_mapped());
        assert!(matches!(compat.to_ip(), IpAddr::V6(_)));
    }

    #[test]
    fn link_local_from_mac() {
        // The example of RFC 4291 Appendix A style: a QEMU MAC address.
        let gid = Gid::link_local_from_mac([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(gid.to_string(), "fe80::5054:ff:fe12:3456");
        assert_eq!(gid.subnet_prefix(), 0xFE80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x5054_00FF_FE12_3456);
        // A locally administered MAC gets the U/L bit cleared.
        let gid = Gid::link_local_from_mac([0x02, 0, 0, 0, 0, 1]);
        assert_eq!(gid.to_string(), "fe80::ff:fe00:1");
    }

    #[test]
    fn zero() {
        assert!(Gid::ZERO.is_zero());
        assert_eq!(Gid::default(), Gid::ZERO);
        assert_eq!(Gid::ZERO.to_string(), "::");
        assert!(!Gid::ZERO.is_ipv4_mapped());
        assert!(!Gid::from(Ipv4Addr::UNSPECIFIED).is_zero());
    }

    proptest! {
        #[test]
        fn bytes_and_parts_round_trip(bytes in any::<[u8; 16]>()) {
            let gid = Gid::from_bytes(bytes);
            prop_assert_eq!(<[u8; 16]>::from(gid), bytes);
            prop_assert_eq!(Gid::from_parts(gid.subnet_prefix(), gid.interface_id()), gid);
            prop_assert_eq!(Gid::from(gid.to_ip()), gid);
            let text = gid.to_string();
            let parsed: Ipv6Addr = text.parse().unwrap();
            prop_assert_eq!(Gid::from(parsed), gid);
        }

        #[test]
        fn v4_round_trip(bits in any::<u32>()) {
            let v4 = Ipv4Addr::from(bits);
            let gid = Gid::from(v4);
            prop_assert!(gid.is_ipv4_mapped());
            prop_assert_eq!(gid.to_ip(), IpAddr::V4(v4));
        }
    }
}
