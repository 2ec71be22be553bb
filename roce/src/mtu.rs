//! Path MTU, packet counts and pad bytes.
//!
//! InfiniBand splits every message into packets whose payload is exactly the **path MTU** (PMTU), except
//! the last (IBTA vol. 1 ch. 9: every packet of a multi-packet message but the last carries PMTU bytes).
//! The PMTU is one of five powers of two, 256 to 4096 bytes, encoded 1..=5 (the IBTA vol. 1 PortInfo
//! MTU encoding, §14.2.5.6; rdma-core `enum ibv_mtu`). Unlike IP's MTU it counts **payload bytes
//! only**: the headers (IP, UDP, BTH, extended headers) and the ICRC come on top. So on RoCEv2 the PMTU
//! must be chosen so that payload plus headers fit the Ethernet link MTU: a 1500-byte link carries
//! PMTU 1024, a 4200-byte (jumbo) link PMTU 4096 (see [`PathMtu::from_link_mtu`]).
//!
//! The payload of each packet is padded to a multiple of 4 bytes; the BTH PadCnt field says how many pad
//! bytes were added (IBTA vol. 1 §9.2, [`pad_cnt`]).

use crate::{Error, Layer, Result};
use core::fmt;

/// Header bytes that Linux rxe assumes on top of the PMTU when it derives the PMTU from the link MTU:
/// `RXE_MAX_HDR_LENGTH` = 80 = IPv6 40 + UDP 8 + BTH 12 + RETH 16 + ICRC 4 (`rxe_hdr.h`,
/// `eth_mtu_int_to_enum` in `rxe_param.h`).
///
/// It is not the worst case: RDMA WRITE Only with Immediate over IPv6 carries RETH and ImmDt, 84 bytes of
/// headers; over IPv4 the same packet needs 64. 80 is what rxe uses, so [`PathMtu::from_link_mtu`] uses it
/// too.
pub const RXE_HEADER_OVERHEAD: usize = 80;

/// Path MTU: the payload bytes per packet (IBTA vol. 1 §14.2.5.6 PortInfo MTU encoding; rdma-core
/// `enum ibv_mtu`, `IBV_MTU_256 = 1` .. `IBV_MTU_4096 = 5`). The discriminant is the wire / verbs code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum PathMtu {
    /// 256 bytes (code 1).
    Mtu256 = 1,
    /// 512 bytes (code 2).
    Mtu512 = 2,
    /// 1024 bytes (code 3).
    Mtu1024 = 3,
    /// 2048 bytes (code 4).
    Mtu2048 = 4,
    /// 4096 bytes (code 5).
    Mtu4096 = 5,
}

impl PathMtu {
    /// Every path MTU, smallest first.
    pub const ALL: [PathMtu; 5] = [
        PathMtu::Mtu256,
        PathMtu::Mtu512,
        PathMtu::Mtu1024,
        PathMtu::Mtu2048,
        PathMtu::Mtu4096,
    ];

    /// The code 1..=5 (IBTA PortInfo MTU encoding, `enum ibv_mtu`).
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Payload bytes per packet: 256, 512, 1024, 2048 or 4096.
    #[inline]
    pub const fn bytes(self) -> usize {
        128 << (self as u8)
    }

    /// The path MTU of exactly `bytes` payload bytes; `None` unless `bytes` is 256, 512, 1024, 2048
    /// or 4096.
    pub const fn from_bytes(bytes: usize) -> Option<PathMtu> {
        match bytes {
            256 => Some(PathMtu::Mtu256),
            512 => Some(PathMtu::Mtu512),
            1024 => Some(PathMtu::Mtu1024),
            2048 => Some(PathMtu::Mtu2048),
            4096 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }

    /// The largest path MTU whose packets fit a link: the largest PMTU with
    /// `pmtu + header_overhead <= link_mtu_bytes`, or `None` if not even 256 fits.
    ///
    /// `link_mtu_bytes` is the link's IP MTU (the Linux netdev `mtu`: the largest IP packet, without
    /// Ethernet header, VLAN tag and FCS). `header_overhead` is the bytes every packet adds to its
    /// payload: IP header (IPv4 20 / IPv6 40) + UDP 8 + BTH 12 + the largest extended headers used
    /// (RETH 16, ImmDt 4, DETH 8, AETH 4, ...) + ICRC 4. Pad bytes need no room: a PMTU is a multiple of
    /// 4, so only a last packet, which is shorter than the PMTU, is padded.
    pub const fn largest_fitting(link_mtu_bytes: usize, header_overhead: usize) -> Option<PathMtu> {
        let room = link_mtu_bytes.saturating_sub(header_overhead);
        if room >= 4096 {
            Some(PathMtu::Mtu4096)
        } else if room >= 2048 {
            Some(PathMtu::Mtu2048)
        } else if room >= 1024 {
            Some(PathMtu::Mtu1024)
        } else if room >= 512 {
            Some(PathMtu::Mtu512)
        } else if room >= 256 {
            Some(PathMtu::Mtu256)
        } else {
            None
        }
    }

    /// The path MTU Linux rxe picks for a link MTU (`rxe_set_mtu` -> `eth_mtu_int_to_enum`):
    /// [`largest_fitting`](Self::largest_fitting) with [`RXE_HEADER_OVERHEAD`] (80 bytes). 1500 gives
    /// 1024, 4200 gives 4096. `None` below 336 bytes, where rxe falls back to 256 anyway
    /// (`mtu ? ... : IB_MTU_256`); callers that want rxe's exact result use `.unwrap_or(PathMtu::Mtu256)`
    /// (rxe also caps the result at the device's `max_mtu`, 4096).
    pub const fn from_link_mtu(link_mtu_bytes: usize) -> Option<PathMtu> {
        Self::largest_fitting(link_mtu_bytes, RXE_HEADER_OVERHEAD)
    }

    /// Packets needed for a message of `message_len` bytes at this PMTU: `ceil(message_len / pmtu)`, and
    /// 1 for a zero-length message (which is sent as one packet with no payload, IBTA vol. 1 ch. 9).
    /// Message lengths are 32-bit (`ibv_sge.length`, RETH DMA Length), so the result fits a `u32`
    /// (at most 2^24).
    #[inline]
    pub const fn num_packets(self, message_len: u32) -> u32 {
        if message_len == 0 {
            1
        } else {
            message_len.div_ceil(self.bytes() as u32)
        }
    }
}

impl TryFrom<u8> for PathMtu {
    type Error = Error;

    /// The path MTU for a code 1..=5 (IBTA PortInfo MTU encoding, `enum ibv_mtu`).
    ///
    /// # Errors
    /// [`Error::Malformed`] (layer [`Layer::Payload`]) for any other code.
    fn try_from(code: u8) -> Result<PathMtu> {
        match code {
            1 => Ok(PathMtu::Mtu256),
            2 => Ok(PathMtu::Mtu512),
            3 => Ok(PathMtu::Mtu1024),
            4 => Ok(PathMtu::Mtu2048),
            5 => Ok(PathMtu::Mtu4096),
            _ => Err(Error::Malformed {
                layer: Layer::Payload,
                what: "path MTU code is not 1..=5 (IBTA PortInfo MTU encoding)",
            }),
        }
    }
}

impl From<PathMtu> for u8 {
    fn from(mtu: PathMtu) -> u8 {
        mtu.code()
    }
}

impl fmt::Display for PathMtu {
    /// The payload size in bytes, e.g. `1024` (as `ibv_devinfo` prints `active_mtu: 1024 (3)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.bytes(), f)
    }
}

/// Pad bytes after a payload of `payload_len` bytes: `(4 - payload_len % 4) % 4`, in `0..=3`
/// (IBTA vol. 1 §9.2, BTH PadCnt: the payload is padded to a multiple of 4 bytes).
#[inline]
pub const fn pad_cnt(payload_len: usize) -> u8 {
    (payload_len.wrapping_neg() & 3) as u8
}

#[cfg(test)]
mod test {
    extern crate std;

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_and_bytes() {
        let bytes = [256, 512, 1024, 2048, 4096];
        for (i, mtu) in PathMtu::ALL.into_iter().enumerate() {
            assert_eq!(mtu.code() as usize, i + 1);
            assert_eq!(mtu.bytes(), bytes[i]);
            assert_eq!(PathMtu::from_bytes(bytes[i]), Some(mtu));
            assert_eq!(PathMtu::try_from(mtu.code()), Ok(mtu));
            assert_eq!(u8::from(mtu), mtu.code());
        }
        assert_eq!(PathMtu::from_bytes(1500), None);
        assert_eq!(PathMtu::from_bytes(0), None);
        assert!(PathMtu::try_from(0).is_err());
        assert!(PathMtu::try_from(6).is_err());
        assert_eq!(std::format!("{}", PathMtu::Mtu1024), "1024");
        assert!(PathMtu::Mtu256 < PathMtu::Mtu4096);
    }

    #[test]
    fn link_mtu_like_rxe() {
        assert_eq!(PathMtu::from_link_mtu(1500), Some(PathMtu::Mtu1024));
        assert_eq!(PathMtu::from_link_mtu(4200), Some(PathMtu::Mtu4096));
        assert_eq!(PathMtu::from_link_mtu(9000), Some(PathMtu::Mtu4096));
        assert_eq!(PathMtu::from_link_mtu(4176), Some(PathMtu::Mtu4096));
        assert_eq!(PathMtu::from_link_mtu(4175), Some(PathMtu::Mtu2048));
        assert_eq!(PathMtu::from_link_mtu(336), Some(PathMtu::Mtu256));
        assert_eq!(PathMtu::from_link_mtu(335), None);
        assert_eq!(PathMtu::from_link_mtu(0), None);
        // IPv4 SEND only: 20 + 8 + 12 + 4 = 44 bytes of overhead.
        assert_eq!(PathMtu::largest_fitting(1068, 44), Some(PathMtu::Mtu1024));
        assert_eq!(PathMtu::largest_fitting(1067, 44), Some(PathMtu::Mtu512));
        assert_eq!(
            PathMtu::largest_fitting(usize::MAX, 0),
            Some(PathMtu::Mtu4096)
        );
        assert_eq!(PathMtu::largest_fitting(100, usize::MAX), None);
    }

    #[test]
    fn packets_and_pad() {
        let m = PathMtu::Mtu1024;
        assert_eq!(m.num_packets(0), 1);
        assert_eq!(m.num_packets(1), 1);
        assert_eq!(m.num_packets(1024), 1);
        assert_eq!(m.num_packets(1025), 2);
        assert_eq!(PathMtu::Mtu256.num_packets(u32::MAX), 1 << 24);
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_cnt), [0, 3, 2, 1, 0, 3]);
        assert_eq!(pad_cnt(usize::MAX), 1);
    }

    /// rxe's rule, written out as in `rxe_mtu_int_to_enum(mtu - RXE_MAX_HDR_LENGTH)`.
    fn rxe_rule(link_mtu: i64) -> u8 {
        let mtu = link_mtu - 80;
        match mtu {
            m if m < 256 => 0,
            m if m < 512 => 1,
            m if m < 1024 => 2,
            m if m < 2048 => 3,
            m if m < 4096 => 4,
            _ => 5,
        }
    }

    proptest! {
        #[test]
        fn from_link_mtu_matches_rxe(link in 0usize..20_000) {
            let ours = PathMtu::from_link_mtu(link).map_or(0, PathMtu::code);
            prop_assert_eq!(ours, rxe_rule(link as i64));
        }

        #[test]
        fn largest_fitting_fits_and_is_largest(link in 0usize..20_000, overhead in 0usize..200) {
            match PathMtu::largest_fitting(link, overhead) {
                Some(m) => {
                    prop_assert!(m.bytes() + overhead <= link);
                    if let Ok(bigger) = PathMtu::try_from(m.code() + 1) {
                        prop_assert!(bigger.bytes() + overhead > link);
                    }
                }
                None => prop_assert!(256 + overhead > link),
            }
        }

        #[test]
        fn num_packets_covers_the_message(len in any::<u32>(), code in 1u8..=5) {
            let m = PathMtu::try_from(code).unwrap();
            let n = u64::from(m.num_packets(len));
            let pmtu = m.bytes() as u64;
            prop_assert!(n * pmtu >= u64::from(len));
            prop_assert!(n >= 1);
            if len > 0 {
                prop_assert!((n - 1) * pmtu < u64::from(len));
            }
        }

        #[test]
        fn pad_makes_a_multiple_of_four(len in any::<usize>()) {
            let pad = pad_cnt(len);
            prop_assert!(pad <= 3);
            prop_assert_eq!((len as u128 + u128::from(pad)) % 4, 0);
        }
    }
}
