//! Work requests: what ibv_post_send(3) and ibv_post_recv(3) take, and their validation.
//!
//! A work request (WR) asks the HCA to move data. A **send WR** names an operation ([`SendOp`]):
//! SEND a message into the peer's next receive buffer, RDMA WRITE into or RDMA READ from the
//! peer's registered memory, an 8-byte atomic on the peer's memory, or a local invalidate. Its
//! scatter/gather list (`sg_list`, a slice of [`Sge`]s) says where the local bytes are: the
//! message is the SGEs' buffers concatenated. A **receive WR** ([`RecvWr`]) only lists buffers for
//! the next incoming SEND (or RDMA WRITE with immediate).
//!
//! Before a WR is queued it is checked as libibverbs over rxe checks it (rxe `validate_send_wr`,
//! `post_one_recv`): a bad WR is refused at once with `EINVAL` (or `ENOMEM` for a full queue) and
//! nothing is queued. Checks that need the memory (lkeys, bounds) happen when the HCA executes the
//! WR and end in an error completion instead (see [`crate::verbs::mr`]).

use crate::verbs::ah::AhHandle;
use crate::verbs::attr::{QpType, MAX_QPN};
use crate::verbs::device::AtomicCap;
use crate::verbs::error::Cause;

pub use super::attr::{SendFlags, WrOpcode};

/// A scatter/gather entry (`struct ibv_sge`): `length` bytes at I/O virtual address `addr` of the
/// MR whose lkey is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address (I/O virtual address in the MR).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The lkey of the MR holding the buffer (not checked for INLINE sends).
    pub lkey: u32,
}

/// Where a UD send goes (`ibv_send_wr.wr.ud`): an address handle, the remote QPN and its Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The address handle (destination GID, source GID index, traffic class ...).
    pub ah: AhHandle,
    /// The destination QPN (24 bits).
    pub remote_qpn: u32,
    /// The destination Q_Key. If its high bit is set the QP's own Q_Key is sent instead (IBTA
    /// ch. 10 "controlled Q_Key"; the engine applies this).
    pub remote_qkey: u32,
}

/// The operation of a send WR with its operation-specific fields (the `opcode`, `imm_data`,
/// `invalidate_rkey` and `wr` union of `struct ibv_send_wr`), so that a field can only be given to
/// an operation that uses it. `remote_addr` is an I/O virtual address in the peer's MR named by
/// `rkey`. Immediate data is in host order (the wire carries it big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND on an RC or UC QP.
    Send,
    /// SEND with 32 bits of immediate data, delivered in the receiver's completion.
    SendWithImm {
        /// Immediate data.
        imm_data: u32,
    },
    /// SEND that also invalidates `invalidate_rkey` at the receiver (RC only).
    SendWithInv {
        /// The rkey the receiver invalidates.
        invalidate_rkey: u32,
    },
    /// SEND on a UD QP, to `dest`, with optional immediate data.
    UdSend {
        /// The destination.
        dest: UdDest,
        /// Immediate data, if any (SEND_WITH_IMM).
        imm_data: Option<u32>,
    },
    /// RDMA WRITE of the local buffers to `remote_addr`.
    RdmaWrite {
        /// Remote I/O virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE that also consumes a receive WR at the peer, completing it with `imm_data`.
    RdmaWriteWithImm {
        /// Remote I/O virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm_data: u32,
    },
    /// RDMA READ from `remote_addr` into the local buffers (RC only).
    RdmaRead {
        /// Remote I/O virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare and swap at `remote_addr`: if it equals `compare`, store `swap`; the
    /// original value lands in the 8-byte local buffer (RC only).
    AtomicCmpAndSwp {
        /// Remote I/O virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store on a match.
        swap: u64,
    },
    /// 64-bit fetch and add at `remote_addr`; the original value lands in the 8-byte local buffer
    /// (RC only).
    AtomicFetchAndAdd {
        /// Remote I/O virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// Invalidate a local key (RC only; any SGEs are ignored, as rxe does).
    LocalInv {
        /// The key to invalidate.
        invalidate_rkey: u32,
    },
}

impl SendOp {
    /// The ibv opcode.
    pub const fn opcode(&self) -> WrOpcode {
        match self {
            SendOp::Send => WrOpcode::Send,
            SendOp::SendWithImm { .. } => WrOpcode::SendWithImm,
            SendOp::SendWithInv { .. } => WrOpcode::SendWithInv,
            SendOp::UdSend { imm_data: None, .. } => WrOpcode::Send,
            SendOp::UdSend {
                imm_data: Some(_), ..
            } => WrOpcode::SendWithImm,
            SendOp::RdmaWrite { .. } => WrOpcode::RdmaWrite,
            SendOp::RdmaWriteWithImm { .. } => WrOpcode::RdmaWriteWithImm,
            SendOp::RdmaRead { .. } => WrOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WrOpcode::AtomicCmpAndSwp,
            SendOp::AtomicFetchAndAdd { .. } => WrOpcode::AtomicFetchAndAdd,
            SendOp::LocalInv { .. } => WrOpcode::LocalInv,
        }
    }

    /// The immediate data, if the operation carries any.
    pub const fn imm_data(&self) -> Option<u32> {
        match *self {
            SendOp::SendWithImm { imm_data } | SendOp::RdmaWriteWithImm { imm_data, .. } => {
                Some(imm_data)
            }
            SendOp::UdSend { imm_data, .. } => imm_data,
            _ => None,
        }
    }

    /// The remote address and rkey of an RDMA or atomic operation.
    pub const fn remote(&self) -> Option<(u64, u32)> {
        match *self {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            }
            | SendOp::RdmaRead { remote_addr, rkey }
            | SendOp::AtomicCmpAndSwp {
                remote_addr, rkey, ..
            }
            | SendOp::AtomicFetchAndAdd {
                remote_addr, rkey, ..
            } => Some((remote_addr, rkey)),
            _ => None,
        }
    }

    /// The UD destination of a [`SendOp::UdSend`].
    pub const fn ud_dest(&self) -> Option<&UdDest> {
        match self {
            SendOp::UdSend { dest, .. } => Some(dest),
            _ => None,
        }
    }
}

/// A send work request (`struct ibv_send_wr`, one WR of the list). The SGE list is borrowed:
/// posting copies what it needs and allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Local buffers: the gather list of SEND / WRITE, the scatter list of READ / atomics.
    pub sg_list: &'a [Sge],
    /// The operation.
    pub op: SendOp,
    /// Flags.
    pub send_flags: SendFlags,
}

/// A receive work request (`struct ibv_recv_wr`): buffers for one incoming message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where the incoming message is scattered, in order.
    pub sg_list: &'a [Sge],
}

/// The limits a send WR is checked against: the QP's capabilities and the device's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLimits {
    /// The QP's transport.
    pub qp_type: QpType,
    /// `cap.max_send_sge` of the QP.
    pub max_send_sge: u32,
    /// `cap.max_inline_data` of the QP, in bytes.
    pub max_inline_data: u32,
    /// `max_sge_rd` of the device (RDMA READ scatter limit).
    pub max_sge_rd: u32,
    /// `max_msg_sz` of the port, in bytes.
    pub max_msg_sz: u64,
    /// The device's atomic support.
    pub atomic_cap: AtomicCap,
}

/// What validation learned about a send WR, for the engine to queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWrInfo {
    /// The opcode.
    pub opcode: WrOpcode,
    /// Message length in bytes (sum of the SGE lengths; at most `max_msg_sz`).
    pub length: u32,
    /// Whether the WR produces a completion on success (SIGNALED, or the QP's `sq_sig_all`).
    pub signaled: bool,
}

/// The total length of an SGE list in bytes (cannot overflow: at most 2^32 SGEs of < 2^32 bytes).
pub fn sge_total(sg_list: &[Sge]) -> u64 {
    sg_list.iter().map(|s| u64::from(s.length)).sum()
}

/// Checks a send WR against `limits`, in rxe's order (`validate_send_wr`): opcode for the QP type,
/// UD addressing, number of SGEs, message length, atomic length and alignment, inline. Nothing is
/// queued; on success the returned [`SendWrInfo`] has `signaled` from the WR's flags only (the
/// QP adds `sq_sig_all`).
///
/// Not checked here: lkeys (checked when the WR executes, IBV_WC_LOC_PROT_ERR), the address
/// handle's existence and PD (the [`crate::Context`] checks those), a full send queue (the queue
/// owner's check, `ENOMEM`), a UD message larger than the path MTU (completes with
/// IBV_WC_LOC_LEN_ERR).
///
/// # Errors
/// [`Cause::OpcodeNotSupported`], [`Cause::UdAddressing`], [`Cause::OutOfRange`] (`remote_qpn`),
/// [`Cause::TooManySge`], [`Cause::MessageTooLong`], [`Cause::AtomicLength`],
/// [`Cause::AtomicMisaligned`], [`Cause::InlineNotSupported`], [`Cause::InlineTooLarge`]: all
/// `EINVAL`.
pub fn validate_send_wr(wr: &SendWr<'_>, limits: &SendLimits) -> Result<SendWrInfo, Cause> {
    let opcode = wr.op.opcode();
    let qp_type = limits.qp_type;
    if !opcode.supported_on(qp_type) || (opcode.is_atomic() && limits.atomic_cap == AtomicCap::None)
    {
        return Err(Cause::OpcodeNotSupported { opcode, qp_type });
    }
    match (qp_type, wr.op.ud_dest()) {
        (QpType::Ud, None) | (QpType::Rc | QpType::Uc, Some(_)) => {
            return Err(Cause::UdAddressing { qp_type });
        }
        (QpType::Ud, Some(dest)) if dest.remote_qpn > MAX_QPN => {
            return Err(Cause::OutOfRange {
                attr: "wr.ud.remote_qpn",
                value: dest.remote_qpn.into(),
                max: MAX_QPN.into(),
            });
        }
        _ => {}
    }
    let max_sge = match opcode {
        WrOpcode::RdmaRead => limits.max_send_sge.min(limits.max_sge_rd),
        _ => limits.max_send_sge,
    };
    if wr.sg_list.len() > max_sge as usize {
        return Err(Cause::TooManySge {
            num_sge: wr.sg_list.len(),
            max_sge,
        });
    }
    let length = sge_total(wr.sg_list);
    if length > limits.max_msg_sz {
        return Err(Cause::MessageTooLong {
            length,
            max: limits.max_msg_sz,
        });
    }
    if opcode.is_atomic() {
        if length != 8 {
            return Err(Cause::AtomicLength { length });
        }
        if let Some((remote_addr, _)) = wr.op.remote() {
            if remote_addr & 7 != 0 {
                return Err(Cause::AtomicMisaligned { remote_addr });
            }
        }
    }
    if wr.send_flags.contains(SendFlags::INLINE) {
        if !opcode.allows_inline() {
            return Err(Cause::InlineNotSupported { opcode });
        }
        if length > u64::from(limits.max_inline_data) {
            return Err(Cause::InlineTooLarge {
                length,
                max_inline: limits.max_inline_data,
            });
        }
    }
    Ok(SendWrInfo {
        opcode,
        // length <= max_msg_sz; a device with max_msg_sz >= 2^32 still has u32 SGE lengths, but
        // many SGEs could sum past u32: refuse rather than truncate.
        length: u32::try_from(length).map_err(|_| Cause::MessageTooLong {
            length,
            max: u32::MAX.into(),
        })?,
        signaled: wr.send_flags.contains(SendFlags::SIGNALED),
    })
}

/// Checks a receive WR (rxe `post_one_recv`, after its queue-full check): at most `max_sge` SGEs,
/// at most `max_msg_sz` bytes in all. Returns the total buffer length in bytes.
///
/// # Errors
/// [`Cause::TooManySge`], [`Cause::MessageTooLong`]: `EINVAL`.
pub fn validate_recv_wr(wr: &RecvWr<'_>, max_sge: u32, max_msg_sz: u64) -> Result<u64, Cause> {
    if wr.sg_list.len() > max_sge as usize {
        return Err(Cause::TooManySge {
            num_sge: wr.sg_list.len(),
            max_sge,
        });
    }
    let length = sge_total(wr.sg_list);
    if length > max_msg_sz {
        return Err(Cause::MessageTooLong {
            length,
            max: max_msg_sz,
        });
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::table::Handle;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn limits(qp_type: QpType) -> SendLimits {
        SendLimits {
            qp_type,
            max_send_sge: 4,
            max_inline_data: 64,
            max_sge_rd: 2,
            max_msg_sz: 1 << 31,
            atomic_cap: AtomicCap::Hca,
        }
    }

    fn sge(length: u32) -> Sge {
        Sge {
            addr: 0x1000,
            length,
            lkey: 0x100,
        }
    }

    const DEST: UdDest = UdDest {
        ah: Handle::from_raw(1, 0),
        remote_qpn: 0x12,
        remote_qkey: 0x1111_1111,
    };

    fn all_ops() -> Vec<SendOp> {
        vec![
            SendOp::Send,
            SendOp::SendWithImm { imm_data: 1 },
            SendOp::SendWithInv {
                invalidate_rkey: 0x105,
            },
            SendOp::UdSend {
                dest: DEST,
                imm_data: None,
            },
            SendOp::UdSend {
                dest: DEST,
                imm_data: Some(7),
            },
            SendOp::RdmaWrite {
                remote_addr: 0x2000,
                rkey: 0x205,
            },
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x2000,
                rkey: 0x205,
                imm_data: 3,
            },
            SendOp::RdmaRead {
                remote_addr: 0x2000,
                rkey: 0x205,
            },
            SendOp::AtomicCmpAndSwp {
                remote_addr: 0x2000,
                rkey: 0x205,
                compare: 1,
                swap: 2,
            },
            SendOp::AtomicFetchAndAdd {
                remote_addr: 0x2000,
                rkey: 0x205,
                add: 1,
            },
            SendOp::LocalInv {
                invalidate_rkey: 0x105,
            },
        ]
    }

    fn wr(op: SendOp, sg_list: &[Sge]) -> SendWr<'_> {
        SendWr {
            wr_id: 1,
            sg_list,
            op,
            send_flags: SendFlags::SIGNALED,
        }
    }

    #[test]
    fn opcode_values_are_ibv() {
        assert_eq!(WrOpcode::RdmaWrite as u32, 0);
        assert_eq!(WrOpcode::Send as u32, 2);
        assert_eq!(WrOpcode::RdmaRead as u32, 4);
        assert_eq!(WrOpcode::LocalInv as u32, 7);
        assert_eq!(WrOpcode::SendWithInv as u32, 9);
    }

    #[test]
    fn opcode_matrix_per_qp_type() {
        // (op index in all_ops, RC, UC, UD)
        let expected = [
            (0, true, true, false),   // SEND
            (1, true, true, false),   // SEND_WITH_IMM
            (2, true, false, false),  // SEND_WITH_INV
            (3, false, false, true),  // UD SEND
            (4, false, false, true),  // UD SEND_WITH_IMM
            (5, true, true, false),   // RDMA_WRITE
            (6, true, true, false),   // RDMA_WRITE_WITH_IMM
            (7, true, false, false),  // RDMA_READ
            (8, true, false, false),  // CMP_AND_SWP
            (9, true, false, false),  // FETCH_AND_ADD
            (10, true, false, false), // LOCAL_INV
        ];
        let ops = all_ops();
        let eight = [sge(8)];
        for (i, rc, uc, ud) in expected {
            let op = ops[i];
            let sg: &[Sge] = if matches!(op, SendOp::LocalInv { .. }) {
                &[]
            } else {
                &eight
            };
            for (qp_type, ok) in [(QpType::Rc, rc), (QpType::Uc, uc), (QpType::Ud, ud)] {
                let r = validate_send_wr(&wr(op, sg), &limits(qp_type));
                assert_eq!(r.is_ok(), ok, "{op:?} on {qp_type}: {r:?}");
                if let Err(e) = r {
                    assert!(matches!(
                        e,
                        Cause::OpcodeNotSupported { .. } | Cause::UdAddressing { .. }
                    ));
                    assert_eq!(e.errno(), crate::verbs::error::errno::EINVAL);
                }
            }
        }
    }

    #[test]
    fn sge_count_limits() {
        let five = [sge(1); 5];
        let e = validate_send_wr(&wr(SendOp::Send, &five), &limits(QpType::Rc)).unwrap_err();
        assert_eq!(
            e,
            Cause::TooManySge {
                num_sge: 5,
                max_sge: 4
            }
        );
        let three = [sge(1); 3];
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        assert_eq!(
            validate_send_wr(&wr(read, &three), &limits(QpType::Rc)).unwrap_err(),
            Cause::TooManySge {
                num_sge: 3,
                max_sge: 2
            },
            "RDMA READ is limited by max_sge_rd"
        );
        let inv = SendOp::LocalInv { invalidate_rkey: 1 };
        assert!(
            validate_send_wr(&wr(inv, &[sge(1)]), &limits(QpType::Rc)).is_ok(),
            "rxe ignores the SGEs of LOCAL_INV"
        );
        assert!(validate_send_wr(&wr(SendOp::Send, &[]), &limits(QpType::Rc)).is_ok());
    }

    #[test]
    fn message_length_limit_is_inclusive() {
        let max = [sge(1 << 30), sge(1 << 30)];
        let info = validate_send_wr(&wr(SendOp::Send, &max), &limits(QpType::Rc)).unwrap();
        assert_eq!(info.length, 1 << 31);
        let over = [sge(1 << 30), sge(1 << 30), sge(1)];
        assert_eq!(
            validate_send_wr(&wr(SendOp::Send, &over), &limits(QpType::Rc)).unwrap_err(),
            Cause::MessageTooLong {
                length: (1 << 31) + 1,
                max: 1 << 31
            }
        );
        // Sums past u32 never wrap.
        let big = [sge(u32::MAX); 4];
        assert!(matches!(
            validate_send_wr(&wr(SendOp::Send, &big), &limits(QpType::Rc)),
            Err(Cause::MessageTooLong { length, .. }) if length == 4 * u64::from(u32::MAX)
        ));
    }

    #[test]
    fn atomic_rules() {
        let faa = |remote_addr| SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey: 1,
            add: 1,
        };
        let l = limits(QpType::Rc);
        assert!(validate_send_wr(&wr(faa(0x1000), &[sge(8)]), &l).is_ok());
        assert!(validate_send_wr(&wr(faa(0x1000), &[sge(4), sge(4)]), &l).is_ok());
        assert_eq!(
            validate_send_wr(&wr(faa(0x1000), &[sge(16)]), &l).unwrap_err(),
            Cause::AtomicLength { length: 16 }
        );
        assert_eq!(
            validate_send_wr(&wr(faa(0x1000), &[]), &l).unwrap_err(),
            Cause::AtomicLength { length: 0 }
        );
        assert_eq!(
            validate_send_wr(&wr(faa(0x1004), &[sge(8)]), &l).unwrap_err(),
            Cause::AtomicMisaligned {
                remote_addr: 0x1004
            }
        );
        let no_atomics = SendLimits {
            atomic_cap: AtomicCap::None,
            ..l
        };
        assert!(matches!(
            validate_send_wr(&wr(faa(0x1000), &[sge(8)]), &no_atomics),
            Err(Cause::OpcodeNotSupported { .. })
        ));
    }

    #[test]
    fn inline_rules() {
        let l = limits(QpType::Rc);
        let two = [sge(32), sge(32)];
        let mut w = wr(SendOp::Send, &two);
        w.send_flags |= SendFlags::INLINE;
        assert!(validate_send_wr(&w, &l).is_ok());
        let sg = [sge(32), sge(33)];
        w.sg_list = &sg;
        assert_eq!(
            validate_send_wr(&w, &l).unwrap_err(),
            Cause::InlineTooLarge {
                length: 65,
                max_inline: 64
            }
        );
        w.op = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        w.sg_list = &[];
        assert_eq!(
            validate_send_wr(&w, &l).unwrap_err(),
            Cause::InlineNotSupported {
                opcode: WrOpcode::RdmaRead
            }
        );
    }

    #[test]
    fn ud_addressing() {
        let mut dest = DEST;
        dest.remote_qpn = 1 << 24;
        let op = SendOp::UdSend {
            dest,
            imm_data: None,
        };
        assert!(matches!(
            validate_send_wr(&wr(op, &[]), &limits(QpType::Ud)),
            Err(Cause::OutOfRange {
                attr: "wr.ud.remote_qpn",
                ..
            })
        ));
        assert_eq!(
            validate_send_wr(&wr(SendOp::Send, &[]), &limits(QpType::Ud)).unwrap_err(),
            Cause::UdAddressing {
                qp_type: QpType::Ud
            }
        );
    }

    #[test]
    fn op_accessors() {
        let ops = all_ops();
        assert_eq!(ops[4].imm_data(), Some(7));
        assert_eq!(ops[4].opcode(), WrOpcode::SendWithImm);
        assert_eq!(ops[3].opcode(), WrOpcode::Send);
        assert_eq!(ops[6].remote(), Some((0x2000, 0x205)));
        assert_eq!(ops[0].remote(), None);
        assert!(ops[3].ud_dest().is_some());
        assert!(!WrOpcode::BindMw.supported_on(QpType::Rc));
    }

    #[test]
    fn recv_wr_checks() {
        let sg = [sge(1 << 30), sge(1 << 30)];
        let w = RecvWr {
            wr_id: 1,
            sg_list: &sg,
        };
        assert_eq!(validate_recv_wr(&w, 2, 1 << 31), Ok(1 << 31));
        assert!(matches!(
            validate_recv_wr(&w, 1, 1 << 31),
            Err(Cause::TooManySge { .. })
        ));
        assert!(matches!(
            validate_recv_wr(&w, 2, (1 << 31) - 1),
            Err(Cause::MessageTooLong { .. })
        ));
    }

    proptest! {
        #[test]
        fn send_validation_matches_a_reference(
            lens in proptest::collection::vec(any::<u32>(), 0..6),
            inline in any::<bool>(),
        ) {
            let sg: Vec<Sge> = lens.iter().map(|&l| sge(l)).collect();
            let mut w = wr(SendOp::Send, &sg);
            if inline {
                w.send_flags |= SendFlags::INLINE;
            }
            let l = limits(QpType::Rc);
            let total: u128 = lens.iter().map(|&x| x as u128).sum();
            let expect_ok = sg.len() <= 4
                && total <= 1 << 31
                && (!inline || total <= 64);
            let r = validate_send_wr(&w, &l);
            prop_assert_eq!(r.is_ok(), expect_ok, "{:?}", r);
            if let Ok(info) = r {
                prop_assert_eq!(u128::from(info.length), total);
            }
        }
    }
}
