//! # A drop-in `libibverbs.so.1` over the software HCA
//!
//! This crate builds `libibverbs.so` (SONAME `libibverbs.so.1`) with rdma-core's C ABI: the
//! symbols and symbol versions of rdma-core 44's libibverbs (`IBVERBS_1.0` ... `IBVERBS_1.14`,
//! `IBVERBS_PRIVATE_34`), the struct layouts of its `infiniband/verbs.h` (the bindgen output
//! [`hca::ibverbs::ffi`]), and the function tables the header's `static inline` verbs call
//! (`context->ops.post_send`, `poll_cq`, `req_notify_cq`, `post_recv`, `post_srq_recv`, and
//! `verbs_context->query_port`). An unmodified program linked against rdma-core's libibverbs
//! (`ibv_devices`, `ibv_devinfo`, `ibv_rc_pingpong`, ...) runs on the software HCA ([`hca::soft`])
//! when this library is found first:
//!
//! ```text
//! cargo build --release -p ibverbs-abi
//! LD_LIBRARY_PATH=target/release ROCE_DEVICES=rxe0=udp:127.0.0.1 ibv_devinfo -v
//! ```
//!
//! No kernel module and no root: each opened device is a UDP socket on port 4791 of its address.
//!
//! ## Devices
//! [`config::device_specs`]: `ROCE_DEVICES` (`NAME=udp:ADDRESS[,NAME=udp:ADDRESS...]`, comma or
//! space separated) lists the devices and the address each binds; without it there is one
//! device per network interface that is up and has an address, loopback included, named
//! `rxe_IFNAME` (`rxe_lo`, `rxe_eth0`) and bound to the interface's first IPv4 address (else its
//! first IPv6 one). The device's GID table is the software HCA's: index 0 is the bound address as
//! a RoCEv2 GID (IPv4-mapped for IPv4).
//!
//! ## Many processes per address
//! Devices are shared by default, as rxe's are: every process of the host may open a device on
//! the same address at once (a slot per process, [`hca::soft::UdpDeviceConfig`]'s `share`;
//! `SOFT_HCA_SHARE=0` turns it off, and then only one process at a time can open a device on a
//! given address).
//!
//! ## RDMA CM (`librdmacm.so.1`)
//! [`rdmacm`] implements rdma-core's `rdma_*` calls for the drop-in `librdmacm.so.1` (crate
//! `rdmacm-abi`, which forwards to the `softrdmacm_*` functions this library exports in its
//! private version node `IBVERBS_PRIVATE_RDMACM`), so that CM IDs, their QPs and PDs are this
//! library's objects. QP1 of a shared device belongs to its slot 0 (the first process on the
//! address): a process in another slot gets no MADs, so RDMA CM programs run one per address
//! (server and client on two addresses) for now.
//!
//! ## What fails, and how
//! Verbs the software HCA lacks fail as a provider without them fails in rdma-core: extended
//! verbs reached through `struct verbs_context` (ibv_create_qp_ex, ibv_create_cq_ex,
//! ibv_query_device_ex falls back to ibv_query_device) find a null entry and fail with
//! `EOPNOTSUPP`; exported verbs it lacks (memory windows, XRC, multicast, dma-buf MRs, ECE,
//! resizing a CQ, rereg_mr, importing objects) return `EOPNOTSUPP` (or
//! null with `errno` set to it).
#![deny(missing_docs)]
#![deny(unsafe_code)]

/// Gives `$name` the version `$ver` (`@@`: the default a program links against); build.rs
/// writes the version script from these lines.
macro_rules! symver {
    ($name:ident, $ver:literal) => {
        core::arch::global_asm!(concat!(
            ".symver ",
            stringify!($name),
            ", ",
            stringify!($name),
            "@@",
            $ver
        ));
    };
}

#[allow(unsafe_code)]
mod compat;
pub mod config;
#[allow(unsafe_code)]
mod ffi;
#[allow(unsafe_code)]
pub mod rdmacm;
