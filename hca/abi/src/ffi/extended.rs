//! The extended verbs reached through `struct verbs_context`: ibv_create_qp_ex(3) with its
//! work-request builder (ibv_wr_post(3): `wr_start`, `wr_rdma_write`, `wr_set_sge`, ...,
//! `wr_complete`, `wr_abort`) and ibv_create_cq_ex(3) with its polling API (`start_poll`,
//! `next_poll`, `end_poll`, `read_*`), laid out as rdma-core's `<infiniband/verbs.h>` (the
//! bindgen structures [`hca::ibverbs::ffi::ibv_qp_ex`] / [`hca::ibverbs::ffi::ibv_cq_ex`], whose
//! sizes and offsets bindgen asserts at compile time).
//!
//! What is accepted follows Linux rxe's provider (rdma-core `providers/rxe/rxe.c`): QP
//! `comp_mask` bits PD, CREATE_FLAGS (no flag set) and SEND_OPS_FLAGS; per QP type the send
//! operations rxe offers, less those the software HCA lacks (memory-window binds, TSO, flush,
//! atomic write), else `EOPNOTSUPP`; CQ `wc_flags` within rxe's set (`IBV_WC_STANDARD_FLAGS`),
//! else `EOPNOTSUPP`.
//!
//! The builder keeps the WRs of one `wr_start` .. `wr_complete` batch (with copies of their
//! SGE lists and inline data, as ibv_wr_post(3) requires: the caller's buffers may be reused
//! once a `wr_set_*` returns) and posts them to the software HCA in order at `wr_complete`;
//! `wr_abort` drops them. Inline data goes through a bounce buffer of `max_inline_data` bytes
//! registered in the QP's PD, which the HCA copies from while posting. As ibv_wr_post(3) says,
//! the caller serialises `wr_start` .. `wr_complete` of one QP (rdma-core's providers take a
//! lock in `wr_start` and drop it in `wr_complete`); the builder itself takes none. An error in
//! a builder call (too many SGEs: `EINVAL`; inline data over `max_inline_data`: `ENOSPC`; more
//! WRs than `max_send_wr`: `ENOMEM`; a `wr_set_*` with no WR begun: `EINVAL`) is kept and
//! returned by `wr_complete`, which then posts nothing (rxe's behaviour). A WR the HCA refuses
//! at `wr_complete` returns its errno; the WRs before it are posted.

// The constants keep verbs.h's names, as bindgen writes them.
#![allow(non_upper_case_globals)]

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use std::sync::Arc;

use hca::ibverbs::ffi::*;
use hca::{AccessFlags, SendFlags, SendWr, Sge, WcOpcode, WorkCompletion};

use super::{
    errno_of, ibv_create_cq, inner, send_op, set_errno, wc_to_c, AbiCq, AbiPd, AbiQp, AppMemory,
    MAX_SGE,
};

// ---------------------------------------------------------------------------------------------
// QPs.

/// One WR of the current batch: the C WR the builder calls fill (opcode, union fields, id,
/// flags; `sg_list` unused), where its SGEs are in [`Builder::sges`], and its inline bytes in
/// [`Builder::inline`].
#[derive(Clone, Copy)]
struct Pending {
    wr: ibv_send_wr,
    sges: (usize, usize),
    inline: Option<(usize, usize)>,
}

/// The registered bounce buffer of a QP's inline sends.
struct Bounce {
    buf: Box<[u8]>,
    lkey: u32,
}

/// The work-request builder of a QP made by ibv_create_qp_ex.
pub(crate) struct Builder {
    err: c_int,
    wrs: Vec<Pending>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    bounce: Option<Bounce>,
    max_wr: usize,
    max_sge: usize,
    max_inline: usize,
}

impl Builder {
    fn clear(&mut self) {
        self.err = 0;
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
    }
}

/// The QP and its builder of a `struct ibv_qp_ex` this library made with a builder (None for
/// one without, which the `wr_*` callbacks never see: only QPs with a builder have them).
///
/// # Safety
/// `qp` is from [`vctx_create_qp_ex`] and not destroyed; the caller serialises the builder
/// calls of this QP (ibv_wr_post(3)).
unsafe fn parts<'a>(qp: *mut ibv_qp_ex) -> Option<(&'a AbiQp, &'a mut Builder)> {
    // SAFETY: the caller's promise; the builder is in an UnsafeCell, used by one thread.
    unsafe {
        let q = &*qp.cast::<AbiQp>();
        let b = q.builder.as_ref()?;
        Some((q, &mut *b.get()))
    }
}

/// Begins a WR of `opcode`: its id and flags from the QP's `wr_id` / `wr_flags`; `fill` sets
/// the opcode's union fields.
///
/// # Safety
/// As [`parts`].
unsafe fn begin(qp: *mut ibv_qp_ex, opcode: ibv_wr_opcode, fill: impl FnOnce(&mut ibv_send_wr)) {
    // SAFETY: the caller's promise.
    let Some((_, b)) = (unsafe { parts(qp) }) else {
        return;
    };
    if b.err != 0 {
        return;
    }
    if b.wrs.len() >= b.max_wr {
        b.err = libc::ENOMEM;
        return;
    }
    // SAFETY: the program wrote these fields before the call (ibv_wr_post(3)).
    let (wr_id, wr_flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    let mut wr = ibv_send_wr {
        wr_id,
        opcode,
        send_flags: wr_flags,
        ..ibv_send_wr::default()
    };
    fill(&mut wr);
    let at = b.sges.len();
    b.wrs.push(Pending {
        wr,
        sges: (at, 0),
        inline: None,
    });
}

/// The WR begun last, or `EINVAL` kept in the builder.
fn last(b: &mut Builder) -> Option<&mut Pending> {
    if b.err != 0 {
        return None;
    }
    if b.wrs.is_empty() {
        b.err = libc::EINVAL;
    }
    b.wrs.last_mut()
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: a QP of ours with a builder.
    if let Some((_, b)) = unsafe { parts(qp) } {
        b.clear();
    }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: as above.
    if let Some((_, b)) = unsafe { parts(qp) } {
        b.clear();
    }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: as above.
    let Some((q, b)) = (unsafe { parts(qp) }) else {
        return libc::EINVAL;
    };
    if b.err != 0 {
        let e = b.err;
        b.clear();
        return e;
    }
    // SAFETY: its context is open.
    let i = unsafe { inner(q.qpx.qp_base.context) };
    let mut rc = 0;
    for p in &b.wrs {
        // SAFETY: the union fields the builder set for the opcode.
        let op = match unsafe { send_op(&p.wr, q.qp_type) } {
            Ok(op) => op,
            Err(e) => {
                rc = e;
                break;
            }
        };
        let mut flags = SendFlags::from_bits_retain(p.wr.send_flags);
        let one;
        let sg_list: &[Sge] = match (p.inline, b.bounce.as_mut()) {
            (Some((at, len)), Some(bounce)) => {
                bounce.buf[..len].copy_from_slice(&b.inline[at..at + len]);
                flags |= SendFlags::INLINE;
                one = [Sge {
                    addr: bounce.buf.as_ptr() as u64,
                    length: len as u32,
                    lkey: bounce.lkey,
                }];
                &one[..usize::from(len > 0)]
            }
            (Some(_), None) => {
                flags |= SendFlags::INLINE;
                &[]
            }
            (None, _) => &b.sges[p.sges.0..p.sges.0 + p.sges.1],
        };
        let posted = i.verbs.post_send(
            q.qpx.qp_base.qp_num,
            &SendWr {
                wr_id: p.wr.wr_id,
                sg_list,
                op,
                send_flags: flags,
            },
        );
        if let Err(e) = posted {
            rc = errno_of(&e);
            break;
        }
    }
    b.clear();
    rc
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: a QP of ours with a builder.
    unsafe { begin(qp, ibv_wr_opcode_IBV_WR_SEND, |_| {}) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, |w| {
            w.__bindgen_anon_1.imm_data = imm_data;
        });
    }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_SEND_WITH_INV, |w| {
            w.__bindgen_anon_1.invalidate_rkey = invalidate_rkey;
        });
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_LOCAL_INV, |w| {
            w.__bindgen_anon_1.invalidate_rkey = invalidate_rkey;
        });
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_RDMA_WRITE, |w| {
            w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        });
    }
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: __be32,
) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM, |w| {
            w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            w.__bindgen_anon_1.imm_data = imm_data;
        });
    }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_RDMA_READ, |w| {
            w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        });
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP, |w| {
            w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        });
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: as above.
    unsafe {
        begin(qp, ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, |w| {
            w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        });
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: as above.
    let Some((_, b)) = (unsafe { parts(qp) }) else {
        return;
    };
    if let Some(p) = last(b) {
        p.wr.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn,
            remote_qkey,
        };
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let s = ibv_sge { addr, length, lkey };
    // SAFETY: as above; one SGE.
    unsafe { wr_set_sge_list(qp, 1, &s) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: as above.
    let Some((_, b)) = (unsafe { parts(qp) }) else {
        return;
    };
    let max_sge = b.max_sge;
    let at = b.sges.len();
    let Some(p) = last(b) else { return };
    if num_sge > max_sge || (num_sge > 0 && sg_list.is_null()) {
        b.err = libc::EINVAL;
        return;
    }
    p.sges = (at, num_sge);
    p.inline = None;
    for k in 0..num_sge {
        // SAFETY: the caller's list of `num_sge` entries.
        let s = unsafe { &*sg_list.add(k) };
        b.sges.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let d = ibv_data_buf { addr, length };
    // SAFETY: as above; one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &d) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: as above.
    let Some((_, b)) = (unsafe { parts(qp) }) else {
        return;
    };
    let max_inline = b.max_inline;
    let at = b.inline.len();
    if last(b).is_none() {
        return;
    }
    if num_buf > 0 && buf_list.is_null() {
        b.err = libc::EINVAL;
        return;
    }
    let mut total = 0usize;
    for k in 0..num_buf {
        // SAFETY: the caller's list of `num_buf` entries.
        let d = unsafe { &*buf_list.add(k) };
        total = total.saturating_add(d.length);
        if total > max_inline {
            b.inline.truncate(at);
            b.err = libc::ENOSPC;
            return;
        }
        if d.length > 0 {
            // SAFETY: the caller's buffer of `length` bytes (ibv_wr_set_inline_data(3)).
            let bytes = unsafe { core::slice::from_raw_parts(d.addr.cast::<u8>(), d.length) };
            b.inline.extend_from_slice(bytes);
        }
    }
    if let Some(p) = b.wrs.last_mut() {
        p.inline = Some((at, total));
        p.sges = (b.sges.len(), 0);
    }
}

/// `IBV_QP_EX_WITH_*` operations the software HCA offers per QP type: rxe's, less memory-window
/// binds, flush and atomic write.
fn supported_send_ops(qp_type: u32) -> Option<u64> {
    let f = |x: u32| u64::from(x);
    let rc = f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV);
    let uc = f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV);
    let ud = f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND)
        | f(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM);
    match qp_type {
        ibv_qp_type_IBV_QPT_RC => Some(rc),
        ibv_qp_type_IBV_QPT_UC => Some(uc),
        ibv_qp_type_IBV_QPT_UD => Some(ud),
        _ => None,
    }
}

/// `verbs_context->create_qp_ex`, which verbs.h's inline ibv_create_qp_ex(3) calls when
/// `comp_mask` is more than `IBV_QP_INIT_ATTR_PD`: the QP of ibv_create_qp(3) plus, with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, the `wr_*` callbacks of the requested operations. Null
/// with `errno`: `EOPNOTSUPP` for another `comp_mask` bit, a create flag or an operation the
/// QP type lacks (as rxe), `EINVAL` without a PD, else as ibv_create_qp(3).
///
/// # Safety
/// `context` is open; `attr` points to a `struct ibv_qp_init_attr_ex`.
pub(crate) unsafe extern "C" fn vctx_create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { attr.as_mut() }) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    let supported_mask = ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
        | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS
        | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let with_ops = a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    let create_flags = a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS != 0;
    let ops_ok =
        supported_send_ops(a.qp_type).is_some_and(|sup| !with_ops || a.send_ops_flags & !sup == 0);
    if a.comp_mask & !supported_mask != 0 || (create_flags && a.create_flags != 0) || !ops_ok {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: `struct ibv_qp_init_attr_ex` begins with `struct ibv_qp_init_attr`'s fields
    // (verbs.h; rdma-core casts it so); the PD is the caller's.
    let qp = unsafe { super::create_qp(a.pd, attr.cast::<ibv_qp_init_attr>()) };
    if qp.is_null() {
        return qp;
    }
    // SAFETY: just made by create_qp: an AbiQp no one else holds yet.
    let q = unsafe { &mut *qp.cast::<AbiQp>() };
    let max_inline = a.cap.max_inline_data as usize;
    let bounce = if max_inline > 0 {
        // SAFETY: the caller's PD, an AbiPd of an open context.
        let (p, i) = unsafe {
            let p = &*a.pd.cast::<AbiPd>();
            (p, inner(p.pd.context))
        };
        let buf = vec![0u8; max_inline].into_boxed_slice();
        let memory = Arc::new(AppMemory {
            base: buf.as_ptr() as usize,
            len: buf.len(),
        });
        let iova = buf.as_ptr() as u64;
        match i.verbs.reg_mr(
            p.handle,
            memory,
            0,
            max_inline,
            iova,
            AccessFlags::LOCAL_WRITE,
        ) {
            Ok(mr) => Some(Bounce {
                buf,
                lkey: mr.lkey(),
            }),
            Err(e) => {
                let errno = errno_of(&e);
                // SAFETY: the QP just made, not handed out.
                unsafe { super::ibv_destroy_qp(qp) };
                set_errno(errno);
                return null_mut();
            }
        }
    } else {
        None
    };
    q.builder = Some(Box::new(UnsafeCell::new(Builder {
        err: 0,
        wrs: Vec::with_capacity(a.cap.max_send_wr as usize),
        sges: Vec::new(),
        inline: Vec::new(),
        bounce,
        max_wr: a.cap.max_send_wr as usize,
        max_sge: (a.cap.max_send_sge as usize).min(MAX_SGE),
        max_inline,
    })));
    let ops = if with_ops { a.send_ops_flags } else { 0 };
    let has = |flag: u32| ops & u64::from(flag) != 0;
    let x = &mut q.qpx;
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    if a.qp_type == ibv_qp_type_IBV_QPT_UD {
        x.wr_set_ud_addr = Some(wr_set_ud_addr);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND) {
        x.wr_send = Some(wr_send);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM) {
        x.wr_send_imm = Some(wr_send_imm);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV) {
        x.wr_send_inv = Some(wr_send_inv);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV) {
        x.wr_local_inv = Some(wr_local_inv);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE) {
        x.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ) {
        x.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    qp
}

/// What ibv_destroy_qp frees besides the QP: the builder's registered bounce buffer.
pub(crate) fn drop_builder(q: &AbiQp) {
    if let Some(b) = &q.builder {
        // SAFETY: the QP is being destroyed: no builder call runs (the verbs contract).
        let b = unsafe { &*b.get() };
        if let Some(bounce) = &b.bounce {
            // SAFETY: the QP's context is open.
            let _ = unsafe { inner(q.qpx.qp_base.context) }
                .verbs
                .dereg_mr(bounce.lkey);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CQs.

/// The CQ of a `struct ibv_cq_ex` this library made.
///
/// # Safety
/// `cq` is from [`vctx_create_cq_ex`] (or ibv_create_cq) and not destroyed; one thread polls it
/// between `start_poll` and `end_poll` (ibv_create_cq_ex(3)).
unsafe fn cq_of<'a>(cq: *mut ibv_cq_ex) -> &'a AbiCq {
    // SAFETY: the caller's promise.
    unsafe { &*cq.cast::<AbiCq>() }
}

/// Takes the next completion into the CQ's current one; `ENOENT` when there is none.
///
/// # Safety
/// As [`cq_of`].
unsafe fn poll_one(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller's promise.
    let c = unsafe { cq_of(cq) };
    // SAFETY: its context is open.
    let i = unsafe { inner(c.cqx.context) };
    let mut one = [WorkCompletion::success(0, WcOpcode::Send, 0, 0)];
    match i.verbs.poll_cq(c.handle, &mut one) {
        Ok(1) => {
            // SAFETY: the poller's own slot (one poller at a time) and the CQ's public fields.
            unsafe {
                *c.current.get() = one[0];
                (*cq).status = one[0].status as u32;
                (*cq).wr_id = one[0].wr_id;
            }
            0
        }
        Ok(_) => {
            set_errno(libc::ENOENT);
            libc::ENOENT
        }
        Err(e) => {
            let e = errno_of(&e);
            set_errno(e);
            e
        }
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller's attributes, if any.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    // SAFETY: a CQ of ours.
    unsafe { poll_one(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a CQ of ours.
    unsafe { poll_one(cq) }
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The current completion as `struct ibv_wc`.
///
/// # Safety
/// As [`cq_of`], after a successful `start_poll` / `next_poll`.
unsafe fn current(cq: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: the caller's promise.
    wc_to_c(unsafe { &*cq_of(cq).current.get() })
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.byte_len
}

unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: a CQ of ours; the union's two views are one `__be32`.
    unsafe { current(cq).__bindgen_anon_1.imm_data }
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.src_qp
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> core::ffi::c_uint {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.wc_flags
}

unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a CQ of ours.
    u32::from(unsafe { current(cq) }.slid)
}

unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.sl
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: a CQ of ours.
    unsafe { current(cq) }.dlid_path_bits
}

/// `IBV_WC_EX_WITH_*` fields the software HCA reports: rxe's set (`IBV_WC_STANDARD_FLAGS`).
const SUPPORTED_WC_FLAGS: u64 = (ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `verbs_context->create_cq_ex`, which verbs.h's inline ibv_create_cq_ex(3) calls: the CQ of
/// ibv_create_cq(3) with the polling callbacks and a `read_*` for each requested `wc_flags`
/// field. Null with `errno` `EOPNOTSUPP` for a field outside rxe's set or a parent domain
/// (`IBV_CQ_INIT_ATTR_MASK_PD`); `EINVAL` for a `cqe` over `INT_MAX`; else as ibv_create_cq(3).
///
/// # Safety
/// `context` is open; `attr` points to a `struct ibv_cq_init_attr_ex`.
pub(crate) unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0
        || a.comp_mask & !ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
    {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    // SAFETY: the caller's context and channel.
    let cq = unsafe {
        ibv_create_cq(
            context,
            cqe,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        )
    };
    if cq.is_null() {
        return null_mut();
    }
    // SAFETY: just made: an AbiCq not handed out yet.
    let x = unsafe { &mut (*cq.cast::<AbiCq>()).cqx };
    let has = |flag: u32| a.wc_flags & u64::from(flag) != 0;
    x.start_poll = Some(start_poll);
    x.next_poll = Some(next_poll);
    x.end_poll = Some(end_poll);
    x.read_opcode = Some(read_opcode);
    x.read_vendor_err = Some(read_vendor_err);
    x.read_wc_flags = Some(read_wc_flags);
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN) {
        x.read_byte_len = Some(read_byte_len);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM) {
        x.read_imm_data = Some(read_imm_data);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM) {
        x.read_qp_num = Some(read_qp_num);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP) {
        x.read_src_qp = Some(read_src_qp);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID) {
        x.read_slid = Some(read_slid);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL) {
        x.read_sl = Some(read_sl);
    }
    if has(ibv_create_cq_wc_flags_IBV_WC_EX_WITH_DLID_PATH_BITS) {
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
    core::ptr::from_mut(x)
}
