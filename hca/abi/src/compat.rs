//! The symbols that rdma-core's other libraries import from libibverbs besides the verbs: the
//! provider interface (`IBVERBS_PRIVATE_34`: `verbs_register_driver_34`, `ibv_cmd_*`,
//! `execute_ioctl`, ...) that Debian's `libmlx5.so.1`, `libefa.so.1`, `libmlx4.so.1` and
//! `libmana.so.1` and the ibverbs-providers plugins (`libibverbs/lib*-rdmav34.so`) link against, and the kernel-ABI helpers (`ibv_copy_*_from_kern`,
//! `ibv_resolve_eth_l2_from_gid`, ...) that `librdmacm.so.1` links against. Debian's perftest
//! binaries load all of them, so the loader must resolve every one (rdma-core
//! `libibverbs/libibverbs.map.in` gives the versions, `libibverbs/driver.h` the signatures).
//!
//! The provider interface is inert: a provider library's constructor registers its driver with
//! `verbs_register_driver_34`, which records nothing, so no provider is ever offered a device and
//! `mlx5dv_*` / `efadv_*` find no device of their kind. The `ibv_cmd_*` commands (which rdma-core
//! sends to the kernel's uverbs device, absent here) and `execute_ioctl` are therefore never
//! reached through this library; called directly they fail as rdma-core's do when the kernel
//! lacks a command: they return the positive errno `EOPNOTSUPP` (driver.h: "return 0 or an
//! errno"), and the pointer-returning ones return null with `errno` set to it.
//!
//! The helpers that need no kernel are real: `ibv_copy_*_from_kern` / `_to_kern` copy field by
//! field between the kernel's uverbs structures (`<rdma/ib_user_verbs.h>`, `<rdma/ib_user_sa.h>`)
//! and libibverbs's; `ibv_get_pkey_index` searches the one-entry P_Key table;
//! `ibv_dontfork_range` / `ibv_dofork_range` succeed (the software HCA pins no pages, see
//! ibv_fork_init(3)).

use core::ffi::{c_char, c_int, c_void};
use core::ptr::null_mut;

use hca::ibverbs::ffi::*;

use crate::ffi::set_errno;

/// The provider commands of rdma-core's driver.h that return `int` (0 or a positive errno).
/// Each is defined without parameters: under the x86-64 / AArch64 System V calling conventions
/// a caller passing arguments to it is sound (the callee reads none, the caller owns the stack).
macro_rules! inert_commands {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` (rdma-core driver.h, `IBVERBS_PRIVATE_34`): a \
            command to the kernel's uverbs device, which does not exist here: returns \
            `EOPNOTSUPP` (a positive errno, as driver.h's commands do).")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            libc::EOPNOTSUPP
        }
    )*};
}

inert_commands!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_req_notify_cq,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);
symver!(execute_ioctl, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_advise_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_alloc_dm, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_alloc_mw, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_alloc_pd, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_attach_mcast, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_close_xrcd, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_ah, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_counters, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_cq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_cq_ex, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_flow, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_flow_action_esp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_qp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_qp_ex, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_qp_ex2, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_rwq_ind_table, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_srq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_srq_ex, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_create_wq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_dealloc_mw, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_dealloc_pd, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_dereg_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_ah, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_counters, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_cq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_flow, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_flow_action, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_qp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_rwq_ind_table, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_srq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_destroy_wq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_detach_mcast, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_free_dm, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_get_context, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_cq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_flow_action_esp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_qp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_qp_ex, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_srq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_modify_wq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_open_qp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_open_xrcd, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_post_recv, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_post_send, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_post_srq_recv, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_req_notify_cq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_context, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_device_any, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_port, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_qp, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_query_srq, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_read_counters, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_reg_dm_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_reg_dmabuf_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_reg_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_rereg_mr, "IBVERBS_PRIVATE_34");
symver!(ibv_cmd_resize_cq, "IBVERBS_PRIVATE_34");

/// `ibv_cmd_poll_cq(cq, ne, wc)` (driver.h): the kernel's CQ poll, which returns the number of
/// completions or -1 (rdma-core cmd.c); there is no kernel CQ here: -1 with `errno`
/// `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_cmd_poll_cq(_cq: *mut ibv_cq, _ne: c_int, _wc: *mut ibv_wc) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}
symver!(ibv_cmd_poll_cq, "IBVERBS_PRIVATE_34");

/// `verbs_allow_disassociate_destroy` (rdma-core cmd_write.h, a `bool`): false, as rdma-core
/// leaves it unless `RDMAV_ALLOW_DISASSOC_DESTROY` is set; no provider command reads it here.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: bool = false;
symver!(verbs_allow_disassociate_destroy, "IBVERBS_PRIVATE_34");

/// `verbs_register_driver_34(const struct verbs_device_ops *)` (driver.h), called by each
/// provider library's constructor: records nothing, so the provider is never offered a device
/// (the devices here are the software HCA's, which no provider drives).
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}
symver!(verbs_register_driver_34, "IBVERBS_PRIVATE_34");

/// `_verbs_init_and_alloc_context` (driver.h): a provider's context on a kernel command fd;
/// never reached (no provider gets a device): null with `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn _verbs_init_and_alloc_context(
    _device: *mut ibv_device,
    _cmd_fd: c_int,
    _alloc_size: usize,
    _context_offset: usize,
    _driver_id: u32,
) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(_verbs_init_and_alloc_context, "IBVERBS_PRIVATE_34");

/// `verbs_open_device(device, private_data)` (driver.h; mlx5dv_open_device's path): opens a
/// provider's device with private data, which no device here has: null, `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn verbs_open_device(
    _device: *mut ibv_device,
    _private_data: *mut c_void,
) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(verbs_open_device, "IBVERBS_PRIVATE_34");

/// `verbs_set_ops(vctx, ops)` (driver.h): fills a provider context's function table; no
/// provider context exists here, so there is nothing to fill.
#[no_mangle]
pub extern "C" fn verbs_set_ops(_vctx: *mut verbs_context, _ops: *const c_void) {}
symver!(verbs_set_ops, "IBVERBS_PRIVATE_34");

/// `verbs_uninit_context(vctx)` (driver.h): the inverse of `_verbs_init_and_alloc_context`,
/// which never succeeds here: nothing to undo.
#[no_mangle]
pub extern "C" fn verbs_uninit_context(_vctx: *mut verbs_context) {}
symver!(verbs_uninit_context, "IBVERBS_PRIVATE_34");

/// `verbs_init_cq(cq, context, channel, cq_context)` (driver.h): sets the common fields of a
/// provider's `struct ibv_cq` (context, channel, cq_context, zero event counts).
///
/// # Safety
/// `cq` is null or points to a `struct ibv_cq` the caller owns.
#[no_mangle]
pub unsafe extern "C" fn verbs_init_cq(
    cq: *mut ibv_cq,
    context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
) {
    // SAFETY: the caller's CQ.
    if let Some(cq) = unsafe { cq.as_mut() } {
        cq.context = context;
        cq.channel = channel;
        cq.cq_context = cq_context;
        cq.comp_events_completed = 0;
        cq.async_events_completed = 0;
    }
}
symver!(verbs_init_cq, "IBVERBS_PRIVATE_34");

/// `__verbs_log(ctx, level, format, ...)` (driver.h's provider debug log, printf-style): the
/// providers never run here, so it prints nothing (the variadic arguments are not read, which
/// the System V calling convention allows).
#[no_mangle]
pub extern "C" fn __verbs_log(_ctx: *mut verbs_context, _level: u32, _format: *const c_char) {}
symver!(__verbs_log, "IBVERBS_PRIVATE_34");

/// ibv_is_fork_initialized(3) (`IBVERBS_1.13`): `IBV_FORK_UNNEEDED` (2), what rdma-core returns
/// when the kernel keeps registered pages valid across fork(2): the software HCA reads and writes
/// the process's memory through its own mappings and pins nothing, so a child's copy-on-write
/// cannot detach a registration.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}
symver!(ibv_is_fork_initialized, "IBVERBS_1.13");

/// ibv_get_sysfs_path (rdma-core driver.h, `IBVERBS_1.0`): `$SYSFS_PATH` or `/sys`, as
/// rdma-core; the devices here have no sysfs entries.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
symver!(ibv_get_sysfs_path, "IBVERBS_1.0");

/// ibv_dontfork_range(base, size) (driver.h, `IBVERBS_1.1`): 0. rdma-core marks the range
/// MADV_DONTFORK only after ibv_fork_init(3) and otherwise returns 0; the software HCA pins no
/// pages, so a forked child's copy-on-write never breaks a registration.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ibv_dontfork_range, "IBVERBS_1.1");

/// ibv_dofork_range(base, size) (driver.h, `IBVERBS_1.1`): 0, as [`ibv_dontfork_range`].
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
symver!(ibv_dofork_range, "IBVERBS_1.1");

/// ibv_get_pkey_index(3) (`IBVERBS_1.5`): the index of `pkey` (big-endian) in the port's P_Key
/// table, which holds only the default P_Key 0xffff at index 0 (as rxe's); -1 for any other.
#[no_mangle]
pub extern "C" fn ibv_get_pkey_index(_context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
    if port_num == 1 && u16::from_be(pkey) == 0xffff {
        0
    } else {
        -1
    }
}
symver!(ibv_get_pkey_index, "IBVERBS_1.5");

/// ibv_resolve_eth_l2_from_gid (verbs.h, `IBVERBS_1.1`): the destination MAC and VLAN of a
/// RoCE address handle. rdma-core asks the kernel's neighbour table for them; the software
/// HCA sends through a UDP socket whose kernel route resolves L2 itself, so there is no MAC to
/// report: returns `-EHOSTUNREACH` (rdma-core's return when the neighbour lookup fails).
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    _context: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    -libc::EHOSTUNREACH
}
symver!(ibv_resolve_eth_l2_from_gid, "IBVERBS_1.1");

/// The kernel's `struct ib_uverbs_ah_attr` into libibverbs's `struct ibv_ah_attr`, field by
/// field (rdma-core `libibverbs/marshall.c`).
fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// ibv_copy_ah_attr_from_kern (`<infiniband/marshall.h>`, `IBVERBS_1.1`).
///
/// # Safety
/// `dst` and `src` point to the two structures (or are null: then nothing is copied).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    // SAFETY: the caller's structures.
    if let (Some(d), Some(s)) = unsafe { (dst.as_mut(), src.as_ref()) } {
        ah_attr_from_kern(d, s);
    }
}
symver!(ibv_copy_ah_attr_from_kern, "IBVERBS_1.1");

/// ibv_copy_qp_attr_from_kern (`<infiniband/marshall.h>`, `IBVERBS_1.0`): the kernel's
/// `struct ib_uverbs_qp_attr` into `struct ibv_qp_attr`, field by field (`qp_state` is not
/// copied, as in rdma-core).
///
/// # Safety
/// `dst` and `src` point to the two structures (or are null: then nothing is copied).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    // SAFETY: the caller's structures.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    d.cur_qp_state = s.cur_qp_state;
    d.path_mtu = s.path_mtu;
    d.path_mig_state = s.path_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags as _;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    ah_attr_from_kern(&mut d.ah_attr, &s.ah_attr);
    ah_attr_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}
symver!(ibv_copy_qp_attr_from_kern, "IBVERBS_1.0");

/// ibv_copy_path_rec_from_kern (`<infiniband/marshall.h>`, `IBVERBS_1.0`): the kernel's
/// `struct ib_user_path_rec` into `struct ibv_sa_path_rec`, field by field.
///
/// # Safety
/// `dst` and `src` point to the two structures (or are null: then nothing is copied).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    // SAFETY: the caller's structures.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    d.dgid.raw = s.dgid;
    d.sgid.raw = s.sgid;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as _;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as _;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as _;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}
symver!(ibv_copy_path_rec_from_kern, "IBVERBS_1.0");

/// ibv_copy_path_rec_to_kern (`<infiniband/marshall.h>`, `IBVERBS_1.0`): the inverse of
/// [`ibv_copy_path_rec_from_kern`].
///
/// # Safety
/// `dst` and `src` point to the two structures (or are null: then nothing is copied).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    // SAFETY: the caller's structures.
    let (Some(d), Some(s)) = (unsafe { (dst.as_mut(), src.as_ref()) }) else {
        return;
    };
    // SAFETY: `union ibv_gid` is 16 bytes in every view.
    d.dgid = unsafe { s.dgid.raw };
    // SAFETY: as above.
    d.sgid = unsafe { s.sgid.raw };
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as _;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as _;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as _;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}
symver!(ibv_copy_path_rec_to_kern, "IBVERBS_1.0");

/// `_ibv_query_gid_table` (`IBVERBS_1.11`; ibv_query_gid_table(3) is an inline wrapper): the
/// valid entries of port 1's GID table into `entries` (`entry_size` bytes apart), in index
/// order; their number, or a negative errno: `-EINVAL` for flags, a short `entry_size` or a
/// table longer than `max_entries` (rdma-core's returns).
///
/// # Safety
/// `context` is open; `entries` has room for `max_entries` entries of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if flags != 0 || entry_size < core::mem::size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let mut port = ibv_port_attr::default();
    // SAFETY: the caller's context; a full `struct ibv_port_attr`.
    let rc = unsafe { crate::ffi::query_port_full(context, &mut port) };
    if rc != 0 {
        return -(rc as isize);
    }
    let mut n = 0usize;
    for index in 0..u32::try_from(port.gid_tbl_len).unwrap_or(0) {
        let mut e = ibv_gid_entry::default();
        // SAFETY: as above; one entry of ours.
        let rc = unsafe {
            crate::ffi::_ibv_query_gid_ex(context, 1, index, &mut e, 0, core::mem::size_of_val(&e))
        };
        if rc == libc::ENODATA {
            continue;
        }
        if rc != 0 {
            return -(rc as isize);
        }
        if n == max_entries {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: entry `n` of the caller's array, `entry_size` bytes apart.
        unsafe {
            *entries
                .cast::<u8>()
                .add(n * entry_size)
                .cast::<ibv_gid_entry>() = e
        };
        n += 1;
    }
    n as isize
}
symver!(_ibv_query_gid_table, "IBVERBS_1.11");

/// ibv_query_qp_data_in_order(3) (`IBVERBS_1.14`): 0, "not guaranteed", what rdma-core returns
/// for a provider that does not report it.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: u32, _flags: u32) -> c_int {
    0
}
symver!(ibv_query_qp_data_in_order, "IBVERBS_1.14");

/// ibv_query_srq(3) (`IBVERBS_1.1`): `EOPNOTSUPP`, as rdma-core for a provider without it (the
/// software HCA's verbs have no SRQ query: its armed limit changes when the limit event fires).
#[no_mangle]
pub extern "C" fn ibv_query_srq(_srq: *mut ibv_srq, _attr: *mut ibv_srq_attr) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_query_srq, "IBVERBS_1.1");

/// `IBV_REREG_MR_ERR_INPUT` (verbs.h `enum ibv_rereg_mr_err_code`).
const REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_FLAGS_SUPPORTED`: change translation, PD, access.
const REREG_MR_FLAGS_SUPPORTED: c_int = 0x7;

/// ibv_rereg_mr(3) (`IBVERBS_1.1`): `IBV_REREG_MR_ERR_INPUT` with `errno` `EINVAL` for unknown
/// flags, else with `EOPNOTSUPP` (rdma-core's for a provider without rereg; the MR is unchanged).
#[no_mangle]
pub extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    set_errno(if flags & !REREG_MR_FLAGS_SUPPORTED != 0 {
        libc::EINVAL
    } else {
        libc::EOPNOTSUPP
    });
    REREG_MR_ERR_INPUT
}
symver!(ibv_rereg_mr, "IBVERBS_1.1");

/// ibv_import_device(3) (`IBVERBS_1.10`): a context shared through a kernel command fd, which
/// the software HCA has not: null, `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(ibv_import_device, "IBVERBS_1.10");

/// ibv_import_pd(3) (`IBVERBS_1.10`): null, `errno` `EOPNOTSUPP` (no imported contexts).
#[no_mangle]
pub extern "C" fn ibv_import_pd(_context: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(ibv_import_pd, "IBVERBS_1.10");

/// ibv_import_mr(3) (`IBVERBS_1.10`): null, `errno` `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(ibv_import_mr, "IBVERBS_1.10");

/// ibv_import_dm(3) (`IBVERBS_1.13`): null, `errno` `EOPNOTSUPP` (no device memory either).
#[no_mangle]
pub extern "C" fn ibv_import_dm(_context: *mut ibv_context, _handle: u32) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}
symver!(ibv_import_dm, "IBVERBS_1.13");

/// ibv_unimport_pd(3) (`IBVERBS_1.10`): nothing was imported, nothing to release.
#[no_mangle]
pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}
symver!(ibv_unimport_pd, "IBVERBS_1.10");

/// ibv_unimport_mr(3) (`IBVERBS_1.10`): as [`ibv_unimport_pd`].
#[no_mangle]
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}
symver!(ibv_unimport_mr, "IBVERBS_1.10");

/// ibv_unimport_dm(3) (`IBVERBS_1.13`): as [`ibv_unimport_pd`].
#[no_mangle]
pub extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}
symver!(ibv_unimport_dm, "IBVERBS_1.13");
