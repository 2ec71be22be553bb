//! Between this crate's verbs types and libibverbs' structures: attributes, masks, work requests,
//! completions, events. Plain field copies in safe code; the only union reads go through
//! `sys::gid_bytes` and `sys::wc_imm_or_inv`. Enum values and mask bits are libibverbs' own on
//! both sides (`verbs.h`), which the tests below check against the generated constants.

// The constants keep verbs.h's names (`ibv_wc_status_IBV_WC_SUCCESS`), as bindgen writes them.
#![allow(non_upper_case_globals)]

use core::ffi::c_int;

use super::sys::{self, *};
use super::MAX_SGE;
use crate::verbs::ah::AhAttr;
use crate::verbs::cq::CqHandle;
use crate::verbs::device::{AtomicCap, DeviceAttr, LinkLayer, PathMtu, PortAttr, PortState};
use crate::verbs::error::Cause;
use crate::verbs::event::{AsyncEvent, AsyncEventType, EventElement};
use crate::verbs::gid::{Gid, GidEntry, GidType};
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::{MigState, QpAttr, QpCap, QpInitAttr, QpState};
use crate::verbs::srq::{SrqAttr, SrqHandle};
use crate::verbs::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::verbs::wr::{RecvWr, SendOp, SendWr, Sge};

/// A non-negative `int` count as `u32` (a negative one, which no device reports, as 0).
fn count(v: c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// `enum ibv_mtu` to a path MTU (an unknown value as 256, the smallest).
pub fn path_mtu(v: ibv_mtu) -> PathMtu {
    PathMtu::ALL
        .into_iter()
        .find(|m| u32::from(m.code()) == v)
        .unwrap_or(PathMtu::Mtu256)
}

/// The firmware version string `"major.minor.sub"` as `major << 32 | minor << 16 | sub`
/// (missing or non-numeric parts are 0).
pub(crate) fn fw_ver(raw: &[core::ffi::c_char; 64]) -> u64 {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let text = String::from_utf8_lossy(&bytes);
    let mut parts = text.split('.').map(|p| {
        p.trim()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u64>()
            .unwrap_or(0)
    });
    let (a, b, c) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    (a.min(0xffff_ffff) << 32) | (b.min(0xffff) << 16) | c.min(0xffff)
}

/// `struct ibv_device_attr` (ibv_query_device(3)).
pub(crate) fn device_attr(a: &ibv_device_attr) -> DeviceAttr {
    DeviceAttr {
        fw_ver: fw_ver(&a.fw_ver),
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: count(a.max_qp),
        max_qp_wr: count(a.max_qp_wr),
        max_sge: count(a.max_sge),
        max_sge_rd: count(a.max_sge_rd),
        max_cq: count(a.max_cq),
        max_cqe: count(a.max_cqe),
        max_mr: count(a.max_mr),
        max_pd: count(a.max_pd),
        max_qp_rd_atom: count(a.max_qp_rd_atom),
        max_res_rd_atom: count(a.max_res_rd_atom),
        max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
        atomic_cap: match a.atomic_cap {
            ibv_atomic_cap_IBV_ATOMIC_HCA => AtomicCap::Hca,
            ibv_atomic_cap_IBV_ATOMIC_GLOB => AtomicCap::Glob,
            _ => AtomicCap::None,
        },
        max_ah: count(a.max_ah),
        max_srq: count(a.max_srq),
        max_srq_wr: count(a.max_srq_wr),
        max_srq_sge: count(a.max_srq_sge),
        // Not in `struct ibv_device_attr`: a QP's limit is what ibv_create_qp(3) grants.
        max_inline_data: 0,
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// `struct ibv_port_attr` (ibv_query_port(3)).
pub(crate) fn port_attr(p: &ibv_port_attr) -> PortAttr {
    PortAttr {
        state: match p.state {
            ibv_port_state_IBV_PORT_DOWN => PortState::Down,
            ibv_port_state_IBV_PORT_INIT => PortState::Init,
            ibv_port_state_IBV_PORT_ARMED => PortState::Armed,
            ibv_port_state_IBV_PORT_ACTIVE => PortState::Active,
            ibv_port_state_IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            _ => PortState::Nop,
        },
        max_mtu: path_mtu(p.max_mtu),
        active_mtu: path_mtu(p.active_mtu),
        gid_tbl_len: count(p.gid_tbl_len),
        max_msg_sz: p.max_msg_sz.into(),
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        phys_state: p.phys_state,
        link_layer: match u32::from(p.link_layer) {
            IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        },
    }
}

/// `IBV_LINK_LAYER_INFINIBAND` (verbs.h, a `#define` bindgen does not list).
const IBV_LINK_LAYER_INFINIBAND: u32 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
const IBV_LINK_LAYER_ETHERNET: u32 = 2;

/// A GID table entry (ibv_query_gid_ex(3)); `None` for an empty (all-zero) entry.
pub(crate) fn gid_entry(e: &ibv_gid_entry) -> Option<GidEntry> {
    let gid = Gid::from_bytes(sys::gid_bytes(&e.gid));
    if gid.is_zero() {
        return None;
    }
    let gid_type = match e.gid_type {
        ibv_gid_type_IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
        ibv_gid_type_IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
        _ => GidType::Ib,
    };
    Some(GidEntry { gid, gid_type })
}

/// The GID a RoCEv2 program should use by default: the first RoCEv2 IPv4-mapped one (reachable
/// by an IPv4 peer, as perftest's `-x` for RoCE), else the first RoCEv2 one that is not
/// link-local, else the first RoCEv2 one, else the first of any type (InfiniBand: index 0).
pub(crate) fn pick_default_gid(gids: &[(u32, GidEntry)]) -> Option<(u32, Gid)> {
    let v2 = |e: &&(u32, GidEntry)| e.1.gid_type == GidType::RoceV2;
    let link_local = |g: &Gid| g.as_bytes()[0] == 0xfe && g.as_bytes()[1] & 0xc0 == 0x80;
    gids.iter()
        .filter(v2)
        .find(|e| e.1.gid.is_ipv4_mapped())
        .or_else(|| gids.iter().filter(v2).find(|e| !link_local(&e.1.gid)))
        .or_else(|| gids.iter().find(v2))
        .or_else(|| gids.first())
        .map(|e| (e.0, e.1.gid))
}

/// An address vector (`struct ibv_ah_attr`, always global on RoCE). `dmac` has no field: the
/// kernel resolves the MAC from the GID.
pub fn ah_attr(a: &AhAttr) -> ibv_ah_attr {
    let mut raw = ibv_ah_attr::default();
    raw.grh.dgid.raw = *a.dgid.as_bytes();
    raw.grh.flow_label = a.flow_label;
    raw.grh.sgid_index = a.sgid_index;
    raw.grh.hop_limit = a.hop_limit;
    raw.grh.traffic_class = a.traffic_class;
    raw.sl = a.sl;
    raw.is_global = 1;
    raw.port_num = a.port_num;
    raw
}

/// The address vector a query returns.
pub fn ah_attr_from(raw: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid::from_bytes(sys::gid_bytes(&raw.grh.dgid)),
        sgid_index: raw.grh.sgid_index,
        hop_limit: raw.grh.hop_limit,
        traffic_class: raw.grh.traffic_class,
        flow_label: raw.grh.flow_label,
        sl: raw.sl,
        port_num: raw.port_num,
        dmac: None,
    }
}

/// `struct ibv_srq_attr`.
pub fn srq_attr(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `struct ibv_qp_cap`.
pub fn qp_cap(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The capabilities the library granted.
pub fn qp_cap_from(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `struct ibv_qp_init_attr` without its object pointers
/// ([`sys::Context::qp_init_attr`] sets them).
pub(crate) fn qp_init_attr(i: &QpInitAttr) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        cap: qp_cap(&i.cap),
        qp_type: i.qp_type as u32,
        sq_sig_all: c_int::from(i.sq_sig_all),
        ..Default::default()
    }
}

/// `struct ibv_qp_attr`: every field (the mask says which ones the library reads).
pub fn qp_attr(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: u32::from(a.path_mtu.code()),
        path_mig_state: a.path_mig_state as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: qp_cap(&a.cap),
        ah_attr: ah_attr(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..Default::default()
    }
}

/// The attributes a query returns (an unknown state as ERR, an unknown migration state as
/// MIGRATED).
pub fn qp_attr_from(a: &ibv_qp_attr) -> QpAttr {
    QpAttr {
        qp_state: QpState::from_ibv(a.qp_state).unwrap_or(QpState::Err),
        cur_qp_state: QpState::from_ibv(a.cur_qp_state).unwrap_or(QpState::Err),
        path_mtu: path_mtu(a.path_mtu),
        path_mig_state: match a.path_mig_state {
            ibv_mig_state_IBV_MIG_REARM => MigState::Rearm,
            ibv_mig_state_IBV_MIG_ARMED => MigState::Armed,
            _ => MigState::Migrated,
        },
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_retain(a.qp_access_flags),
        cap: qp_cap_from(&a.cap),
        ah_attr: ah_attr_from(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    }
}

/// Copies an SGE list into the WR's stack array.
fn sge_list(list: &[Sge], sges: &mut [ibv_sge; MAX_SGE]) -> Result<c_int, Cause> {
    if list.len() > MAX_SGE {
        return Err(Cause::TooManySge {
            num_sge: list.len(),
            max_sge: MAX_SGE as u32,
        });
    }
    for (raw, s) in sges.iter_mut().zip(list) {
        *raw = ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(list.len() as c_int)
}

/// A send WR (`struct ibv_send_wr`) over the SGE array `sges`; `ah` is the AH of a UD send.
/// `next` is left null.
///
/// # Errors
/// [`Cause::TooManySge`] past [`MAX_SGE`]; [`Cause::UdAddressing`] for a UD send without its AH.
pub(crate) fn send_wr(
    wr: &SendWr<'_>,
    sges: &mut [ibv_sge; MAX_SGE],
    ah: Option<&RawAh>,
    out: &mut ibv_send_wr,
) -> Result<(), Cause> {
    *out = ibv_send_wr {
        wr_id: wr.wr_id,
        num_sge: sge_list(wr.sg_list, sges)?,
        sg_list: sges.as_mut_ptr(),
        opcode: wr.op.opcode() as u32,
        send_flags: wr.send_flags.bits(),
        ..Default::default()
    };
    match wr.op {
        SendOp::Send => {}
        SendOp::SendWithImm { imm_data } => out.__bindgen_anon_1.imm_data = imm_data.to_be(),
        SendOp::SendWithInv { invalidate_rkey } | SendOp::LocalInv { invalidate_rkey } => {
            out.__bindgen_anon_1.invalidate_rkey = invalidate_rkey;
        }
        SendOp::UdSend { dest, imm_data } => {
            let ah = ah.ok_or(Cause::UdAddressing {
                qp_type: crate::verbs::qp::QpType::Ud,
            })?;
            out.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah: ah.as_ptr(),
                remote_qpn: dest.remote_qpn,
                remote_qkey: dest.remote_qkey,
            };
            if let Some(imm) = imm_data {
                out.__bindgen_anon_1.imm_data = imm.to_be();
            }
        }
        SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaRead { remote_addr, rkey } => {
            out.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm_data,
        } => {
            out.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            out.__bindgen_anon_1.imm_data = imm_data.to_be();
        }
        SendOp::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            out.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        }
        SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => {
            out.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
    }
    Ok(())
}

/// A receive WR (`struct ibv_recv_wr`) over the SGE array `sges`; `next` is left null.
///
/// # Errors
/// [`Cause::TooManySge`] past [`MAX_SGE`].
pub(crate) fn recv_wr(
    wr: &RecvWr<'_>,
    sges: &mut [ibv_sge; MAX_SGE],
    out: &mut ibv_recv_wr,
) -> Result<(), Cause> {
    *out = ibv_recv_wr {
        wr_id: wr.wr_id,
        num_sge: sge_list(wr.sg_list, sges)?,
        sg_list: sges.as_mut_ptr(),
        next: core::ptr::null_mut(),
    };
    Ok(())
}

/// A completion (`struct ibv_wc`). A status outside `enum ibv_wc_status` is
/// [`WcStatus::GeneralErr`]; an opcode outside [`WcOpcode`] (only an error completion may carry
/// one: ibv_poll_cq(3) defines `opcode` for successful ones) is SEND, or RECV when its receive
/// bit (128) is set.
pub(crate) fn work_completion(wc: &ibv_wc) -> WorkCompletion {
    let status = WcStatus::from_ibv(wc.status).unwrap_or(WcStatus::GeneralErr);
    let opcode = WcOpcode::from_ibv(wc.opcode).unwrap_or(if wc.opcode & 128 != 0 {
        WcOpcode::Recv
    } else {
        WcOpcode::Send
    });
    let flags = WcFlags::from_bits_truncate(wc.wc_flags);
    let word = sys::wc_imm_or_inv(wc);
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data: flags
            .contains(WcFlags::WITH_IMM)
            .then(|| u32::from_be(word)),
        invalidated_rkey: flags.contains(WcFlags::WITH_INV).then_some(word),
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: flags,
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

/// An async event, its CQ / SRQ found by `cq_of` / `srq_of` (by object address); `None` for an
/// event type this crate does not know or an object it does not hold.
pub(crate) fn async_event(
    raw: &RawEvent,
    cq_of: impl Fn(usize) -> Option<CqHandle>,
    srq_of: impl Fn(usize) -> Option<SrqHandle>,
) -> Option<AsyncEvent> {
    let event_type = AsyncEventType::from_ibv(raw.event_type)?;
    let element = match raw.element {
        RawElement::Cq(addr) => EventElement::Cq(cq_of(addr)?),
        RawElement::Srq(addr) => EventElement::Srq(srq_of(addr)?),
        RawElement::Qp(qpn) => EventElement::Qp(qpn),
        RawElement::Port(p) => EventElement::Port(p),
        RawElement::Device => EventElement::Device,
    };
    Some(AsyncEvent {
        event_type,
        element,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::qp::{QpAttrMask, QpType};
    use crate::verbs::srq::SrqAttrMask;
    use crate::verbs::table::Handle;
    use crate::verbs::wr::{SendFlags, WrOpcode};

    /// Every enum this crate defines with libibverbs' values has them: statuses, opcodes, QP
    /// types and states, events, MTUs (verbs.h, as bindgen read it).
    #[test]
    fn enum_values_match_verbs_h() {
        assert_eq!(WcStatus::Success.ibv(), ibv_wc_status_IBV_WC_SUCCESS);
        assert_eq!(WcStatus::LocLenErr.ibv(), ibv_wc_status_IBV_WC_LOC_LEN_ERR);
        assert_eq!(
            WcStatus::LocProtErr.ibv(),
            ibv_wc_status_IBV_WC_LOC_PROT_ERR
        );
        assert_eq!(
            WcStatus::WrFlushErr.ibv(),
            ibv_wc_status_IBV_WC_WR_FLUSH_ERR
        );
        assert_eq!(
            WcStatus::RemAccessErr.ibv(),
            ibv_wc_status_IBV_WC_REM_ACCESS_ERR
        );
        assert_eq!(
            WcStatus::RetryExcErr.ibv(),
            ibv_wc_status_IBV_WC_RETRY_EXC_ERR
        );
        assert_eq!(
            WcStatus::RnrRetryExcErr.ibv(),
            ibv_wc_status_IBV_WC_RNR_RETRY_EXC_ERR
        );
        assert_eq!(WcStatus::GeneralErr.ibv(), ibv_wc_status_IBV_WC_GENERAL_ERR);
        assert_eq!(
            WcStatus::TmRndvIncomplete.ibv(),
            ibv_wc_status_IBV_WC_TM_RNDV_INCOMPLETE
        );
        for (ours, theirs) in [
            (WcOpcode::Send, ibv_wc_opcode_IBV_WC_SEND),
            (WcOpcode::RdmaWrite, ibv_wc_opcode_IBV_WC_RDMA_WRITE),
            (WcOpcode::RdmaRead, ibv_wc_opcode_IBV_WC_RDMA_READ),
            (WcOpcode::CompSwap, ibv_wc_opcode_IBV_WC_COMP_SWAP),
            (WcOpcode::FetchAdd, ibv_wc_opcode_IBV_WC_FETCH_ADD),
            (WcOpcode::BindMw, ibv_wc_opcode_IBV_WC_BIND_MW),
            (WcOpcode::LocalInv, ibv_wc_opcode_IBV_WC_LOCAL_INV),
            (WcOpcode::Recv, ibv_wc_opcode_IBV_WC_RECV),
            (
                WcOpcode::RecvRdmaWithImm,
                ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM,
            ),
        ] {
            assert_eq!(ours.ibv(), theirs);
            assert_eq!(WcOpcode::from_ibv(theirs), Some(ours));
        }
        for (ours, theirs) in [
            (WrOpcode::RdmaWrite, ibv_wr_opcode_IBV_WR_RDMA_WRITE),
            (
                WrOpcode::RdmaWriteWithImm,
                ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM,
            ),
            (WrOpcode::Send, ibv_wr_opcode_IBV_WR_SEND),
            (WrOpcode::SendWithImm, ibv_wr_opcode_IBV_WR_SEND_WITH_IMM),
            (WrOpcode::RdmaRead, ibv_wr_opcode_IBV_WR_RDMA_READ),
            (
                WrOpcode::AtomicCmpAndSwp,
                ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP,
            ),
            (
                WrOpcode::AtomicFetchAndAdd,
                ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD,
            ),
            (WrOpcode::LocalInv, ibv_wr_opcode_IBV_WR_LOCAL_INV),
            (WrOpcode::BindMw, ibv_wr_opcode_IBV_WR_BIND_MW),
            (WrOpcode::SendWithInv, ibv_wr_opcode_IBV_WR_SEND_WITH_INV),
        ] {
            assert_eq!(ours as u32, theirs, "{ours:?}");
        }
        assert_eq!(QpType::Rc as u32, ibv_qp_type_IBV_QPT_RC);
        assert_eq!(QpType::Uc as u32, ibv_qp_type_IBV_QPT_UC);
        assert_eq!(QpType::Ud as u32, ibv_qp_type_IBV_QPT_UD);
        for (ours, theirs) in [
            (QpState::Reset, ibv_qp_state_IBV_QPS_RESET),
            (QpState::Init, ibv_qp_state_IBV_QPS_INIT),
            (QpState::Rtr, ibv_qp_state_IBV_QPS_RTR),
            (QpState::Rts, ibv_qp_state_IBV_QPS_RTS),
            (QpState::Sqd, ibv_qp_state_IBV_QPS_SQD),
            (QpState::Sqe, ibv_qp_state_IBV_QPS_SQE),
            (QpState::Err, ibv_qp_state_IBV_QPS_ERR),
        ] {
            assert_eq!(ours as u32, theirs);
        }
        assert_eq!(
            AsyncEventType::CqErr as u32,
            ibv_event_type_IBV_EVENT_CQ_ERR
        );
        assert_eq!(
            AsyncEventType::SrqLimitReached as u32,
            ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED
        );
        assert_eq!(
            AsyncEventType::GidChange as u32,
            ibv_event_type_IBV_EVENT_GID_CHANGE
        );
        assert_eq!(
            AsyncEventType::WqFatal as u32,
            ibv_event_type_IBV_EVENT_WQ_FATAL
        );
        for t in AsyncEventType::ALL {
            assert_eq!(AsyncEventType::from_ibv(t as u32), Some(t));
        }
        assert_eq!(path_mtu(ibv_mtu_IBV_MTU_1024), PathMtu::Mtu1024);
        assert_eq!(path_mtu(ibv_mtu_IBV_MTU_4096), PathMtu::Mtu4096);
        assert_eq!(path_mtu(77), PathMtu::Mtu256);
        for m in PathMtu::ALL {
            assert_eq!(path_mtu(u32::from(m.code())), m);
        }
    }

    /// Mask and flag bits are libibverbs': QP attribute mask, SRQ mask, access and send flags,
    /// completion flags.
    #[test]
    fn mask_and_flag_bits_match_verbs_h() {
        for (ours, theirs) in [
            (QpAttrMask::STATE, ibv_qp_attr_mask_IBV_QP_STATE),
            (QpAttrMask::CUR_STATE, ibv_qp_attr_mask_IBV_QP_CUR_STATE),
            (
                QpAttrMask::EN_SQD_ASYNC_NOTIFY,
                ibv_qp_attr_mask_IBV_QP_EN_SQD_ASYNC_NOTIFY,
            ),
            (
                QpAttrMask::ACCESS_FLAGS,
                ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS,
            ),
            (QpAttrMask::PKEY_INDEX, ibv_qp_attr_mask_IBV_QP_PKEY_INDEX),
            (QpAttrMask::PORT, ibv_qp_attr_mask_IBV_QP_PORT),
            (QpAttrMask::QKEY, ibv_qp_attr_mask_IBV_QP_QKEY),
            (QpAttrMask::AV, ibv_qp_attr_mask_IBV_QP_AV),
            (QpAttrMask::PATH_MTU, ibv_qp_attr_mask_IBV_QP_PATH_MTU),
            (QpAttrMask::TIMEOUT, ibv_qp_attr_mask_IBV_QP_TIMEOUT),
            (QpAttrMask::RETRY_CNT, ibv_qp_attr_mask_IBV_QP_RETRY_CNT),
            (QpAttrMask::RNR_RETRY, ibv_qp_attr_mask_IBV_QP_RNR_RETRY),
            (QpAttrMask::RQ_PSN, ibv_qp_attr_mask_IBV_QP_RQ_PSN),
            (
                QpAttrMask::MAX_QP_RD_ATOMIC,
                ibv_qp_attr_mask_IBV_QP_MAX_QP_RD_ATOMIC,
            ),
            (QpAttrMask::ALT_PATH, ibv_qp_attr_mask_IBV_QP_ALT_PATH),
            (
                QpAttrMask::MIN_RNR_TIMER,
                ibv_qp_attr_mask_IBV_QP_MIN_RNR_TIMER,
            ),
            (QpAttrMask::SQ_PSN, ibv_qp_attr_mask_IBV_QP_SQ_PSN),
            (
                QpAttrMask::MAX_DEST_RD_ATOMIC,
                ibv_qp_attr_mask_IBV_QP_MAX_DEST_RD_ATOMIC,
            ),
            (
                QpAttrMask::PATH_MIG_STATE,
                ibv_qp_attr_mask_IBV_QP_PATH_MIG_STATE,
            ),
            (QpAttrMask::CAP, ibv_qp_attr_mask_IBV_QP_CAP),
            (QpAttrMask::DEST_QPN, ibv_qp_attr_mask_IBV_QP_DEST_QPN),
            (QpAttrMask::RATE_LIMIT, ibv_qp_attr_mask_IBV_QP_RATE_LIMIT),
        ] {
            assert_eq!(ours.bits(), theirs, "{ours:?}");
        }
        assert_eq!(SrqAttrMask::MAX_WR.bits(), ibv_srq_attr_mask_IBV_SRQ_MAX_WR);
        assert_eq!(SrqAttrMask::LIMIT.bits(), ibv_srq_attr_mask_IBV_SRQ_LIMIT);
        assert_eq!(
            AccessFlags::LOCAL_WRITE.bits(),
            ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
        );
        assert_eq!(
            AccessFlags::REMOTE_WRITE.bits(),
            ibv_access_flags_IBV_ACCESS_REMOTE_WRITE
        );
        assert_eq!(
            AccessFlags::REMOTE_READ.bits(),
            ibv_access_flags_IBV_ACCESS_REMOTE_READ
        );
        assert_eq!(
            AccessFlags::REMOTE_ATOMIC.bits(),
            ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC
        );
        assert_eq!(SendFlags::FENCE.bits(), ibv_send_flags_IBV_SEND_FENCE);
        assert_eq!(SendFlags::SIGNALED.bits(), ibv_send_flags_IBV_SEND_SIGNALED);
        assert_eq!(
            SendFlags::SOLICITED.bits(),
            ibv_send_flags_IBV_SEND_SOLICITED
        );
        assert_eq!(SendFlags::INLINE.bits(), ibv_send_flags_IBV_SEND_INLINE);
        assert_eq!(WcFlags::GRH.bits(), ibv_wc_flags_IBV_WC_GRH);
        assert_eq!(WcFlags::WITH_IMM.bits(), ibv_wc_flags_IBV_WC_WITH_IMM);
        assert_eq!(WcFlags::IP_CSUM_OK.bits(), ibv_wc_flags_IBV_WC_IP_CSUM_OK);
        assert_eq!(WcFlags::WITH_INV.bits(), ibv_wc_flags_IBV_WC_WITH_INV);
    }

    /// Completions: status one to one, immediate data from big-endian, the invalidated rkey
    /// as is, unknown values mapped as documented.
    #[test]
    fn completions_translate() {
        for s in WcStatus::ALL {
            let wc = ibv_wc {
                status: s.ibv(),
                ..Default::default()
            };
            assert_eq!(work_completion(&wc).status, s);
        }
        let mut wc = ibv_wc {
            wr_id: 0xfeed,
            status: ibv_wc_status_IBV_WC_SUCCESS,
            opcode: ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM,
            byte_len: 4096,
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: ibv_wc_flags_IBV_WC_WITH_IMM,
            ..Default::default()
        };
        wc.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        let ours = work_completion(&wc);
        assert_eq!(ours.imm_data, Some(0x1234_5678));
        assert_eq!(ours.invalidated_rkey, None);
        assert_eq!(ours.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(
            (ours.wr_id, ours.byte_len, ours.qp_num),
            (0xfeed, 4096, 0x11)
        );
        assert!(ours.is_consistent());
        wc.wc_flags = ibv_wc_flags_IBV_WC_WITH_INV;
        wc.__bindgen_anon_1.invalidated_rkey = 0xabc;
        let ours = work_completion(&wc);
        assert_eq!((ours.imm_data, ours.invalidated_rkey), (None, Some(0xabc)));
        assert!(ours.is_consistent());
        let odd = ibv_wc {
            status: 99,
            opcode: 135,
            ..Default::default()
        };
        let ours = work_completion(&odd);
        assert_eq!(
            (ours.status, ours.opcode),
            (WcStatus::GeneralErr, WcOpcode::Recv)
        );
    }

    /// Send WRs: opcode, flags, SGEs and every operation's fields land where verbs.h has them.
    #[test]
    fn send_wrs_translate() {
        let sgl = [
            Sge {
                addr: 0x1000,
                length: 64,
                lkey: 7,
            },
            Sge {
                addr: 0x2000,
                length: 32,
                lkey: 8,
            },
        ];
        let mut sges = [ibv_sge::default(); MAX_SGE];
        let mut raw = ibv_send_wr::default();
        let wr = SendWr {
            wr_id: 42,
            sg_list: &sgl,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: 0xdead_0000,
                rkey: 0x55,
                imm_data: 0x0102_0304,
            },
            send_flags: SendFlags::SIGNALED | SendFlags::FENCE,
        };
        send_wr(&wr, &mut sges, None, &mut raw).expect("translates");
        assert_eq!(raw.wr_id, 42);
        assert_eq!(raw.num_sge, 2);
        assert_eq!(raw.sg_list, sges.as_mut_ptr());
        assert_eq!(
            (sges[1].addr, sges[1].length, sges[1].lkey),
            (0x2000, 32, 8)
        );
        assert_eq!(raw.opcode, ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(
            raw.send_flags,
            ibv_send_flags_IBV_SEND_SIGNALED | ibv_send_flags_IBV_SEND_FENCE
        );
        assert!(raw.next.is_null());
        let (remote_addr, rkey, imm) = sys::send_wr_rdma(&raw);
        assert_eq!((remote_addr, rkey), (0xdead_0000, 0x55));
        assert_eq!(u32::from_be(imm), 0x0102_0304);

        let wr = SendWr {
            wr_id: 1,
            sg_list: &sgl[..1],
            op: SendOp::AtomicCmpAndSwp {
                remote_addr: 0x8,
                rkey: 9,
                compare: 3,
                swap: 4,
            },
            send_flags: SendFlags::empty(),
        };
        send_wr(&wr, &mut sges, None, &mut raw).expect("translates");
        assert_eq!(sys::send_wr_atomic(&raw), (0x8, 3, 4, 9));
        let ud = SendWr {
            wr_id: 2,
            sg_list: &[],
            op: SendOp::UdSend {
                dest: crate::verbs::wr::UdDest {
                    ah: Handle::from_raw(1, 0),
                    remote_qpn: 0x33,
                    remote_qkey: 0x1111,
                },
                imm_data: None,
            },
            send_flags: SendFlags::empty(),
        };
        assert!(matches!(
            send_wr(&ud, &mut sges, None, &mut raw),
            Err(Cause::UdAddressing { .. })
        ));
        let many = [Sge::default(); MAX_SGE + 1];
        let wr = SendWr {
            wr_id: 3,
            sg_list: &many,
            op: SendOp::Send,
            send_flags: SendFlags::empty(),
        };
        assert_eq!(
            send_wr(&wr, &mut sges, None, &mut raw),
            Err(Cause::TooManySge {
                num_sge: MAX_SGE + 1,
                max_sge: MAX_SGE as u32
            })
        );
    }

    /// QP attributes survive the round trip through `struct ibv_qp_attr`, the address vector
    /// always global.
    #[test]
    fn qp_attr_round_trip() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            cur_qp_state: QpState::Init,
            path_mtu: PathMtu::Mtu4096,
            qkey: 0x1111_1111,
            rq_psn: 0x12_3456,
            sq_psn: 0x65_4321,
            dest_qp_num: 0x77,
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            ah_attr: AhAttr {
                dgid: Gid::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]),
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 0x48,
                flow_label: 0x12345,
                sl: 3,
                port_num: 1,
                dmac: None,
            },
            max_rd_atomic: 4,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ..QpAttr::default()
        };
        let raw = qp_attr(&attr);
        assert_eq!(raw.ah_attr.is_global, 1);
        assert_eq!(raw.path_mtu, ibv_mtu_IBV_MTU_4096);
        assert_eq!(qp_attr_from(&raw), attr);
    }

    /// The default GID prefers RoCEv2 IPv4-mapped, then RoCEv2 global, then any RoCEv2.
    #[test]
    fn default_gid_choice() {
        let ll = Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]);
        let v4 = Gid::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        let v6 = Gid::from_bytes([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let e = |gid, gid_type| GidEntry { gid, gid_type };
        let table = [
            (0, e(ll, GidType::RoceV1)),
            (1, e(ll, GidType::RoceV2)),
            (2, e(v6, GidType::RoceV2)),
            (3, e(v4, GidType::RoceV1)),
            (4, e(v4, GidType::RoceV2)),
        ];
        assert_eq!(pick_default_gid(&table), Some((4, v4)));
        assert_eq!(pick_default_gid(&table[..4]), Some((2, v6)));
        assert_eq!(pick_default_gid(&table[..2]), Some((1, ll)));
        assert_eq!(pick_default_gid(&table[..1]), Some((0, ll)));
        assert_eq!(pick_default_gid(&[]), None);
        let mut raw = ibv_gid_entry {
            gid_type: ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
            ..Default::default()
        };
        assert_eq!(gid_entry(&raw), None);
        raw.gid.raw = *v4.as_bytes();
        assert_eq!(gid_entry(&raw), Some(e(v4, GidType::RoceV2)));
    }

    /// Firmware strings pack as major.minor.sub.
    #[test]
    fn firmware_version() {
        let mut raw = [0 as core::ffi::c_char; 64];
        for (d, s) in raw.iter_mut().zip(b"16.35.2000") {
            *d = *s as core::ffi::c_char;
        }
        assert_eq!(fw_ver(&raw), (16 << 32) | (35 << 16) | 2000);
        assert_eq!(fw_ver(&[0; 64]), 0);
    }
}
