//! The BTH opcode and the constant table of what each opcode carries.
//!
//! Every InfiniBand transport packet starts with a Base Transport Header ([`crate::bth`]) whose first
//! byte is the **opcode**. The opcode alone decides the rest of the packet's layout (IBTA vol. 1 §9.2
//! table 38 "OpCode field" and §9.3 "Extended transport headers"):
//!
//! * its top 3 bits name the transport service ([`Transport`]): reliable connection (RC), unreliable
//!   connection (UC), reliable datagram (RD), unreliable datagram (UD) or congestion notification (CNP);
//! * its low 5 bits name the operation (SEND, RDMA WRITE, RDMA READ, ATOMIC, ACKNOWLEDGE) and which
//!   packet of a multi-packet message this is (FIRST, MIDDLE, LAST or ONLY);
//! * together they fix which **extended transport headers** ([`ExtHeaders`]) follow the BTH, in a fixed
//!   wire order, and whether a payload follows them.
//!
//! ```text
//! | BTH (12 B) | DETH | RETH | AtomicETH | AETH | AtomicAckETH | ImmDt | IETH | payload | pad | ICRC |
//!              \________ only those the opcode flags, in this order ________/
//! ```
//!
//! [`Opcode`] is an open enum: the 256 byte values map to the RC, UC and UD opcodes that RoCEv2 uses
//! (RD is not used over RoCE and is left [`Opcode::Unknown`]), the RoCEv2 CNP (0x81, IBTA Annex A17.9.3),
//! and `Unknown(raw)` for everything else. [`Opcode::info`] is a `const fn` table lookup.
//!
//! Not included (they are `Unknown`): RC/RD RESYNC 0x15/0x55 (IBTA defines RESYNC for RD only; Linux
//! `ib_pack.h` lists RC 0x15 as reserved), the RD opcodes (0x40-0x5F; RD is not offered over RoCE), and the
//! IBTA 1.5 memory-placement extensions FLUSH (0x1C) and ATOMIC WRITE (0x1D).

use bitflags::bitflags;

use crate::{aeth, atomic_eth, deth, ieth, immdt, reth};
use crate::{Error, Result};

enum_with_unknown! {
    /// The transport service named by the top 3 bits of a BTH opcode (IBTA vol. 1 §9.2 table 38).
    ///
    /// The raw value is `opcode >> 5` (0..=7). 0b101 is reserved and 0b110/0b111 are
    /// manufacturer-specific opcodes; they become [`Transport::Unknown`].
    pub enum Transport(u8) {
        /// Reliable Connection (`000xxxxx`, opcodes 0x00-0x1F).
        Rc = 0,
        /// Unreliable Connection (`001xxxxx`, opcodes 0x20-0x3F).
        Uc = 1,
        /// Reliable Datagram (`010xxxxx`, opcodes 0x40-0x5F). Not used by RoCE.
        Rd = 2,
        /// Unreliable Datagram (`011xxxxx`, opcodes 0x60-0x7F).
        Ud = 3,
        /// Congestion Notification Packet (`100xxxxx`, opcodes 0x80-0x9F; RoCEv2 uses 0x81,
        /// IBTA Annex A17.9.3).
        Cnp = 4,
    }
}

impl Transport {
    /// The transport service of an opcode byte: its top 3 bits (IBTA vol. 1 §9.2 table 38).
    /// Never fails; reserved and manufacturer-specific classes come back as `Unknown(0b101..=0b111)`.
    pub const fn of_opcode_byte(opcode: u8) -> Transport {
        match opcode >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            other => Transport::Unknown(other),
        }
    }
}

bitflags! {
    /// The set of extended transport headers that follow the BTH (IBTA vol. 1 §9.3).
    ///
    /// The bit order is the wire order: on the wire the flagged headers appear from the lowest bit to
    /// the highest (DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH; IBTA vol. 1 §9.3 and table 38).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExtHeaders: u8 {
        /// Datagram ETH, 8 bytes (§9.3.2): Q_Key and source QP. UD only.
        const DETH = 1 << 0;
        /// RDMA ETH, 16 bytes (§9.3.3): virtual address, R_Key, DMA length.
        const RETH = 1 << 1;
        /// Atomic ETH, 28 bytes (§9.3.4): virtual address, R_Key, swap/add and compare data.
        const ATOMIC_ETH = 1 << 2;
        /// ACK ETH, 4 bytes (§9.3.5): syndrome and MSN.
        const AETH = 1 << 3;
        /// Atomic Acknowledge ETH, 8 bytes (§9.3.6): the original remote data.
        const ATOMIC_ACK_ETH = 1 << 4;
        /// Immediate data, 4 bytes (§9.3.7).
        const IMMDT = 1 << 5;
        /// Invalidate ETH, 4 bytes (§9.3.8): the R_Key to invalidate.
        const IETH = 1 << 6;
    }
}

impl ExtHeaders {
    /// Total length in bytes of the flagged headers (IBTA vol. 1 §9.3; DETH 8, RETH 16, AtomicETH 28,
    /// AETH 4, AtomicAckETH 8, ImmDt 4, IETH 4).
    pub const fn byte_len(self) -> usize {
        EXT_LEN_BY_BITS[self.bits() as usize] as usize
    }

    /// Byte offsets of the flagged headers, relative to the end of the BTH, in the wire order of
    /// IBTA vol. 1 §9.3 (see [`ExtHeaders`]).
    pub const fn offsets(self) -> ExtOffsets {
        let mut at = 0usize;
        let deth = if self.contains(ExtHeaders::DETH) {
            at += deth::HEADER_LEN;
            Some(at - deth::HEADER_LEN)
        } else {
            None
        };
        let reth = if self.contains(ExtHeaders::RETH) {
            at += reth::HEADER_LEN;
            Some(at - reth::HEADER_LEN)
        } else {
            None
        };
        let atomic_eth = if self.contains(ExtHeaders::ATOMIC_ETH) {
            at += atomic_eth::request::HEADER_LEN;
            Some(at - atomic_eth::request::HEADER_LEN)
        } else {
            None
        };
        let aeth = if self.contains(ExtHeaders::AETH) {
            at += aeth::HEADER_LEN;
            Some(at - aeth::HEADER_LEN)
        } else {
            None
        };
        let atomic_ack_eth = if self.contains(ExtHeaders::ATOMIC_ACK_ETH) {
            at += atomic_eth::ack::HEADER_LEN;
            Some(at - atomic_eth::ack::HEADER_LEN)
        } else {
            None
        };
        let immdt = if self.contains(ExtHeaders::IMMDT) {
            at += immdt::HEADER_LEN;
            Some(at - immdt::HEADER_LEN)
        } else {
            None
        };
        let ieth = if self.contains(ExtHeaders::IETH) {
            at += ieth::HEADER_LEN;
            Some(at - ieth::HEADER_LEN)
        } else {
            None
        };
        ExtOffsets {
            deth,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            immdt,
            ieth,
            payload: at,
        }
    }
}

/// Length in bytes of each extended header, indexed by its bit in [`ExtHeaders`] (wire order).
const EXT_HEADER_LENS: [usize; 7] = [
    deth::HEADER_LEN,
    reth::HEADER_LEN,
    atomic_eth::request::HEADER_LEN,
    aeth::HEADER_LEN,
    atomic_eth::ack::HEADER_LEN,
    immdt::HEADER_LEN,
    ieth::HEADER_LEN,
];

/// [`ExtHeaders::byte_len`] of every bit pattern, computed at compile time from [`EXT_HEADER_LENS`]:
/// one load on the packet path instead of a loop over the bits.
const EXT_LEN_BY_BITS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut bits = 0;
    while bits < 256 {
        let mut len = 0;
        let mut i = 0;
        while i < EXT_HEADER_LENS.len() {
            if bits & (1 << i) != 0 {
                len += EXT_HEADER_LENS[i];
            }
            i += 1;
        }
        table[bits] = len as u8;
        bits += 1;
    }
    table
};

/// Where each extended transport header of an opcode starts, in bytes **relative to the end of the
/// BTH** (add [`crate::bth::HEADER_LEN`] for offsets from the start of the BTH). `None`: the opcode does
/// not carry that header. Layout rules: IBTA vol. 1 §9.2 table 38 (OpCode field) and §9.3 (extended
/// headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExtOffsets {
    /// DETH (8 bytes, §9.3.2).
    pub deth: Option<usize>,
    /// RETH (16 bytes, §9.3.3).
    pub reth: Option<usize>,
    /// AtomicETH (28 bytes, §9.3.4).
    pub atomic_eth: Option<usize>,
    /// AETH (4 bytes, §9.3.5).
    pub aeth: Option<usize>,
    /// AtomicAckETH (8 bytes, §9.3.6).
    pub atomic_ack_eth: Option<usize>,
    /// ImmDt (4 bytes, §9.3.7).
    pub immdt: Option<usize>,
    /// IETH (4 bytes, §9.3.8).
    pub ieth: Option<usize>,
    /// Where the payload starts: the total length of the extended headers, in bytes. Present even for
    /// opcodes without a payload.
    pub payload: usize,
}

/// Which packet of a message an opcode is (IBTA vol. 1 §9.2 table 38; §9.7.2 for the sequencing rules).
///
/// Single-packet operations that have no FIRST/MIDDLE/LAST forms (RDMA READ request, ACKNOWLEDGE,
/// ATOMIC ACKNOWLEDGE, COMPARE SWAP, FETCH ADD, UD SEND, CNP) are `Only`, as in Linux rxe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// A packet in the middle of a multi-packet message.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// The one packet of a single-packet message.
    Only,
}

/// The operation an opcode belongs to (IBTA vol. 1 §9.2 table 38; §9.4 for the operations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND request (consumes a receive WQE at the responder), with or without immediate data or
    /// invalidate.
    Send,
    /// RDMA WRITE request, with or without immediate data.
    RdmaWrite,
    /// RDMA READ request (RETH, no payload).
    RdmaReadRequest,
    /// RDMA READ response (payload; AETH on FIRST, LAST and ONLY).
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK or NAK; AETH, no payload).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE (AETH and AtomicAckETH, no payload).
    AtomicAcknowledge,
    /// ATOMIC COMPARE & SWAP request (AtomicETH).
    CompareSwap,
    /// ATOMIC FETCH & ADD request (AtomicETH).
    FetchAdd,
    /// RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3).
    Cnp,
}

/// One row of the opcode table: everything the opcode fixes about a packet (IBTA vol. 1 §9.2 table 38
/// (OpCode field) and §9.3 (extended headers); Annex A17.9.3 for the CNP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// Transport service (the opcode's top 3 bits).
    pub transport: Transport,
    /// The operation.
    pub operation: Operation,
    /// Which packet of its message this is.
    pub position: Position,
    /// The extended transport headers that follow the BTH, in wire order.
    pub ext_headers: ExtHeaders,
    /// Whether a payload (possibly empty) follows the extended headers. True for the CNP, whose 16
    /// reserved bytes sit where a payload would (Annex A17.9.3).
    pub has_payload: bool,
}

enum_with_unknown! {
    /// A BTH opcode (IBTA vol. 1 §9.2 table 38 (OpCode field) and §9.3 (extended headers); RoCEv2 CNP:
    /// Annex A17.9.3). Values are the byte on the wire. Every RC, UC and UD opcode that RoCEv2 uses is
    /// named; any other byte is `Unknown(raw)`.
    pub enum Opcode(u8) {
        /// RC SEND First (0x00): payload.
        RcSendFirst = 0x00,
        /// RC SEND Middle (0x01): payload.
        RcSendMiddle = 0x01,
        /// RC SEND Last (0x02): payload.
        RcSendLast = 0x02,
        /// RC SEND Last with Immediate (0x03): ImmDt, payload.
        RcSendLastWithImmediate = 0x03,
        /// RC SEND Only (0x04): payload.
        RcSendOnly = 0x04,
        /// RC SEND Only with Immediate (0x05): ImmDt, payload.
        RcSendOnlyWithImmediate = 0x05,
        /// RC RDMA WRITE First (0x06): RETH, payload.
        RcRdmaWriteFirst = 0x06,
        /// RC RDMA WRITE Middle (0x07): payload.
        RcRdmaWriteMiddle = 0x07,
        /// RC RDMA WRITE Last (0x08): payload.
        RcRdmaWriteLast = 0x08,
        /// RC RDMA WRITE Last with Immediate (0x09): ImmDt, payload.
        RcRdmaWriteLastWithImmediate = 0x09,
        /// RC RDMA WRITE Only (0x0A): RETH, payload.
        RcRdmaWriteOnly = 0x0A,
        /// RC RDMA WRITE Only with Immediate (0x0B): RETH, ImmDt, payload.
        RcRdmaWriteOnlyWithImmediate = 0x0B,
        /// RC RDMA READ Request (0x0C): RETH.
        RcRdmaReadRequest = 0x0C,
        /// RC RDMA READ Response First (0x0D): AETH, payload.
        RcRdmaReadResponseFirst = 0x0D,
        /// RC RDMA READ Response Middle (0x0E): payload.
        RcRdmaReadResponseMiddle = 0x0E,
        /// RC RDMA READ Response Last (0x0F): AETH, payload.
        RcRdmaReadResponseLast = 0x0F,
        /// RC RDMA READ Response Only (0x10): AETH, payload.
        RcRdmaReadResponseOnly = 0x10,
        /// RC ACKNOWLEDGE (0x11): AETH.
        RcAcknowledge = 0x11,
        /// RC ATOMIC ACKNOWLEDGE (0x12): AETH, AtomicAckETH.
        RcAtomicAcknowledge = 0x12,
        /// RC COMPARE SWAP (0x13): AtomicETH.
        RcCompareSwap = 0x13,
        /// RC FETCH ADD (0x14): AtomicETH.
        RcFetchAdd = 0x14,
        /// RC SEND Last with Invalidate (0x16): IETH, payload.
        RcSendLastWithInvalidate = 0x16,
        /// RC SEND Only with Invalidate (0x17): IETH, payload.
        RcSendOnlyWithInvalidate = 0x17,
        /// UC SEND First (0x20): payload.
        UcSendFirst = 0x20,
        /// UC SEND Middle (0x21): payload.
        UcSendMiddle = 0x21,
        /// UC SEND Last (0x22): payload.
        UcSendLast = 0x22,
        /// UC SEND Last with Immediate (0x23): ImmDt, payload.
        UcSendLastWithImmediate = 0x23,
        /// UC SEND Only (0x24): payload.
        UcSendOnly = 0x24,
        /// UC SEND Only with Immediate (0x25): ImmDt, payload.
        UcSendOnlyWithImmediate = 0x25,
        /// UC RDMA WRITE First (0x26): RETH, payload.
        UcRdmaWriteFirst = 0x26,
        /// UC RDMA WRITE Middle (0x27): payload.
        UcRdmaWriteMiddle = 0x27,
        /// UC RDMA WRITE Last (0x28): payload.
        UcRdmaWriteLast = 0x28,
        /// UC RDMA WRITE Last with Immediate (0x29): ImmDt, payload.
        UcRdmaWriteLastWithImmediate = 0x29,
        /// UC RDMA WRITE Only (0x2A): RETH, payload.
        UcRdmaWriteOnly = 0x2A,
        /// UC RDMA WRITE Only with Immediate (0x2B): RETH, ImmDt, payload.
        UcRdmaWriteOnlyWithImmediate = 0x2B,
        /// UD SEND Only (0x64): DETH, payload.
        UdSendOnly = 0x64,
        /// UD SEND Only with Immediate (0x65): DETH, ImmDt, payload.
        UdSendOnlyWithImmediate = 0x65,
        /// RoCEv2 Congestion Notification Packet (0x81, IBTA Annex A17.9.3): 16 reserved bytes follow.
        Cnp = 0x81,
    }
}

/// Shorthand for building table rows.
const fn row(
    transport: Transport,
    operation: Operation,
    position: Position,
    ext_headers: ExtHeaders,
    has_payload: bool,
) -> OpcodeInfo {
    OpcodeInfo {
        transport,
        operation,
        position,
        ext_headers,
        has_payload,
    }
}

const NONE: ExtHeaders = ExtHeaders::empty();
const IMM: ExtHeaders = ExtHeaders::IMMDT;
const RETH: ExtHeaders = ExtHeaders::RETH;
const RETH_IMM: ExtHeaders = ExtHeaders::RETH.union(ExtHeaders::IMMDT);
const AETH: ExtHeaders = ExtHeaders::AETH;
const AETH_ATOMIC_ACK: ExtHeaders = ExtHeaders::AETH.union(ExtHeaders::ATOMIC_ACK_ETH);
const ATOMIC: ExtHeaders = ExtHeaders::ATOMIC_ETH;
const IETH: ExtHeaders = ExtHeaders::IETH;
const DETH: ExtHeaders = ExtHeaders::DETH;
const DETH_IMM: ExtHeaders = ExtHeaders::DETH.union(ExtHeaders::IMMDT);

/// The SEND and RDMA WRITE rows shared by RC and UC (IBTA table 38, low 5 bits 0x00-0x0B).
const fn send_write_row(transport: Transport, low: u8) -> Option<OpcodeInfo> {
    use Operation::{RdmaWrite, Send};
    use Position::{First, Last, Middle, Only};
    let r = match low {
        0x00 => row(transport, Send, First, NONE, true),
        0x01 => row(transport, Send, Middle, NONE, true),
        0x02 => row(transport, Send, Last, NONE, true),
        0x03 => row(transport, Send, Last, IMM, true),
        0x04 => row(transport, Send, Only, NONE, true),
        0x05 => row(transport, Send, Only, IMM, true),
        0x06 => row(transport, RdmaWrite, First, RETH, true),
        0x07 => row(transport, RdmaWrite, Middle, NONE, true),
        0x08 => row(transport, RdmaWrite, Last, NONE, true),
        0x09 => row(transport, RdmaWrite, Last, IMM, true),
        0x0A => row(transport, RdmaWrite, Only, RETH, true),
        0x0B => row(transport, RdmaWrite, Only, RETH_IMM, true),
        _ => return None,
    };
    Some(r)
}

/// [`Opcode::table_row`] of every named opcode, indexed by its byte; `None` for the other bytes.
const INFO_BY_BYTE: [Option<OpcodeInfo>; 256] = {
    let mut table = [None; 256];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        table[op.to_raw() as usize] = op.table_row();
        i += 1;
    }
    table
};

impl Opcode {
    /// Every named opcode, in byte order.
    pub const ALL: [Opcode; 38] = [
        Opcode::RcSendFirst,
        Opcode::RcSendMiddle,
        Opcode::RcSendLast,
        Opcode::RcSendLastWithImmediate,
        Opcode::RcSendOnly,
        Opcode::RcSendOnlyWithImmediate,
        Opcode::RcRdmaWriteFirst,
        Opcode::RcRdmaWriteMiddle,
        Opcode::RcRdmaWriteLast,
        Opcode::RcRdmaWriteLastWithImmediate,
        Opcode::RcRdmaWriteOnly,
        Opcode::RcRdmaWriteOnlyWithImmediate,
        Opcode::RcRdmaReadRequest,
        Opcode::RcRdmaReadResponseFirst,
        Opcode::RcRdmaReadResponseMiddle,
        Opcode::RcRdmaReadResponseLast,
        Opcode::RcRdmaReadResponseOnly,
        Opcode::RcAcknowledge,
        Opcode::RcAtomicAcknowledge,
        Opcode::RcCompareSwap,
        Opcode::RcFetchAdd,
        Opcode::RcSendLastWithInvalidate,
        Opcode::RcSendOnlyWithInvalidate,
        Opcode::UcSendFirst,
        Opcode::UcSendMiddle,
        Opcode::UcSendLast,
        Opcode::UcSendLastWithImmediate,
        Opcode::UcSendOnly,
        Opcode::UcSendOnlyWithImmediate,
        Opcode::UcRdmaWriteFirst,
        Opcode::UcRdmaWriteMiddle,
        Opcode::UcRdmaWriteLast,
        Opcode::UcRdmaWriteLastWithImmediate,
        Opcode::UcRdmaWriteOnly,
        Opcode::UcRdmaWriteOnlyWithImmediate,
        Opcode::UdSendOnly,
        Opcode::UdSendOnlyWithImmediate,
        Opcode::Cnp,
    ];

    /// The opcode table (IBTA vol. 1 §9.2 table 38 (OpCode field) and §9.3 (extended headers); CNP:
    /// Annex A17.9.3): transport, operation, position in the message, extended headers and payload
    /// presence. `None` for [`Opcode::Unknown`], including a hand-built `Unknown(b)` whose byte `b` has
    /// a name (build opcodes from bytes with `Opcode::from(u8)`, which never does that).
    pub const fn info(self) -> Option<OpcodeInfo> {
        match self {
            Opcode::Unknown(_) => None,
            known => INFO_BY_BYTE[known.to_raw() as usize],
        }
    }

    /// [`Opcode::info`] of the opcode whose wire byte is `byte` (`Opcode::from(byte).info()`), with no
    /// conversion to [`Opcode`] and back: one indexed load.
    pub(crate) const fn info_of_byte(byte: u8) -> Option<OpcodeInfo> {
        INFO_BY_BYTE[byte as usize]
    }

    /// The row of the opcode table for `self`, spelled out; [`INFO_BY_BYTE`] is built from it at
    /// compile time, so that [`Opcode::info`] (on every packet built or parsed) is one indexed load.
    const fn table_row(self) -> Option<OpcodeInfo> {
        use Operation::*;
        use Position::*;
        use Transport::{Rc, Uc, Ud};
        let low = match self {
            Opcode::RcSendFirst => 0x00,
            Opcode::RcSendMiddle => 0x01,
            Opcode::RcSendLast => 0x02,
            Opcode::RcSendLastWithImmediate => 0x03,
            Opcode::RcSendOnly => 0x04,
            Opcode::RcSendOnlyWithImmediate => 0x05,
            Opcode::RcRdmaWriteFirst => 0x06,
            Opcode::RcRdmaWriteMiddle => 0x07,
            Opcode::RcRdmaWriteLast => 0x08,
            Opcode::RcRdmaWriteLastWithImmediate => 0x09,
            Opcode::RcRdmaWriteOnly => 0x0A,
            Opcode::RcRdmaWriteOnlyWithImmediate => 0x0B,
            Opcode::UcSendFirst => return send_write_row(Uc, 0x00),
            Opcode::UcSendMiddle => return send_write_row(Uc, 0x01),
            Opcode::UcSendLast => return send_write_row(Uc, 0x02),
            Opcode::UcSendLastWithImmediate => return send_write_row(Uc, 0x03),
            Opcode::UcSendOnly => return send_write_row(Uc, 0x04),
            Opcode::UcSendOnlyWithImmediate => return send_write_row(Uc, 0x05),
            Opcode::UcRdmaWriteFirst => return send_write_row(Uc, 0x06),
            Opcode::UcRdmaWriteMiddle => return send_write_row(Uc, 0x07),
            Opcode::UcRdmaWriteLast => return send_write_row(Uc, 0x08),
            Opcode::UcRdmaWriteLastWithImmediate => return send_write_row(Uc, 0x09),
            Opcode::UcRdmaWriteOnly => return send_write_row(Uc, 0x0A),
            Opcode::UcRdmaWriteOnlyWithImmediate => return send_write_row(Uc, 0x0B),
            Opcode::RcRdmaReadRequest => return Some(row(Rc, RdmaReadRequest, Only, RETH, false)),
            Opcode::RcRdmaReadResponseFirst => {
                return Some(row(Rc, RdmaReadResponse, First, AETH, true))
            }
            Opcode::RcRdmaReadResponseMiddle => {
                return Some(row(Rc, RdmaReadResponse, Middle, NONE, true))
            }
            Opcode::RcRdmaReadResponseLast => {
                return Some(row(Rc, RdmaReadResponse, Last, AETH, true))
            }
            Opcode::RcRdmaReadResponseOnly => {
                return Some(row(Rc, RdmaReadResponse, Only, AETH, true))
            }
            Opcode::RcAcknowledge => return Some(row(Rc, Acknowledge, Only, AETH, false)),
            Opcode::RcAtomicAcknowledge => {
                return Some(row(Rc, AtomicAcknowledge, Only, AETH_ATOMIC_ACK, false))
            }
            Opcode::RcCompareSwap => return Some(row(Rc, CompareSwap, Only, ATOMIC, false)),
            Opcode::RcFetchAdd => return Some(row(Rc, FetchAdd, Only, ATOMIC, false)),
            Opcode::RcSendLastWithInvalidate => return Some(row(Rc, Send, Last, IETH, true)),
            Opcode::RcSendOnlyWithInvalidate => return Some(row(Rc, Send, Only, IETH, true)),
            Opcode::UdSendOnly => return Some(row(Ud, Send, Only, DETH, true)),
            Opcode::UdSendOnlyWithImmediate => return Some(row(Ud, Send, Only, DETH_IMM, true)),
            Opcode::Cnp => return Some(row(Transport::Cnp, Operation::Cnp, Only, NONE, true)),
            Opcode::Unknown(_) => return None,
        };
        send_write_row(Rc, low)
    }

    /// Whether this is a named opcode (a row of the table), i.e. not [`Opcode::Unknown`].
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// The opcode for a byte, or [`Error::UnknownOpcode`] when the byte is not an RC, UC or UD opcode
    /// RoCEv2 uses nor the CNP (IBTA vol. 1 §9.2 table 38; Annex A17.9.3).
    pub fn try_from_u8(byte: u8) -> Result<Opcode> {
        match Opcode::from(byte) {
            Opcode::Unknown(raw) => Err(Error::UnknownOpcode(raw)),
            known => Ok(known),
        }
    }

    /// The transport service: the opcode byte's top 3 bits (IBTA vol. 1 §9.2 table 38). Defined for
    /// unknown opcodes too.
    pub fn transport(self) -> Transport {
        Transport::of_opcode_byte(u8::from(self))
    }

    /// The operation, or `None` for an unknown opcode.
    pub const fn operation(self) -> Option<Operation> {
        match self.info() {
            Some(i) => Some(i.operation),
            None => None,
        }
    }

    /// Which packet of its message this opcode is, or `None` for an unknown opcode.
    pub const fn position(self) -> Option<Position> {
        match self.info() {
            Some(i) => Some(i.position),
            None => None,
        }
    }

    /// The extended headers that follow the BTH (empty for an unknown opcode; IBTA vol. 1 §9.3).
    pub const fn ext_headers(self) -> ExtHeaders {
        match self.info() {
            Some(i) => i.ext_headers,
            None => ExtHeaders::empty(),
        }
    }

    /// Total length in bytes of the extended headers that follow the BTH (0 for an unknown opcode).
    pub const fn ext_headers_len(self) -> usize {
        self.ext_headers().byte_len()
    }

    /// Offsets of the extended headers and the payload relative to the end of the BTH (IBTA vol. 1
    /// §9.2 table 38 (OpCode field) and §9.3 (extended headers)); `None` for an unknown opcode.
    pub const fn ext_offsets(self) -> Option<ExtOffsets> {
        match self.info() {
            Some(i) => Some(i.ext_headers.offsets()),
            None => None,
        }
    }

    /// Whether a payload (possibly zero bytes) follows the extended headers. False for unknown opcodes.
    pub const fn has_payload(self) -> bool {
        match self.info() {
            Some(i) => i.has_payload,
            None => false,
        }
    }

    /// Whether the packet starts a message: position FIRST or ONLY (rxe's `RXE_START_MASK`).
    pub const fn starts_message(self) -> bool {
        matches!(self.position(), Some(Position::First | Position::Only))
    }

    /// Whether the packet ends a message: position LAST or ONLY (rxe's `RXE_END_MASK`); the packet
    /// that completes a receive WQE or a read.
    pub const fn ends_message(self) -> bool {
        matches!(self.position(), Some(Position::Last | Position::Only))
    }

    /// Whether a requester sends this opcode: SEND, RDMA WRITE, RDMA READ request, COMPARE SWAP,
    /// FETCH ADD (IBTA vol. 1 §9.4).
    pub const fn is_request(self) -> bool {
        matches!(
            self.operation(),
            Some(
                Operation::Send
                    | Operation::RdmaWrite
                    | Operation::RdmaReadRequest
                    | Operation::CompareSwap
                    | Operation::FetchAdd
            )
        )
    }

    /// Whether a responder sends this opcode: RDMA READ response, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE
    /// (IBTA vol. 1 §9.4, §9.7.5).
    pub const fn is_response(self) -> bool {
        matches!(
            self.operation(),
            Some(
                Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
            )
        )
    }

    /// Whether this is a SEND (any transport, with or without immediate or invalidate).
    pub const fn is_send(self) -> bool {
        matches!(self.operation(), Some(Operation::Send))
    }

    /// Whether this is an RDMA WRITE (with or without immediate).
    pub const fn is_write(self) -> bool {
        matches!(self.operation(), Some(Operation::RdmaWrite))
    }

    /// Whether this belongs to an RDMA READ: the request or any of its responses.
    pub const fn is_read(self) -> bool {
        matches!(
            self.operation(),
            Some(Operation::RdmaReadRequest | Operation::RdmaReadResponse)
        )
    }

    /// Whether this belongs to an ATOMIC operation: COMPARE SWAP, FETCH ADD or ATOMIC ACKNOWLEDGE.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self.operation(),
            Some(Operation::CompareSwap | Operation::FetchAdd | Operation::AtomicAcknowledge)
        )
    }

    /// Whether immediate data (ImmDt, §9.3.7) follows the BTH.
    pub const fn has_immediate(self) -> bool {
        self.ext_headers().contains(ExtHeaders::IMMDT)
    }

    /// Whether an IETH (SEND with Invalidate, §9.3.8) follows the BTH.
    pub const fn has_invalidate(self) -> bool {
        self.ext_headers().contains(ExtHeaders::IETH)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn flagged_len(h: ExtHeaders) -> usize {
        let mut n = 0;
        for (flag, len) in [
            (ExtHeaders::DETH, 8),
            (ExtHeaders::RETH, 16),
            (ExtHeaders::ATOMIC_ETH, 28),
            (ExtHeaders::AETH, 4),
            (ExtHeaders::ATOMIC_ACK_ETH, 8),
            (ExtHeaders::IMMDT, 4),
            (ExtHeaders::IETH, 4),
        ] {
            if h.contains(flag) {
                n += len;
            }
        }
        n
    }

    #[test]
    fn table_agrees_with_enum_for_all_bytes() {
        let mut known = 0;
        for byte in 0..=255u8 {
            let op = Opcode::from(byte);
            assert_eq!(u8::from(op), byte);
            assert_eq!(
                op.is_known(),
                !matches!(op, Opcode::Unknown(_)),
                "{byte:#04x}"
            );
            assert_eq!(op.info().is_some(), op.is_known());
            assert_eq!(Opcode::try_from_u8(byte).is_ok(), op.is_known());
            assert_eq!(op.transport(), Transport::from(byte >> 5));
            assert_eq!(op.ext_headers_len(), flagged_len(op.ext_headers()));
            match op.info() {
                Some(info) => {
                    known += 1;
                    assert!(Opcode::ALL.contains(&op));
                    assert_eq!(info.transport, op.transport(), "{byte:#04x}");
                    let offs = op.ext_offsets().unwrap();
                    assert_eq!(offs.payload, op.ext_headers_len());
                    // At most 2 extended headers and never both a request and a response.
                    assert!(op.ext_headers().bits().count_ones() <= 2);
                    assert!(!(op.is_request() && op.is_response()));
                    assert_eq!(op.is_request() || op.is_response(), op != Opcode::Cnp);
                }
                None => {
                    assert_eq!(Opcode::try_from_u8(byte), Err(Error::UnknownOpcode(byte)));
                    assert_eq!(op.ext_offsets(), None);
                    assert_eq!(op.ext_headers(), ExtHeaders::empty());
                    assert!(!op.has_payload());
                }
            }
        }
        assert_eq!(known, Opcode::ALL.len());
        // ALL is sorted by byte and has no duplicates.
        for w in Opcode::ALL.windows(2) {
            assert!(u8::from(w[0]) < u8::from(w[1]));
        }
    }

    #[test]
    fn uc_mirrors_rc_send_write() {
        for low in 0x00..=0x0Bu8 {
            let rc = Opcode::from(low).info().unwrap();
            let uc = Opcode::from(0x20 | low).info().unwrap();
            assert_eq!(rc.transport, Transport::Rc);
            assert_eq!(uc.transport, Transport::Uc);
            assert_eq!(
                (rc.operation, rc.position, rc.ext_headers, rc.has_payload),
                (uc.operation, uc.position, uc.ext_headers, uc.has_payload)
            );
        }
        // UC has no READ, ATOMIC, ACK or invalidate opcodes.
        for low in 0x0C..=0x1Fu8 {
            assert!(!Opcode::from(0x20 | low).is_known());
        }
    }

    #[test]
    fn header_layouts_match_ibta_table_38() {
        // Expected extended-header lengths per opcode (cross-checked with rxe_opcode.c / Wireshark's
        // packet-infiniband.c header-order tables).
        let cases: &[(u8, usize, bool)] = &[
            (0x00, 0, true),
            (0x03, 4, true),
            (0x06, 16, true),
            (0x0B, 20, true),
            (0x0C, 16, false),
            (0x0D, 4, true),
            (0x0E, 0, true),
            (0x10, 4, true),
            (0x11, 4, false),
            (0x12, 12, false),
            (0x13, 28, false),
            (0x14, 28, false),
            (0x16, 4, true),
            (0x17, 4, true),
            (0x2B, 20, true),
            (0x64, 8, true),
            (0x65, 12, true),
            (0x81, 0, true),
        ];
        for &(byte, len, payload) in cases {
            let op = Opcode::from(byte);
            assert_eq!(op.ext_headers_len(), len, "{byte:#04x}");
            assert_eq!(op.has_payload(), payload, "{byte:#04x}");
        }
        assert!(!Opcode::from(0x15).is_known(), "RC RESYNC is reserved");
        assert!(!Opcode::from(0x55).is_known(), "RD is not used over RoCE");
    }

    #[test]
    fn ext_offsets_follow_wire_order() {
        let o = Opcode::RcRdmaWriteOnlyWithImmediate.ext_offsets().unwrap();
        assert_eq!((o.reth, o.immdt, o.payload), (Some(0), Some(16), 20));
        assert_eq!((o.deth, o.aeth, o.ieth), (None, None, None));

        let o = Opcode::UdSendOnlyWithImmediate.ext_offsets().unwrap();
        assert_eq!((o.deth, o.immdt, o.payload), (Some(0), Some(8), 12));

        let o = Opcode::RcAtomicAcknowledge.ext_offsets().unwrap();
        assert_eq!(
            (o.aeth, o.atomic_ack_eth, o.payload),
            (Some(0), Some(4), 12)
        );

        let o = Opcode::RcCompareSwap.ext_offsets().unwrap();
        assert_eq!((o.atomic_eth, o.payload), (Some(0), 28));

        let o = Opcode::RcSendOnlyWithInvalidate.ext_offsets().unwrap();
        assert_eq!((o.ieth, o.payload), (Some(0), 4));

        let o = Opcode::RcRdmaReadResponseLast.ext_offsets().unwrap();
        assert_eq!((o.aeth, o.payload), (Some(0), 4));

        assert_eq!(ExtHeaders::all().byte_len(), 8 + 16 + 28 + 4 + 8 + 4 + 4);
    }

    #[test]
    fn classification() {
        assert!(Opcode::RcSendFirst.starts_message() && !Opcode::RcSendFirst.ends_message());
        assert!(!Opcode::RcSendMiddle.starts_message() && !Opcode::RcSendMiddle.ends_message());
        assert!(Opcode::UcSendLastWithImmediate.ends_message());
        assert!(Opcode::UcSendLastWithImmediate.has_immediate());
        assert!(Opcode::RcSendOnlyWithInvalidate.has_invalidate());
        assert!(Opcode::RcRdmaReadRequest.is_read() && Opcode::RcRdmaReadRequest.is_request());
        assert!(Opcode::RcRdmaReadResponseMiddle.is_read());
        assert!(Opcode::RcRdmaReadResponseMiddle.is_response());
        assert!(Opcode::RcFetchAdd.is_atomic() && Opcode::RcFetchAdd.is_request());
        assert!(Opcode::RcAtomicAcknowledge.is_atomic());
        assert!(Opcode::RcAtomicAcknowledge.is_response());
        assert!(Opcode::UdSendOnly.is_send() && Opcode::UdSendOnly.starts_message());
        assert!(Opcode::UcRdmaWriteOnly.is_write());
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert_eq!(Opcode::Unknown(0xC0).transport(), Transport::Unknown(6));
        assert_eq!(Opcode::Unknown(0x55).transport(), Transport::Rd);
        assert!(!Opcode::Unknown(0x55).starts_message());
    }

    #[test]
    fn lookup_tables_match_the_spelled_out_table() {
        for byte in 0..=255u8 {
            let op = Opcode::from(byte);
            assert_eq!(Opcode::info_of_byte(byte), op.table_row(), "byte {byte:#x}");
            assert_eq!(op.info(), op.table_row(), "byte {byte:#x}");
            assert_eq!(op.to_raw(), byte);
            // A hand-built `Unknown` of a named byte has no row.
            assert_eq!(Opcode::Unknown(byte).info(), None);
        }
        for bits in 0..=255u8 {
            let set = ExtHeaders::from_bits_retain(bits);
            assert_eq!(set.byte_len(), set.offsets().payload, "bits {bits:#x}");
        }
    }

    #[test]
    fn transport_of_byte_matches_enum() {
        for byte in 0..=255u8 {
            assert_eq!(Transport::of_opcode_byte(byte), Transport::from(byte >> 5));
        }
    }
}
