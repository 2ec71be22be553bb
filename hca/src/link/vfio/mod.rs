//! A userspace virtio-net driver over VFIO, as a link for the software HCA: kernel bypass.
//!
//! With this link the kernel is not on the data path at all: the process maps the NIC's registers
//! and drives its queues itself, and the NIC reads and writes the process's memory by DMA,
//! fenced in by the IOMMU. The NIC is a modern (virtio 1.x) virtio-net PCI function, which every
//! QEMU guest can have (`-device virtio-net-pci,disable-legacy=on,iommu_platform=on` behind
//! `-device intel-iommu`); ixy.rs (`ixy-languages/ixy.rs`, `src/virtio.rs`) is the driver this
//! one learned from. ixy drives the legacy interface (device 0x1000) through the I/O BAR in
//! sysfs (`resource0`) and gives the device physical addresses; this one drives the modern
//! interface through VFIO, and the device sees only what is mapped in its IOMMU context.
//!
//! # How the driver is built, bottom up
//!
//! | module | what it holds |
//! |---|---|
//! | `sys` | every system call: VFIO ioctls (structures from `vfio-bindings`), pread/pwrite of the configuration space, mmap of BARs, volatile MMIO loads and stores, sysfs links. In unit tests the same signatures come from `sys_fake`: a fake kernel with an emulated virtio-net device, IOMMU and sysfs. |
//! | `dma` | the container's IOMMU (Type1): an IOVA allocator, `DmaRegion` (hugepage-backed, locked memory that unmaps itself from the IOMMU on drop, before it is freed), and the mapping of registered memory. With `sys`, the only `unsafe` code. |
//! | `device` | opening the device: sysfs checks (bound to `vfio-pci`, has an IOMMU group), container (API version, Type1), group (viable), device (PCI, configuration region), BAR mapping. |
//! | `pci` | configuration space: vendor/device IDs, command register, the capability list and the virtio capabilities (common, notify, ISR, device configuration; virtio spec §4.1.4). |
//! | `virtio` | the transport: `virtio_pci_common_cfg`, reset with a bounded wait, feature negotiation (§3.1.1), queue set-up, notification. |
//! | `virtqueue` | split virtqueues (§2.7): `repr(C)` descriptor and ring layouts, publishing with Release, notification suppression with a SeqCst fence, validated used-ring consumption. |
//! | `net` | the virtio-net device (§5.1): the 12-byte `virtio_net_hdr`, receive buffers refilled in batches, transmit slots and chains. |
//! | `frame`, `neigh` | layer 2/3: sorting received frames, ARP and IPv6 Neighbor Discovery, Ethernet/IP/UDP headers around RoCEv2 payloads. |
//! | `link` | [`VfioLink`]: the engine's progress over all of it, and memory registration that maps regions into the IOMMU. |
//!
//! [`VfioLink`] implements [`crate::link::Link`], so the same progress engine and verbs API that
//! run over the UDP socket run over this NIC: [`crate::soft::VfioDevice`] (and the tools'
//! `--link vfio:PCI_ADDRESS`). [`VfioLink::poll`] remains for programs that drive the engine
//! themselves (the `vfio_pingpong` example).
//!
//! Size, in lines of code (non-blank, non-comment, unit tests excluded), beside ixy.rs
//! (`ixy-languages/ixy.rs` at d3fc461, December 2023), whose virtio driver this one learned from:
//!
//! | part | here | ixy.rs |
//! |---|---|---|
//! | virtio transport, virtqueues, virtio-net | 1253 (`virtio`, `virtqueue`, `net`) | 739 (`virtio.rs`, `virtio_constants.rs`) |
//! | VFIO, PCI, DMA memory, system calls | 1098 (`device`, `dma`, `pci`, `sys`) | 746 (`vfio.rs`, `pci.rs`, `memory.rs`, shared with its ixgbe driver) |
//! | typed errors | 285 (`error`) | none (panics and boxed errors) |
//! | Ethernet/IP/UDP, ARP, Neighbor Discovery, the engine's link | 1544 (`frame`, `neigh`, `link`) | none (raw frames) |
//!
//! The difference in the driver proper (2351 against 1485 lines) is the modern virtio interface
//! (capability parsing, feature negotiation with ACCESS_PLATFORM) instead of the legacy I/O BAR,
//! the IOMMU (Type1 container and group, IOVA allocation, mapping of registered memory) instead
//! of physical addresses, validation of every value the device writes, MSI-X, and the fake
//! kernel's seams; the test fake (`sys_fake`, 864) and tests (795) come on top.
//!
//! # Bringing a device up ([`VfioLink::open`])
//!
//! 1. sysfs: `/sys/bus/pci/devices/<addr>` exists, its `driver` is `vfio-pci`
//!    ([`VfioError::NotBoundToVfio`]), it has an `iommu_group` ([`VfioError::NoIommuGroup`]).
//! 2. `/dev/vfio/vfio`: API version 0, Type1 IOMMU offered ([`VfioError::NoType1Iommu`]).
//! 3. `/dev/vfio/<group>`: viable ([`VfioError::GroupNotViable`]); attached to the container;
//!    `VFIO_SET_IOMMU` (Type1v2 when offered); the device fd; PCI with a configuration region.
//! 4. Configuration space: vendor 0x1af4, device 0x1041 / 0x1000 ([`VfioError::NotVirtioNet`]);
//!    the virtio capabilities; their BARs mmap()ed; memory decoding, bus mastering on, INTx off.
//! 5. virtio: reset (bounded, [`VfioError::ResetTimeout`]), ACKNOWLEDGE, DRIVER, features:
//!    VERSION_1 and ACCESS_PLATFORM required (without ACCESS_PLATFORM the device would bypass the
//!    IOMMU), MAC and MTU taken when offered, nothing else; FEATURES_OK checked
//!    ([`VfioError::Features`]).
//! 6. Queues 0 (receive) and 1 (transmit): each in one 2 MiB-rounded DMA region, its descriptor
//!    table and available ring mapped device-read-only, its used ring read-write, receive buffers
//!    read-write, transmit slots read-only. All receive buffers posted; DRIVER_OK; receive
//!    queue notified.
//!
//! Dropping the link resets the device (bounded) before any DMA memory is unmapped, and unmaps
//! before freeing.
//!
//! # The data path
//!
//! Polling, by default: the driver sets `VIRTQ_AVAIL_F_NO_INTERRUPT` on both queues and never
//! waits for an interrupt (INTx is disabled, no MSI-X vector is assigned). Receive: up to a burst
//! of used buffers is taken (each validated: a chain the device owned, a length within the
//! buffer), each frame is sorted without a copy (RoCEv2 straight from the DMA buffer into the
//! engine), and the buffers go back to the device in batches. Transmit: the engine builds each
//! packet's UDP payload straight into a DMA transmit slot, the link writes the Ethernet/IP/UDP
//! headers in front and the 12-byte header before that, and one publication plus at most one
//! notification (skipped while the device sets `VIRTQ_USED_F_NO_NOTIFY`) hands a whole batch to
//! the device.
//!
//! Zero copy: every memory region registered over the link (`SoftDevice::reg_mr` /
//! `reg_mr_range`, also through `dyn Verbs`, and [`VfioLink::reg_mr`]) has its pages mapped
//! into the IOMMU, device-read-only and `mlock`ed (unless the memory's provider locks it), page
//! extents shared between registrations mapped once and counted (module `mr_map`); memory
//! without a host address (GPU device memory) is registered unmapped. The engine builds each
//! packet with `SoftHca::poll_transmit_gather`: an RC request's or READ response's payload
//! stays in the region, and the link posts one descriptor chain per packet,
//! `[virtio-net header + Ethernet/IP/UDP + transport headers, in a slot] -> [payload at the
//! region's IOVA, one descriptor per IOMMU extent] -> [pad + ICRC, at the slot's end]`; the CPU
//! reads the payload once (the engine's ICRC) and copies none of it. The slot holds the
//! payload's memory and extents (`Arc`s) until the device returns the chain in the used ring,
//! so nothing is unmapped or freed while the device may still read it; deregistration removes
//! the keys at once and the mapping once the device is done (bounded wait, else
//! [`VfioError::RegionBusy`] and the mapping goes when the chain comes back). Indirect
//! descriptors are not negotiated: a chain longer than 16 descriptors or than the free ones
//! allow, a payload in unmapped memory, or a packet that must wait for ARP / Neighbor Discovery
//! is copied into its slot instead. A full ring holds packets back in the engine (nothing is
//! dropped). [`VfioLinkCounters::tx_gathered`] and [`VfioLinkCounters::tx_gather_copied`] count
//! both ways; UC/UD, inline and GPU payloads are copied by the engine itself.
//! [`VfioLink::send_gather`] sends a hand-made packet the same way.
//!
//! Interrupts, as an option ([`VfioLinkConfig::interrupts`]): MSI-X vector 0 is routed by
//! `VFIO_DEVICE_SET_IRQS` to an eventfd and assigned to the receive queue; [`VfioLink::wait`]
//! clears `VIRTQ_AVAIL_F_NO_INTERRUPT` only for the wait, re-checks the used ring after a SeqCst
//! fence (no lost wake-up), and sleeps in poll(2) until the interrupt or the next timer.

mod device;
mod dma;
mod error;
pub(crate) mod frame;
mod link;
mod mr_map;
mod neigh;
mod net;
mod pci;
#[cfg_attr(test, allow(dead_code))]
mod sys;
#[cfg(test)]
pub(crate) mod sys_fake;
mod virtio;
mod virtqueue;

/// The system-call layer the driver uses: the kernel, or in unit tests the fake one.
#[cfg(not(test))]
use sys as os;
#[cfg(test)]
use sys_fake as os;

pub use device::PciAddress;
pub use error::VfioError;
pub use link::{
    IdlePolicy, MrSlice, Progress, VfioLink, VfioLinkConfig, VfioLinkCounters, VfioPoller,
};
pub use neigh::{NeighbourCounters, NeighbourState};
pub use net::NicCounters;

#[cfg(test)]
mod tests;
