//! ACK Extended Transport Header (AETH, IBTA vol. 1 §9.3.5, tables 42-45).
//!
//! An RC responder acknowledges requests with an AETH: in ACKNOWLEDGE packets (0x11), in ATOMIC
//! ACKNOWLEDGE (0x12, before the AtomicAckETH) and in RDMA READ Response First/Last/Only. 4 bytes:
//!
//! ```text
//!  0       1                       4
//! +-------+-----------------------+
//! |Syndrom|       MSN (24)        |
//! +-------+-----------------------+
//!
//! Syndrome byte (IBTA table 42):
//!   bit 7    6..5    4..0
//!   +---+--------+----------+
//!   | 0 |  type  |  value   |
//!   +---+--------+----------+
//!   type 00: ACK           value = credit count code (table 44), 31 = invalid/unlimited
//!   type 01: RNR NAK       value = RNR timer code (table 45)
//!   type 11: NAK           value = NAK code (table 43)
//!   type 10, or bit 7 set: reserved
//! ```
//!
//! * **MSN** (message sequence number, 24 bits): the number of the last request message the responder
//!   completed, modulo 2^24; the requester uses it to retire work requests (§9.7).
//! * A **positive ACK** may advertise end-to-end flow-control credits: how many receive WQEs the
//!   responder has posted ([`AckCredit`], table 44).
//! * An **RNR NAK** (receiver not ready) says no receive WQE was posted; the requester waits at least
//!   the [`RnrTimer`] delay (table 45) and retries.
//! * A **NAK** carries a [`NakCode`] (table 43): PSN sequence error (retry from the NAK's PSN), or a
//!   fatal error the requester reports in its completion.

use crate::error::check_len;
use crate::wire_field::{read_u24, write_u24};
use crate::{Layer, Result};

mod field {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

/// Length of the AETH in bytes (IBTA vol. 1 §9.3.5).
pub const HEADER_LEN: usize = field::MSN.end;

/// Mask of the 5-bit syndrome value (credit code, timer code or NAK code).
const VALUE_MASK: u8 = 0x1f;

/// Credit counts of codes 0..=30, IBTA vol. 1 table 44 "Credit count encodings". Code 31 is "invalid"
/// (the responder does not use end-to-end credits, e.g. with an SRQ).
const CREDIT_COUNTS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// RNR NAK delays in microseconds for codes 0..=31, IBTA vol. 1 table 45 "Encoding for RNR NAK timer
/// field" (the same table is in rdma-core's `ibv_modify_qp(3)` under `min_rnr_timer`). Code 0 is the
/// longest delay, 655.36 ms.
const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The 5-bit credit count code of a positive ACK (IBTA vol. 1 §9.7, table 44 "Credit count
/// encodings"): codes 0..=30 stand for 0, 1, 2, 3, 4, 6, 8, 12, ... 32768 receive WQEs; code 31 means
/// "invalid" (credits are not in use; the requester may send as if credits were unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckCredit(u8);

impl AckCredit {
    /// Code 31: no credit count (end-to-end flow control not in use, e.g. the QP uses an SRQ).
    pub const INVALID: AckCredit = AckCredit(31);

    /// The credit field for a 5-bit `code`; bits above the low 5 are dropped.
    pub const fn from_code(code: u8) -> AckCredit {
        AckCredit(code & VALUE_MASK)
    }

    /// The 5-bit code (0..=31).
    pub const fn code(self) -> u8 {
        self.0
    }

    /// Number of receive WQEs the code stands for (table 44), or `None` for code 31 (invalid).
    pub const fn count(self) -> Option<u32> {
        if (self.0 as usize) < CREDIT_COUNTS.len() {
            Some(CREDIT_COUNTS[self.0 as usize])
        } else {
            None
        }
    }

    /// The largest code whose count does not exceed `count` receive WQEs: what a responder advertises
    /// when `count` WQEs are posted (it must never overstate them). Counts above 32768 give code 30.
    pub const fn from_count(count: u32) -> AckCredit {
        let mut code = CREDIT_COUNTS.len() - 1;
        while CREDIT_COUNTS[code] > count {
            code -= 1;
        }
        AckCredit(code as u8)
    }
}

/// The 5-bit timer code of an RNR NAK (IBTA vol. 1 §9.7, table 45 "Encoding for RNR NAK timer
/// field"): the minimum time the requester waits before retrying; 1 -> 0.01 ms ... 31 -> 491.52 ms,
/// and 0 -> 655.36 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RnrTimer(u8);

impl RnrTimer {
    /// The timer field for a 5-bit `code`; bits above the low 5 are dropped.
    pub const fn from_code(code: u8) -> RnrTimer {
        RnrTimer(code & VALUE_MASK)
    }

    /// The 5-bit code (0..=31).
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay in microseconds (table 45): 10 us for code 1 up to 491_520 us for code 31, and
    /// 655_360 us for code 0.
    pub const fn to_micros(self) -> u32 {
        RNR_TIMER_MICROS[(self.0 & VALUE_MASK) as usize]
    }

    /// The code with the shortest delay that is at least `micros` microseconds; delays above
    /// 491.52 ms give code 0 (655.36 ms), the longest.
    pub const fn from_micros_ceil(micros: u32) -> RnrTimer {
        let mut code = 1;
        while code < RNR_TIMER_MICROS.len() {
            if RNR_TIMER_MICROS[code] >= micros {
                return RnrTimer(code as u8);
            }
            code += 1;
        }
        RnrTimer(0)
    }
}

enum_with_unknown! {
    /// NAK code of a NAK syndrome (IBTA vol. 1 §9.3.5, table 43 "NAK codes"); 5 to 31 are reserved.
    pub enum NakCode(u8) {
        /// PSN sequence error (code 0): the responder expected another PSN; the requester retries from
        /// the expected PSN (the AETH's packet carries it in its BTH PSN).
        PsnSequenceError = 0,
        /// Invalid request (code 1): unsupported or malformed request; verbs `IBV_WC_REM_INV_REQ_ERR`.
        InvalidRequest = 1,
        /// Remote access error (code 2): R_Key or bounds violation; verbs `IBV_WC_REM_ACCESS_ERR`.
        RemoteAccessError = 2,
        /// Remote operational error (code 3): the responder could not complete; verbs
        /// `IBV_WC_REM_OP_ERR`.
        RemoteOperationalError = 3,
        /// Invalid RD request (code 4): reliable datagram only.
        InvalidRdRequest = 4,
    }
}

/// The AETH syndrome byte, decoded (IBTA vol. 1 §9.3.5 table 42). Every byte decodes: reserved types
/// come back as [`Syndrome::Reserved`], so parsing never fails on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement (type `00`), with the end-to-end credit count (table 44).
    Ack {
        /// Credit count code.
        credit: AckCredit,
    },
    /// Receiver-not-ready NAK (type `01`), with the minimum retry delay (table 45).
    RnrNak {
        /// RNR timer code.
        timer: RnrTimer,
    },
    /// NAK (type `11`) with its code (table 43). Emit writes the low 5 bits of an `Unknown` code.
    Nak(NakCode),
    /// A reserved encoding (type `10`, or bit 7 set): the raw syndrome byte, emitted unchanged.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte (table 42). Never fails.
    pub fn from_byte(byte: u8) -> Syndrome {
        let value = byte & VALUE_MASK;
        match byte >> 5 {
            0b000 => Syndrome::Ack {
                credit: AckCredit(value),
            },
            0b001 => Syndrome::RnrNak {
                timer: RnrTimer(value),
            },
            0b011 => Syndrome::Nak(NakCode::from(value)),
            _ => Syndrome::Reserved(byte),
        }
    }

    /// Encodes the syndrome byte (table 42). A `Nak(NakCode::Unknown(x))` is written as NAK code
    /// `x & 0x1f`; `Reserved(b)` is written as `b`.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit } => credit.code(),
            Syndrome::RnrNak { timer } => 0x20 | timer.code(),
            Syndrome::Nak(code) => 0x60 | (u8::from(code) & VALUE_MASK),
            Syndrome::Reserved(byte) => byte,
        }
    }

    /// Whether this is a positive ACK.
    pub const fn is_ack(&self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }

    /// Whether this is an RNR NAK or a NAK.
    pub const fn is_nak(&self) -> bool {
        matches!(self, Syndrome::RnrNak { .. } | Syndrome::Nak(_))
    }
}

/// A zero-copy view of an AETH (IBTA vol. 1 §9.3.5) at the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (4 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if `buffer` is shorter than 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole AETH (4 bytes).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) with `layer: Aeth` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Aeth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw syndrome byte (table 42).
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The decoded syndrome (table 42).
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }

    /// Message sequence number (24 bits, in the low bits of the `u32`).
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the raw syndrome byte.
    pub fn set_syndrome_byte(&mut self, value: u8) {
        self.buffer.as_mut()[field::SYNDROME] = value;
    }

    /// Sets the syndrome byte from a decoded [`Syndrome`] (see [`Syndrome::to_byte`]).
    pub fn set_syndrome(&mut self, value: Syndrome) {
        self.set_syndrome_byte(value.to_byte());
    }

    /// Sets the MSN; bits above the low 24 are dropped.
    pub fn set_msn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::MSN, value);
    }
}

/// A parsed AETH (IBTA vol. 1 §9.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// ACK, RNR NAK, NAK or a reserved encoding.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits; emit masks higher bits away).
    pub msn: u32,
}

impl Repr {
    /// Parses an AETH. Every bit pattern is accepted (reserved syndromes become
    /// [`Syndrome::Reserved`]; the responder/completer decides what to do with them).
    ///
    /// # Errors
    /// [`Error::Truncated`](crate::Error::Truncated) if the buffer is shorter than 4 bytes (only reachable through
    /// [`Packet::new_unchecked`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (4).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AETH into the first 4 bytes of `packet`, the MSN masked to 24 bits.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // scapy 2.5: raw(AETH(syndrome=0x61, msn=0x123456)) (contrib/roce.py); a NAK "invalid request".
    static NAK_BYTES: [u8; 4] = [0x61, 0x12, 0x34, 0x56];
    const NAK_REPR: Repr = Repr {
        syndrome: Syndrome::Nak(NakCode::InvalidRequest),
        msn: 0x12_3456,
    };

    // scapy 2.5: raw(AETH(syndrome=SYN, msn=0xfedcba)) for several syndromes.
    static SCAPY_SYNDROMES: [(u8, Syndrome); 7] = [
        (
            0x1f,
            Syndrome::Ack {
                credit: AckCredit::INVALID,
            },
        ),
        (
            0x00,
            Syndrome::Ack {
                credit: AckCredit(0),
            },
        ),
        (
            0x0e,
            Syndrome::Ack {
                credit: AckCredit(14),
            },
        ),
        (
            0x2e,
            Syndrome::RnrNak {
                timer: RnrTimer(14),
            },
        ),
        (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
        (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
        (0x40, Syndrome::Reserved(0x40)),
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&NAK_BYTES[..]).unwrap();
        assert_eq!(p.syndrome_byte(), 0x61);
        assert_eq!(p.syndrome(), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(p.msn(), 0x12_3456);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 4];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_syndrome(Syndrome::Nak(NakCode::InvalidRequest));
        p.set_msn(0x12_3456);
        assert_eq!(buf, NAK_BYTES);
        let mut buf = [0xa5u8; 4];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_syndrome_byte(0x61);
        p.set_msn(0xff12_3456);
        assert_eq!(buf, NAK_BYTES);
    }

    test_parse_and_emit!(NAK_BYTES, NAK_REPR);

    #[test]
    fn scapy_syndromes() {
        for &(byte, syndrome) in &SCAPY_SYNDROMES {
            let bytes = [byte, 0xfe, 0xdc, 0xba];
            let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
            assert_eq!(
                repr,
                Repr {
                    syndrome,
                    msn: 0xfe_dcba
                }
            );
            let mut buf = [0xa5u8; 4];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            assert_eq!(buf, bytes);
        }
    }

    #[test]
    fn every_syndrome_byte_decodes_and_round_trips() {
        for byte in 0..=255u8 {
            let s = Syndrome::from_byte(byte);
            assert_eq!(s.to_byte(), byte, "{byte:#04x}");
            let reserved = byte & 0x80 != 0 || byte >> 5 == 0b010;
            assert_eq!(matches!(s, Syndrome::Reserved(_)), reserved, "{byte:#04x}");
        }
        assert_eq!(
            Syndrome::from_byte(0x65),
            Syndrome::Nak(NakCode::Unknown(5))
        );
        assert_eq!(
            Syndrome::from_byte(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::Nak(NakCode::Unknown(0xe5)).to_byte(), 0x65);
        assert!(Syndrome::from_byte(0x20).is_nak() && !Syndrome::from_byte(0x20).is_ack());
        assert!(Syndrome::from_byte(0x1f).is_ack());
        assert!(!Syndrome::from_byte(0x40).is_ack() && !Syndrome::from_byte(0x40).is_nak());
    }

    #[test]
    fn credit_table_44() {
        let expect = [
            0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
            1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
        ];
        for (code, &count) in expect.iter().enumerate() {
            let c = AckCredit::from_code(code as u8);
            assert_eq!(c.count(), Some(count));
            assert_eq!(AckCredit::from_count(count), c);
        }
        assert_eq!(AckCredit::INVALID.count(), None);
        assert_eq!(AckCredit::from_code(0xff), AckCredit::INVALID);
        assert_eq!(AckCredit::from_count(5), AckCredit::from_code(4));
        assert_eq!(AckCredit::from_count(100), AckCredit::from_code(13));
        assert_eq!(AckCredit::from_count(u32::MAX), AckCredit::from_code(30));
    }

    #[test]
    fn rnr_timer_table_45() {
        assert_eq!(RnrTimer::from_code(0).to_micros(), 655_360);
        assert_eq!(RnrTimer::from_code(1).to_micros(), 10);
        assert_eq!(RnrTimer::from_code(12).to_micros(), 640);
        assert_eq!(RnrTimer::from_code(16).to_micros(), 2_560);
        assert_eq!(RnrTimer::from_code(31).to_micros(), 491_520);
        assert_eq!(RnrTimer::from_code(0x3f).code(), 31);
        // Codes 1..=31 are strictly increasing; from_micros_ceil inverts them.
        for code in 1..32u8 {
            let t = RnrTimer::from_code(code);
            assert_eq!(RnrTimer::from_micros_ceil(t.to_micros()), t);
            if code > 1 {
                assert!(t.to_micros() > RnrTimer::from_code(code - 1).to_micros());
                assert_eq!(
                    RnrTimer::from_micros_ceil(RnrTimer::from_code(code - 1).to_micros() + 1),
                    t
                );
            }
        }
        assert_eq!(RnrTimer::from_micros_ceil(0), RnrTimer::from_code(1));
        assert_eq!(RnrTimer::from_micros_ceil(491_521), RnrTimer::from_code(0));
    }

    test_truncated!(Layer::Aeth, NAK_BYTES);

    fn syndrome_strategy() -> impl Strategy<Value = Syndrome> {
        prop_oneof![
            (0u8..32).prop_map(|c| Syndrome::Ack {
                credit: AckCredit::from_code(c)
            }),
            (0u8..32).prop_map(|c| Syndrome::RnrNak {
                timer: RnrTimer::from_code(c)
            }),
            (0u8..32).prop_map(|c| Syndrome::Nak(NakCode::from(c))),
            prop_oneof![0x40u8..0x60, 0x80u8..=0xff].prop_map(Syndrome::Reserved),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(syndrome in syndrome_strategy(), msn in 0u32..=crate::wire_field::U24_MASK) {
            let repr = Repr { syndrome, msn };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }

    test_arbitrary_bytes_never_panic!(0..12);
}
