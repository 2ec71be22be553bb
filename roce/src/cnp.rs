//! RoCEv2 Congestion Notification Packet (CNP, IBTA vol. 1 Annex A17.9.3).
//!
//! RoCEv2 congestion control (DCQCN) works in three steps: a switch whose queue builds up marks
//! packets ECN Congestion Experienced in the IP header; the receiving NIC (the *notification point*)
//! answers the marked flow with a CNP to the sender's QP; the sending NIC (the *reaction point*) lowers
//! that QP's rate. A CNP is a BTH with opcode 0x81 followed by 16 reserved bytes (and the ICRC):
//!
//! ```text
//! | BTH: opcode 0x81, DestQP = QP to throttle, PSN 0, BECN 1 | 16 reserved bytes (0) | ICRC |
//! ```
//!
//! BTH fields of a CNP: SE, MigReq, PadCnt, TVer, AckReq and PSN are 0; P_Key is the flow's P_Key
//! (0xFFFF, the default partition, in practice); DestQP is the *sender's* QP, the one to slow down.
//! FECN is 0 and BECN is 1: IBTA §9.2 defines BECN as set in an ACK or CN BTH, Mellanox's "RoCEv2 CNP
//! Packet Format Example" shows a ConnectX CNP with byte 4 = 0x40, and scapy's `contrib/roce.py`
//! `cnp()` builds the same bytes. Receivers ignore the reserved bytes, FECN/BECN and the PSN.

use crate::bth;
use crate::error::check_len;
use crate::opcode::Opcode;
use crate::wire_field::U24_MASK;
use crate::{Error, Layer, Result};

/// The CNP opcode (Annex A17.9.3): 0x81, transport class `100` (CN).
pub const OPCODE: Opcode = Opcode::Cnp;

/// Length in bytes of the reserved field after the BTH (Annex A17.9.3): 16, sent as zeros.
pub const PAYLOAD_LEN: usize = 16;

/// Length in bytes of a CNP from the start of the BTH to the ICRC, exclusive: 12 + 16 = 28.
pub const BUFFER_LEN: usize = bth::HEADER_LEN + PAYLOAD_LEN;

/// A CNP (Annex A17.9.3): everything it says is which QP to throttle, in which partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The QP whose send rate the receiver of the CNP reduces (BTH DestQP, 24 bits; higher bits are
    /// masked away on emit).
    pub dest_qpn: u32,
    /// BTH P_Key.
    pub pkey: u16,
}

impl Repr {
    /// The BTH of this CNP: opcode 0x81, DestQP and P_Key from `self`, BECN 1, everything else 0
    /// (see the module docs for the sources).
    pub const fn bth_repr(&self) -> bth::Repr {
        bth::Repr {
            opcode: OPCODE,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: self.pkey,
            fecn: false,
            becn: true,
            dest_qpn: self.dest_qpn & U24_MASK,
            ack_req: false,
            psn: 0,
        }
    }

    /// Parses a CNP from its parsed BTH and the bytes after the BTH, up to but excluding the ICRC.
    /// The reserved bytes, FECN/BECN, the PSN and the other BTH flags are ignored.
    ///
    /// # Errors
    /// * [`Error::Malformed`] `{ layer: Cnp, .. }` if the BTH opcode is not 0x81;
    /// * [`Error::Truncated`] `{ layer: Cnp, need: 16, .. }` if `payload` is shorter than 16 bytes;
    /// * [`Error::BadLength`]`(Cnp)` if it is longer.
    pub fn parse(bth: &bth::Repr, payload: &[u8]) -> Result<Repr> {
        if bth.opcode != OPCODE {
            return Err(Error::Malformed {
                layer: Layer::Cnp,
                what: "BTH opcode is not CNP (0x81)",
            });
        }
        check_len(Layer::Cnp, PAYLOAD_LEN, payload.len())?;
        if payload.len() > PAYLOAD_LEN {
            return Err(Error::BadLength(Layer::Cnp));
        }
        Ok(Repr {
            dest_qpn: bth.dest_qpn,
            pkey: bth.pkey,
        })
    }

    /// Parses a CNP from a BTH view whose buffer ends where the ICRC starts (28 bytes).
    ///
    /// # Errors
    /// Those of [`bth::Repr::parse`] (truncated BTH, TVer, unknown opcode), then those of
    /// [`Repr::parse`].
    pub fn parse_packet<T: AsRef<[u8]>>(packet: &bth::Packet<T>) -> Result<Repr> {
        let bth_repr = bth::Repr::parse(packet)?;
        Repr::parse(&bth_repr, packet.payload())
    }

    /// Length in bytes that [`Repr::emit`] writes: [`BUFFER_LEN`] (28), BTH and reserved bytes; the
    /// caller appends the 4-byte ICRC.
    pub const fn buffer_len(&self) -> usize {
        BUFFER_LEN
    }

    /// Writes the BTH ([`Repr::bth_repr`]) and 16 zero bytes into the first 28 bytes of `packet`.
    ///
    /// # Panics
    /// If the buffer is shorter than [`BUFFER_LEN`] (28 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut bth::Packet<T>) {
        self.bth_repr().emit(packet);
        packet.payload_mut()[..PAYLOAD_LEN].fill(0);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // scapy 2.5 (contrib/roce.py): raw(BTH(opcode=0x81, becn=1, dqpn=0xd2, icrc=0)/CNPPadding())
    // without the ICRC, i.e. what `cnp(0xd2)` builds. Byte for byte the ConnectX capture in Mellanox's
    // "RoCEv2 CNP Packet Format Example" (81 00 ff ff 40 00 00 d2 00 ...).
    static BYTES: [u8; 28] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x00, 0xd2, 0x00, 0x00, 0x00, 0x00, // BTH
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const REPR: Repr = Repr {
        dest_qpn: 0xd2,
        pkey: 0xffff,
    };

    #[test]
    fn parse_golden() {
        let p = bth::Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::Cnp);
        assert!(p.becn() && !p.fecn());
        assert_eq!(p.psn(), 0);
        assert_eq!(Repr::parse_packet(&p), Ok(REPR));
        let b = bth::Repr::parse(&p).unwrap();
        assert_eq!(b, REPR.bth_repr());
        assert_eq!(Repr::parse(&b, p.payload()), Ok(REPR));
    }

    #[test]
    fn emit_golden() {
        let mut buf = [0xa5u8; 28];
        REPR.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(REPR.buffer_len(), 28);
    }

    #[test]
    fn reserved_content_ignored() {
        let mut bytes = BYTES;
        bytes[12..].fill(0xee);
        bytes[4] = 0x80; // FECN instead of BECN
        bytes[11] = 0x07; // non-zero PSN
        let p = bth::Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse_packet(&p), Ok(REPR));
    }

    #[test]
    fn wrong_opcode() {
        let b = bth::Repr {
            opcode: Opcode::RcAcknowledge,
            ..REPR.bth_repr()
        };
        assert!(matches!(
            Repr::parse(&b, &[0; 16]),
            Err(Error::Malformed {
                layer: Layer::Cnp,
                ..
            })
        ));
    }

    #[test]
    fn bad_lengths() {
        let b = REPR.bth_repr();
        for len in 0..PAYLOAD_LEN {
            assert_eq!(
                Repr::parse(&b, &BYTES[12..12 + len]),
                Err(Error::Truncated {
                    layer: Layer::Cnp,
                    need: 16,
                    got: len
                })
            );
        }
        assert_eq!(Repr::parse(&b, &[0; 20]), Err(Error::BadLength(Layer::Cnp)));
        for len in 0..bth::HEADER_LEN {
            assert!(matches!(
                bth::Packet::new_checked(&BYTES[..len]),
                Err(Error::Truncated { .. })
            ));
            assert!(Repr::parse_packet(&bth::Packet::new_unchecked(&BYTES[..len])).is_err());
        }
    }

    proptest! {
        #[test]
        fn round_trip(dest_qpn in 0u32..=U24_MASK, pkey: u16) {
            let repr = Repr { dest_qpn, pkey };
            let mut buf = [0xa5u8; BUFFER_LEN];
            repr.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(&buf[12..], &[0u8; 16][..]);
            let p = bth::Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Repr::parse_packet(&p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = bth::Packet::new_checked(&data[..]) {
                let _ = Repr::parse_packet(&p);
            }
        }
    }
}
