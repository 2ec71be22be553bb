//! # A drop-in `librdmacm.so.1` over the software HCA
//!
//! This crate builds `librdmacm.so` (SONAME `librdmacm.so.1`) with the symbols and symbol
//! versions of rdma-core 44's librdmacm (`RDMACM_1.0` ... `RDMACM_1.3`, its
//! `librdmacm/librdmacm.map`). It holds no state: each `rdma_*` call forwards to the function
//! of the same name with the `softrdmacm_` prefix in the drop-in `libibverbs.so.1` (crate
//! `ibverbs-abi`, module `rdmacm`, version node `IBVERBS_PRIVATE_RDMACM`), which it links
//! against (`DT_NEEDED libibverbs.so.1`), so that the CM IDs use that library's contexts, PDs
//! and QPs: one copy of the device state per process. An unmodified program linked against
//! rdma-core's librdmacm (`rping`, `ucmatose`, `rdma_server`, `ib_write_bw -R`) runs on the
//! software HCA when both libraries are found first:
//!
//! ```text
//! cargo build --release -p ibverbs-abi -p rdmacm-abi
//! LD_LIBRARY_PATH=target/release ROCE_DEVICES=rxe0=udp:127.0.0.1 rping -s -a 127.0.0.1 -v
//! ```
//!
//! What is refused (rdma-core's `-1` with `errno`): multicast (`rdma_join_multicast`,
//! `rdma_join_multicast_ex`, `rdma_leave_multicast`) and ECE (`rdma_set_local_ece`,
//! `rdma_get_remote_ece`, `rdma_reject_ece`) fail with `EOPNOTSUPP`; rsockets are not built:
//! `rsocket`, `rbind`, `rsend`, ... fail with `ENOSYS`, while `rpoll` and `rselect` (which the
//! tools use on the event channel's descriptor) are poll(2) and select(2), every descriptor being
//! a plain one.
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// Exports `$name` at version `$ver` (`@@`, the default a program links against) as a call of
/// `$target` in libibverbs.so.1; build.rs writes the version script and the link stub from
/// these lines.
macro_rules! forward {
    ($name:ident, $target:ident, $ver:literal, fn($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        extern "C" {
            fn $target($($arg: $ty),*) $(-> $ret)?;
        }
        #[doc = concat!("`", stringify!($name), "` (rdma-core ", $ver, "): see its man page.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the same signature, in the drop-in libibverbs.so.1; the caller's promises
            // are that function's.
            unsafe { $target($($arg),*) }
        }
        core::arch::global_asm!(concat!(
            ".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    };
}

/// Exports `$name` at version `$ver`, failing with -1 (`$ret`) and `errno` `$errno`.
macro_rules! refuse {
    ($name:ident, $ver:literal, $errno:expr, fn($($ty:ty),*) -> $ret:ty = $val:expr) => {
        #[doc = concat!("`", stringify!($name), "` (rdma-core ", $ver, "): not built here; fails with `errno` ", stringify!($errno), ".")]
        #[no_mangle]
        pub extern "C" fn $name($(_: $ty),*) -> $ret {
            // SAFETY: __errno_location returns this thread's errno slot.
            unsafe { *libc::__errno_location() = $errno };
            $val
        }
        core::arch::global_asm!(concat!(
            ".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    };
}

type Ptr = *mut c_void;

forward!(
    rdma_create_event_channel,
    softrdmacm_create_event_channel,
    "RDMACM_1.0",
    fn() -> Ptr
);
forward!(
    rdma_destroy_event_channel,
    softrdmacm_destroy_event_channel,
    "RDMACM_1.0",
    fn(channel: Ptr)
);
forward!(
    rdma_get_cm_event,
    softrdmacm_get_cm_event,
    "RDMACM_1.0",
    fn(channel: Ptr, event: *mut Ptr) -> c_int
);
forward!(
    rdma_ack_cm_event,
    softrdmacm_ack_cm_event,
    "RDMACM_1.0",
    fn(event: Ptr) -> c_int
);
forward!(
    rdma_event_str,
    softrdmacm_event_str,
    "RDMACM_1.0",
    fn(event: c_uint) -> *const c_char
);
forward!(
    rdma_create_id,
    softrdmacm_create_id,
    "RDMACM_1.0",
    fn(channel: Ptr, id: *mut Ptr, context: Ptr, ps: c_uint) -> c_int
);
forward!(
    rdma_destroy_id,
    softrdmacm_destroy_id,
    "RDMACM_1.0",
    fn(id: Ptr) -> c_int
);
forward!(
    rdma_bind_addr,
    softrdmacm_bind_addr,
    "RDMACM_1.0",
    fn(id: Ptr, addr: Ptr) -> c_int
);
forward!(
    rdma_resolve_addr,
    softrdmacm_resolve_addr,
    "RDMACM_1.0",
    fn(id: Ptr, src: Ptr, dst: Ptr, timeout_ms: c_int) -> c_int
);
forward!(
    rdma_resolve_route,
    softrdmacm_resolve_route,
    "RDMACM_1.0",
    fn(id: Ptr, timeout_ms: c_int) -> c_int
);
forward!(
    rdma_listen,
    softrdmacm_listen,
    "RDMACM_1.0",
    fn(id: Ptr, backlog: c_int) -> c_int
);
forward!(
    rdma_connect,
    softrdmacm_connect,
    "RDMACM_1.0",
    fn(id: Ptr, conn_param: Ptr) -> c_int
);
forward!(
    rdma_accept,
    softrdmacm_accept,
    "RDMACM_1.0",
    fn(id: Ptr, conn_param: Ptr) -> c_int
);
forward!(
    rdma_reject,
    softrdmacm_reject,
    "RDMACM_1.0",
    fn(id: Ptr, private_data: *const c_void, len: u8) -> c_int
);
forward!(
    rdma_disconnect,
    softrdmacm_disconnect,
    "RDMACM_1.0",
    fn(id: Ptr) -> c_int
);
forward!(
    rdma_establish,
    softrdmacm_establish,
    "RDMACM_1.2",
    fn(id: Ptr) -> c_int
);
forward!(
    rdma_notify,
    softrdmacm_notify,
    "RDMACM_1.0",
    fn(id: Ptr, event: c_int) -> c_int
);
forward!(
    rdma_migrate_id,
    softrdmacm_migrate_id,
    "RDMACM_1.0",
    fn(id: Ptr, channel: Ptr) -> c_int
);
forward!(
    rdma_set_option,
    softrdmacm_set_option,
    "RDMACM_1.0",
    fn(id: Ptr, level: c_int, optname: c_int, optval: Ptr, optlen: usize) -> c_int
);
forward!(
    rdma_get_src_port,
    softrdmacm_get_src_port,
    "RDMACM_1.0",
    fn(id: Ptr) -> u16
);
forward!(
    rdma_get_dst_port,
    softrdmacm_get_dst_port,
    "RDMACM_1.0",
    fn(id: Ptr) -> u16
);
forward!(
    rdma_get_devices,
    softrdmacm_get_devices,
    "RDMACM_1.0",
    fn(num_devices: *mut c_int) -> *mut Ptr
);
forward!(
    rdma_free_devices,
    softrdmacm_free_devices,
    "RDMACM_1.0",
    fn(list: *mut Ptr)
);
forward!(
    rdma_create_qp,
    softrdmacm_create_qp,
    "RDMACM_1.0",
    fn(id: Ptr, pd: Ptr, qp_init_attr: Ptr) -> c_int
);
forward!(
    rdma_create_qp_ex,
    softrdmacm_create_qp_ex,
    "RDMACM_1.0",
    fn(id: Ptr, qp_init_attr: Ptr) -> c_int
);
forward!(
    rdma_destroy_qp,
    softrdmacm_destroy_qp,
    "RDMACM_1.0",
    fn(id: Ptr)
);
forward!(
    rdma_init_qp_attr,
    softrdmacm_init_qp_attr,
    "RDMACM_1.2",
    fn(id: Ptr, qp_attr: Ptr, qp_attr_mask: *mut c_int) -> c_int
);
forward!(
    rdma_create_srq,
    softrdmacm_create_srq,
    "RDMACM_1.0",
    fn(id: Ptr, pd: Ptr, attr: Ptr) -> c_int
);
forward!(
    rdma_create_srq_ex,
    softrdmacm_create_srq_ex,
    "RDMACM_1.0",
    fn(id: Ptr, attr: Ptr) -> c_int
);
forward!(
    rdma_destroy_srq,
    softrdmacm_destroy_srq,
    "RDMACM_1.0",
    fn(id: Ptr)
);
forward!(
    rdma_getaddrinfo,
    softrdmacm_getaddrinfo,
    "RDMACM_1.0",
    fn(node: *const c_char, service: *const c_char, hints: *const c_void, res: *mut Ptr) -> c_int
);
forward!(
    rdma_freeaddrinfo,
    softrdmacm_freeaddrinfo,
    "RDMACM_1.0",
    fn(res: Ptr)
);
forward!(
    rdma_create_ep,
    softrdmacm_create_ep,
    "RDMACM_1.0",
    fn(id: *mut Ptr, res: Ptr, pd: Ptr, qp_init_attr: Ptr) -> c_int
);
forward!(
    rdma_destroy_ep,
    softrdmacm_destroy_ep,
    "RDMACM_1.0",
    fn(id: Ptr)
);
forward!(
    rdma_get_request,
    softrdmacm_get_request,
    "RDMACM_1.0",
    fn(listen: Ptr, id: *mut Ptr) -> c_int
);

refuse!(rdma_join_multicast, "RDMACM_1.0", libc::EOPNOTSUPP, fn(Ptr, Ptr, Ptr) -> c_int = -1);
refuse!(rdma_leave_multicast, "RDMACM_1.0", libc::EOPNOTSUPP, fn(Ptr, Ptr) -> c_int = -1);
refuse!(rdma_join_multicast_ex, "RDMACM_1.1", libc::EOPNOTSUPP, fn(Ptr, Ptr, Ptr) -> c_int = -1);
refuse!(rdma_set_local_ece, "RDMACM_1.3", libc::EOPNOTSUPP, fn(Ptr, Ptr) -> c_int = -1);
refuse!(rdma_get_remote_ece, "RDMACM_1.3", libc::EOPNOTSUPP, fn(Ptr, Ptr) -> c_int = -1);
refuse!(rdma_reject_ece, "RDMACM_1.3", libc::EOPNOTSUPP, fn(Ptr, *const c_void, u8) -> c_int = -1);

refuse!(rsocket, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int, c_int) -> c_int = -1);
refuse!(rbind, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, u32) -> c_int = -1);
refuse!(rlisten, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int) -> c_int = -1);
refuse!(raccept, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, Ptr) -> c_int = -1);
refuse!(rconnect, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, u32) -> c_int = -1);
refuse!(rshutdown, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int) -> c_int = -1);
refuse!(rclose, "RDMACM_1.0", libc::ENOSYS, fn(c_int) -> c_int = -1);
refuse!(rrecv, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, usize, c_int) -> isize = -1);
refuse!(rrecvfrom, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, usize, c_int, Ptr, Ptr) -> isize = -1);
refuse!(rrecvmsg, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, c_int) -> isize = -1);
refuse!(rsend, "RDMACM_1.0", libc::ENOSYS, fn(c_int, *const c_void, usize, c_int) -> isize = -1);
refuse!(rsendto, "RDMACM_1.0", libc::ENOSYS, fn(c_int, *const c_void, usize, c_int, Ptr, u32) -> isize = -1);
refuse!(rsendmsg, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, c_int) -> isize = -1);
refuse!(rread, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, usize) -> isize = -1);
refuse!(rreadv, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, c_int) -> isize = -1);
refuse!(rwrite, "RDMACM_1.0", libc::ENOSYS, fn(c_int, *const c_void, usize) -> isize = -1);
refuse!(rwritev, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, c_int) -> isize = -1);
refuse!(rgetpeername, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, Ptr) -> c_int = -1);
refuse!(rgetsockname, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, Ptr) -> c_int = -1);
refuse!(rsetsockopt, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int, c_int, *const c_void, u32) -> c_int = -1);
refuse!(rgetsockopt, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int, c_int, Ptr, Ptr) -> c_int = -1);
refuse!(rfcntl, "RDMACM_1.0", libc::ENOSYS, fn(c_int, c_int, usize) -> c_int = -1);
refuse!(riomap, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, usize, c_int, c_int, i64) -> i64 = -1);
refuse!(riounmap, "RDMACM_1.0", libc::ENOSYS, fn(c_int, Ptr, usize) -> c_int = -1);
refuse!(riowrite, "RDMACM_1.0", libc::ENOSYS, fn(c_int, *const c_void, usize, i64, c_int) -> usize = usize::MAX);

/// `rpoll` (rdma-core RDMACM_1.0): poll(2), as rsockets' rpoll is for descriptors that are not
/// rsockets (no rsocket exists here).
///
/// # Safety
/// poll(2)'s: `fds` points to `nfds` entries.
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { libc::poll(fds, nfds, timeout) }
}
core::arch::global_asm!(".symver rpoll, rpoll@@RDMACM_1.0");

/// `rselect` (rdma-core RDMACM_1.0): select(2), as for [`rpoll`].
///
/// # Safety
/// select(2)'s.
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
}
core::arch::global_asm!(".symver rselect, rselect@@RDMACM_1.0");
