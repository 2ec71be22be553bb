//! Base Transport Header (BTH, IBTA vol. 1 §9.2).
//!
//! Every InfiniBand transport packet, and so every RoCEv2 packet (right after the UDP header), starts
//! with a 12-byte BTH:
//!
//! ```text
//!  byte 0    1                  2       4                5              8                9       12
//! +--------+-+-+---+----+--------------+-+-+------+---------------+-+-------+----------------+
//! | OpCode |S|M|Pad|TVer|    P_Key     |F|B| resv6|  DestQP (24)  |A| resv7 |   PSN (24)     |
//! +--------+-+-+---+----+--------------+-+-+------+---------------+-+-------+----------------+
//! ```
//!
//! * **OpCode** ([`Opcode`]): transport service and operation; it decides which extended headers follow
//!   (see [`crate::opcode`]).
//! * **SE** (solicited event): the responder should raise a completion event for this message.
//! * **M** (MigReq): automatic path migration state.
//! * **PadCnt**: 0-3 pad bytes appended to the payload so that payload + pad is a multiple of 4.
//! * **TVer**: transport header version, always 0.
//! * **P_Key**: partition key; sender and receiver must be members of the same partition.
//! * **FECN / BECN**: forward / backward explicit congestion notification bits. In RoCEv2 this whole
//!   byte (FECN, BECN and 6 reserved bits) is one of the fields the ICRC masks to ones (Annex A17.3.3),
//!   since switches may change it.
//! * **DestQP**: destination queue pair number (24 bits).
//! * **A** (AckReq): the requester asks the responder for an acknowledgement of this packet.
//! * **PSN**: packet sequence number (24 bits, wraps modulo 2^24).
//!
//! Reserved bits are transmitted as 0 and ignored on receive (IBTA §9.2).

use crate::error::check_len;
use crate::opcode::Opcode;
use crate::wire_field::{read_u16, read_u24, write_u16, write_u24};
use crate::{Error, Layer, Result};

pub(crate) mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5:4), TVer (bits 3:0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved (bits 5:0).
    pub const ECN: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    /// AckReq (bit 7), reserved (bits 6:0).
    pub const ACK_REQ: usize = 8;
    pub const PSN: Range<usize> = 9..12;

    pub const SE_BIT: u8 = 0x80;
    pub const MIG_REQ_BIT: u8 = 0x40;
    pub const PAD_CNT_MASK: u8 = 0x30;
    pub const PAD_CNT_SHIFT: u32 = 4;
    pub const TVER_MASK: u8 = 0x0f;
    pub const FECN_BIT: u8 = 0x80;
    pub const BECN_BIT: u8 = 0x40;
    pub const RESV6_MASK: u8 = 0x3f;
    pub const ACK_REQ_BIT: u8 = 0x80;
    pub const RESV7_MASK: u8 = 0x7f;
}

/// Length of the BTH in bytes (IBTA vol. 1 §9.2).
pub const HEADER_LEN: usize = field::PSN.end;

/// The only transport header version IBTA defines (§9.2: TVer = 0).
pub const TVER: u8 = 0;

/// A zero-copy view of a BTH (IBTA vol. 1 §9.2) at the start of `buffer`; the bytes after the first 12
/// are the [`payload`](Packet::payload) (extended headers, payload, pad, and ICRC if the buffer holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn get_bit(byte: u8, bit: u8) -> bool {
    byte & bit != 0
}

fn with_bit(byte: u8, bit: u8, value: bool) -> u8 {
    if value {
        byte | bit
    } else {
        byte & !bit
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (12 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buffer` is shorter than 12 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole BTH (12 bytes). It does not check the extended headers the
    /// opcode calls for; see [`Opcode::ext_headers_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] with `layer: Bth` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Bth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OpCode (byte 0).
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// SE, solicited event (byte 1 bit 7).
    pub fn solicited(&self) -> bool {
        get_bit(self.buffer.as_ref()[field::FLAGS], field::SE_BIT)
    }

    /// MigReq (byte 1 bit 6).
    pub fn mig_req(&self) -> bool {
        get_bit(self.buffer.as_ref()[field::FLAGS], field::MIG_REQ_BIT)
    }

    /// PadCnt: number of pad bytes (0-3) after the payload (byte 1 bits 5:4).
    pub fn pad_cnt(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & field::PAD_CNT_MASK) >> field::PAD_CNT_SHIFT
    }

    /// TVer, transport header version (byte 1 bits 3:0); must be [`TVER`] (0).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & field::TVER_MASK
    }

    /// P_Key, partition key (bytes 2-3).
    pub fn pkey(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PKEY)
    }

    /// FECN (byte 4 bit 7).
    pub fn fecn(&self) -> bool {
        get_bit(self.buffer.as_ref()[field::ECN], field::FECN_BIT)
    }

    /// BECN (byte 4 bit 6).
    pub fn becn(&self) -> bool {
        get_bit(self.buffer.as_ref()[field::ECN], field::BECN_BIT)
    }

    /// The 6 reserved bits of byte 4 (bits 5:0); transmitted as 0, ignored on receive.
    pub fn resv6(&self) -> u8 {
        self.buffer.as_ref()[field::ECN] & field::RESV6_MASK
    }

    /// DestQP, destination QP number (24 bits, bytes 5-7).
    pub fn dest_qpn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::DEST_QP)
    }

    /// AckReq (byte 8 bit 7).
    pub fn ack_req(&self) -> bool {
        get_bit(self.buffer.as_ref()[field::ACK_REQ], field::ACK_REQ_BIT)
    }

    /// The 7 reserved bits of byte 8 (bits 6:0); transmitted as 0, ignored on receive.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & field::RESV7_MASK
    }

    /// PSN, packet sequence number (24 bits, bytes 9-11).
    pub fn psn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::PSN)
    }

    /// The bytes after the BTH: extended headers, payload, pad (and the ICRC if the buffer includes it).
    ///
    /// # Panics
    /// If the buffer is shorter than 12 bytes (only possible with [`Packet::new_unchecked`]).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn update(&mut self, at: usize, f: impl FnOnce(u8) -> u8) {
        let b = &mut self.buffer.as_mut()[at];
        *b = f(*b);
    }

    /// Sets the OpCode.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = u8::from(value);
    }

    /// Sets SE.
    pub fn set_solicited(&mut self, value: bool) {
        self.update(field::FLAGS, |b| with_bit(b, field::SE_BIT, value));
    }

    /// Sets MigReq.
    pub fn set_mig_req(&mut self, value: bool) {
        self.update(field::FLAGS, |b| with_bit(b, field::MIG_REQ_BIT, value));
    }

    /// Sets PadCnt; only the low 2 bits of `value` are used.
    pub fn set_pad_cnt(&mut self, value: u8) {
        self.update(field::FLAGS, |b| {
            (b & !field::PAD_CNT_MASK) | ((value << field::PAD_CNT_SHIFT) & field::PAD_CNT_MASK)
        });
    }

    /// Sets TVer; only the low 4 bits of `value` are used.
    pub fn set_tver(&mut self, value: u8) {
        self.update(field::FLAGS, |b| {
            (b & !field::TVER_MASK) | (value & field::TVER_MASK)
        });
    }

    /// Sets the P_Key.
    pub fn set_pkey(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PKEY, value);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, value: bool) {
        self.update(field::ECN, |b| with_bit(b, field::FECN_BIT, value));
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, value: bool) {
        self.update(field::ECN, |b| with_bit(b, field::BECN_BIT, value));
    }

    /// Sets the 6 reserved bits of byte 4; only the low 6 bits of `value` are used (senders write 0).
    pub fn set_resv6(&mut self, value: u8) {
        self.update(field::ECN, |b| {
            (b & !field::RESV6_MASK) | (value & field::RESV6_MASK)
        });
    }

    /// Sets DestQP; bits above the low 24 are dropped.
    pub fn set_dest_qpn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::DEST_QP, value);
    }

    /// Sets AckReq.
    pub fn set_ack_req(&mut self, value: bool) {
        self.update(field::ACK_REQ, |b| with_bit(b, field::ACK_REQ_BIT, value));
    }

    /// Sets the 7 reserved bits of byte 8; only the low 7 bits of `value` are used (senders write 0).
    pub fn set_resv7(&mut self, value: u8) {
        self.update(field::ACK_REQ, |b| {
            (b & !field::RESV7_MASK) | (value & field::RESV7_MASK)
        });
    }

    /// Sets the PSN; bits above the low 24 are dropped.
    pub fn set_psn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::PSN, value);
    }

    /// The bytes after the BTH, writable.
    ///
    /// # Panics
    /// If the buffer is shorter than 12 bytes (only possible with [`Packet::new_unchecked`]).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A parsed BTH (IBTA vol. 1 §9.2). TVer is not a field: it is always 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode; parse only produces known opcodes.
    pub opcode: Opcode,
    /// SE, solicited event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// PadCnt, 0-3 pad bytes after the payload (emit keeps the low 2 bits).
    pub pad_cnt: u8,
    /// P_Key, partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP, 24 bits (emit masks higher bits away).
    pub dest_qpn: u32,
    /// AckReq.
    pub ack_req: bool,
    /// PSN, 24 bits (emit masks higher bits away).
    pub psn: u32,
}

impl Repr {
    /// Parses a BTH. Reserved bits are ignored (IBTA §9.2: "ignored on receive"). Checks, in order: the
    /// length, TVer, the opcode.
    ///
    /// # Errors
    /// * [`Error::Truncated`] if the buffer is shorter than 12 bytes;
    /// * [`Error::BadVersion`] `{ layer: Bth, version }` if TVer is not 0;
    /// * [`Error::UnknownOpcode`] if the opcode is not an RC/UC/UD opcode RoCEv2 uses nor the CNP
    ///   ([`Opcode::is_known`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let version = packet.tver();
        if version != TVER {
            return Err(Error::BadVersion {
                layer: Layer::Bth,
                version,
            });
        }
        let opcode = packet.opcode();
        if let Opcode::Unknown(raw) = opcode {
            return Err(Error::UnknownOpcode(raw));
        }
        Ok(Repr {
            opcode,
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_cnt: packet.pad_cnt(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qpn: packet.dest_qpn(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the emitted header in bytes: always [`HEADER_LEN`] (12).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH into the first 12 bytes of `packet`: TVer and reserved bits as 0, PadCnt masked
    /// to 2 bits, DestQP and PSN masked to 24 bits. The bytes after the BTH are not touched.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (12 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        // Assembled in a fixed array and stored with one copy: no per-field bounds checks, and
        // stores the ICRC pass of the packet builder can forward its loads from.
        let mut h = [0u8; HEADER_LEN];
        h[field::OPCODE] = u8::from(self.opcode);
        h[field::FLAGS] = with_bit(0, field::SE_BIT, self.solicited)
            | with_bit(0, field::MIG_REQ_BIT, self.mig_req)
            | ((self.pad_cnt << field::PAD_CNT_SHIFT) & field::PAD_CNT_MASK)
            | TVER;
        write_u16(&mut h, field::PKEY, self.pkey);
        h[field::ECN] =
            with_bit(0, field::FECN_BIT, self.fecn) | with_bit(0, field::BECN_BIT, self.becn);
        write_u24(&mut h, field::DEST_QP, self.dest_qpn);
        h[field::ACK_REQ] = with_bit(0, field::ACK_REQ_BIT, self.ack_req);
        write_u24(&mut h, field::PSN, self.psn);
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&h);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // scapy 2.5 (contrib/roce.py): raw(BTH(opcode=0x0a, solicited=1, migreq=1, padcount=3, version=0,
    // pkey=0x8001, fecn=1, becn=0, dqpn=0x123456, ackreq=1, psn=0xabcdef, icrc=0))[:12]
    static BYTES: [u8; 12] = [
        0x0a, 0xf0, 0x80, 0x01, 0x80, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef,
    ];
    const REPR: Repr = Repr {
        opcode: Opcode::RcRdmaWriteOnly,
        solicited: true,
        mig_req: true,
        pad_cnt: 3,
        pkey: 0x8001,
        fecn: true,
        becn: false,
        dest_qpn: 0x12_3456,
        ack_req: true,
        psn: 0xab_cdef,
    };

    // scapy 2.5: raw(BTH(opcode=0x11, pkey=0xffff, dqpn=0xd2, psn=0x102, icrc=0)/AETH(syndrome=0x61,
    // msn=0x123456)) without the 4 ICRC bytes: an RC ACKNOWLEDGE carrying a NAK.
    static ACK_BYTES: [u8; 16] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd2, 0x00, 0x00, 0x01, 0x02, 0x61, 0x12, 0x34,
        0x56,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RcRdmaWriteOnly);
        assert!(p.solicited());
        assert!(p.mig_req());
        assert_eq!(p.pad_cnt(), 3);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0x8001);
        assert!(p.fecn());
        assert!(!p.becn());
        assert_eq!(p.resv6(), 0);
        assert_eq!(p.dest_qpn(), 0x12_3456);
        assert!(p.ack_req());
        assert_eq!(p.resv7(), 0);
        assert_eq!(p.psn(), 0xab_cdef);
        assert_eq!(p.payload(), &[] as &[u8]);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_opcode(Opcode::RcRdmaWriteOnly);
        p.set_solicited(true);
        p.set_mig_req(true);
        p.set_pad_cnt(3);
        p.set_tver(0);
        p.set_pkey(0x8001);
        p.set_fecn(true);
        p.set_becn(false);
        p.set_resv6(0);
        p.set_dest_qpn(0x12_3456);
        p.set_ack_req(true);
        p.set_resv7(0);
        p.set_psn(0xab_cdef);
        assert_eq!(buf, BYTES);
    }

    test_parse_and_emit!(BYTES, REPR);

    #[test]
    fn ack_packet_with_aeth() {
        let p = Packet::new_checked(&ACK_BYTES[..]).unwrap();
        let repr = Repr::parse(&p).unwrap();
        assert_eq!(repr.opcode, Opcode::RcAcknowledge);
        assert_eq!(repr.pkey, 0xffff);
        assert_eq!(repr.dest_qpn, 0xd2);
        assert_eq!(repr.psn, 0x102);
        let offs = repr.opcode.ext_offsets().unwrap();
        let aeth_at = offs.aeth.unwrap();
        let aeth = crate::aeth::Packet::new_checked(&p.payload()[aeth_at..]).unwrap();
        assert_eq!(
            crate::aeth::Repr::parse(&aeth).unwrap(),
            crate::aeth::Repr {
                syndrome: crate::aeth::Syndrome::Nak(crate::aeth::NakCode::InvalidRequest),
                msn: 0x12_3456
            }
        );
        assert_eq!(p.payload().len(), offs.payload);
    }

    #[test]
    fn emit_zeroes_reserved_and_masks() {
        let mut buf = [0xffu8; 14];
        Repr {
            pad_cnt: 0xff,
            dest_qpn: 0xff12_3456,
            psn: 0xffab_cdef,
            ..REPR
        }
        .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf[..12], BYTES);
        assert_eq!(buf[12..], [0xff, 0xff], "emit must not touch the payload");
    }

    #[test]
    fn reserved_bits_ignored_on_receive() {
        let mut bytes = BYTES;
        bytes[4] |= 0x3f;
        bytes[8] |= 0x7f;
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((p.resv6(), p.resv7()), (0x3f, 0x7f));
        assert_eq!(Repr::parse(&p), Ok(REPR));
    }

    #[test]
    fn bad_version() {
        let mut bytes = BYTES;
        bytes[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error::BadVersion {
                layer: Layer::Bth,
                version: 1
            })
        );
        // TVer is checked before the opcode.
        bytes[0] = 0xff;
        assert!(matches!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Err(Error::BadVersion { .. })
        ));
    }

    #[test]
    fn unknown_opcode() {
        let mut bytes = BYTES;
        for op in [0x15u8, 0x40, 0x60, 0x80, 0xff] {
            bytes[0] = op;
            assert_eq!(
                Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
                Err(Error::UnknownOpcode(op))
            );
        }
    }

    test_truncated!(Layer::Bth, BYTES);

    #[test]
    fn payload_access() {
        let mut buf = [0u8; 20];
        buf[..12].copy_from_slice(&BYTES);
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.payload_mut().copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.payload(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Repr::parse(&p), Ok(REPR));
        assert_eq!(p.into_inner()[12], 1);
    }

    fn repr_strategy() -> impl Strategy<Value = Repr> {
        (
            proptest::sample::select(&Opcode::ALL[..]),
            any::<(bool, bool, bool, bool, bool)>(),
            0u8..4,
            any::<u16>(),
            0u32..=crate::wire_field::U24_MASK,
            0u32..=crate::wire_field::U24_MASK,
        )
            .prop_map(
                |(
                    opcode,
                    (solicited, mig_req, fecn, becn, ack_req),
                    pad_cnt,
                    pkey,
                    dest_qpn,
                    psn,
                )| {
                    Repr {
                        opcode,
                        solicited,
                        mig_req,
                        pad_cnt,
                        pkey,
                        fecn,
                        becn,
                        dest_qpn,
                        ack_req,
                        psn,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(repr in repr_strategy()) {
            let mut buf = [0xa5u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            let p = Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!((p.tver(), p.resv6(), p.resv7()), (0, 0, 0));
            prop_assert_eq!(Repr::parse(&p), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = Packet::new_checked(&data[..]) {
                if let Ok(repr) = Repr::parse(&p) {
                    // Whatever parses re-emits to the same header, up to reserved bits.
                    let mut buf = [0u8; HEADER_LEN];
                    repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
                    let mut expect = [0u8; HEADER_LEN];
                    expect.copy_from_slice(&data[..HEADER_LEN]);
                    expect[4] &= 0xc0;
                    expect[8] &= 0x80;
                    prop_assert_eq!(buf, expect);
                }
                let _ = p.payload();
            }
        }
    }
}
