//! The AF_XDP link: kernel bypass on a NIC the kernel keeps (Linux's
//! Documentation/networking/af_xdp.rst). An XDP program on the interface
//! ([`program`], source `hca/xdp/roce_redirect.bpf.c`) redirects RoCEv2 frames (UDP destination
//! port 4791, IPv4 and IPv6, untagged Ethernet) arriving on the bound queue to this link's AF_XDP
//! socket and passes everything else (ARP, ping, TCP ...) to the kernel stack as before.
//!
//! The socket's memory is a UMEM of [`FRAMES`] frames of [`FRAME_SIZE`] bytes, shared by four
//! rings of [`RING_SIZE`] entries: the fill ring gives the kernel frames to receive into
//! ([`RX_FRAMES`] of them, each recycled to it once its RoCEv2 datagram went to the engine), the
//! RX ring hands received frames over, the TX ring takes built frames and the completion ring
//! returns them to the link's free list. Each received frame is checked (Ethernet to this MAC,
//! no VLAN, IPv4 header checksum and no fragment, destination one of this link's addresses, UDP
//! length; `link::vfio`'s frame classifier) and handed to the engine with its IP header's fields,
//! where the ICRC is verified over them (IBTA vol. 1 Annex A17.3.3): frames that fail are
//! dropped and counted per reason ([`XdpLinkCounters`], the engine's ICRC counters).
//! Transmitted frames are built whole in a UMEM frame: the engine writes the UDP payload
//! ([`SoftHca::poll_transmit`](crate::engine::SoftHca::poll_transmit)) at [`PAYLOAD_AT`], the
//! link writes the Ethernet, IP and UDP headers in front of it with the `roce` crate, the
//! destination MAC from the kernel's neighbour table (module `neigh`).
//!
//! MR memory in the UMEM ([`XdpLink::alloc_mr_memory`], [`UmemMemory`]): the UMEM holds,
//! after its packet frames, an arena of [`XdpLinkConfig::mr_arena`] bytes that the tools and
//! the collectives allocate their MRs from when the link is AF_XDP. What is zero-copy, each way:
//! * transmit: an RC request's or RDMA READ response's payload in such an MR leaves without a
//!   CPU copy: the socket is bound with `XDP_USE_SG` (Linux >= 6.6) and the packet is a chain of
//!   TX descriptors, its headers in a packet frame, then the payload where it lies in the MR (one
//!   descriptor per UMEM chunk it touches), then the pad and ICRC
//!   ([`XdpLinkCounters::tx_zero_copy`]). A zero-copy driver DMAs it from there; in copy mode
//!   (veth, virtio-net) the kernel copies each descriptor into its socket buffer, as it does
//!   every frame. A payload in other memory is copied once into the frame
//!   ([`XdpLinkCounters::tx_copied`]); UC / UD and inline payloads are copied by the engine.
//! * receive: the driver writes a frame into a UMEM frame from the fill ring, which is not the
//!   MR (the receiver does not know where a packet goes until its headers are parsed), so the
//!   engine copies each payload into the MR once ([`XdpLinkCounters::rx_copied`]), straight
//!   from the UMEM frame (no copy before it).
//!
//! The socket is bound with `XDP_USE_NEED_WAKEUP`: a sendto(2) is made only when the kernel
//! asks for one on the TX ring, a recvfrom(2) only when it asks on the fill ring; with
//! [`XdpLinkConfig::busy_poll`] the socket also sets `SO_PREFER_BUSY_POLL` / `SO_BUSY_POLL` and
//! the progress thread spins before it sleeps. Zero-copy mode (`XDP_ZEROCOPY`) is asked for
//! first and copy mode (`XDP_COPY`) taken when the driver has none (veth, virtio-net).
//!
//! The `unsafe` code is in `sys` (system calls, rings) and `umem` (the MR memory's accesses).
//!
//! Privileges: root, or `CAP_NET_ADMIN` + `CAP_BPF` + `CAP_NET_RAW`. The program is attached
//! through a BPF link owned by the process: it is detached when the link closes and, by the
//! kernel, when the process dies (SIGKILL included); nothing is pinned.

mod link;
pub(crate) mod neigh;
pub mod program;
mod sys;
mod umem;

pub use link::{
    XdpError, XdpLink, XdpLinkConfig, XdpLinkCounters, XdpPoller, DEFAULT_MR_ARENA, FRAMES,
    FRAME_SIZE, PAYLOAD_AT, RING_SIZE, RX_FRAMES, TRAILER_AT, TX_SLOT,
};
pub use program::AttachMode;
pub use umem::UmemMemory;

/// Runs `f` with the calling thread in the network namespace `name` (`/var/run/netns/NAME`, as
/// ip-netns(8) makes them) and moves the thread back after; sockets `f` opens and threads it
/// starts stay in `name`. For a process that drives devices on both sides of a namespace
/// boundary (the conformance suite across a veth pair). Needs `CAP_SYS_ADMIN`.
///
/// # Errors
/// The namespace (or this thread's own, `/proc/thread-self/ns/net`) cannot be opened, or
/// setns(2) fails (`EPERM`); `f` is then not run.
pub fn with_netns<T>(name: &str, f: impl FnOnce() -> T) -> std::io::Result<T> {
    use std::os::fd::AsFd;
    if name.is_empty() || name.contains('/') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a network namespace name: {name:?}"),
        ));
    }
    let own = std::fs::File::open("/proc/thread-self/ns/net")?;
    let target = std::fs::File::open(format!("/var/run/netns/{name}"))?;
    sys::setns_net(target.as_fd())?;
    let out = f();
    sys::setns_net(own.as_fd())?;
    Ok(out)
}
