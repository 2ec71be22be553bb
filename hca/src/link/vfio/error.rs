//! The errors of the VFIO link: one variant per failing step, each naming the PCI device.

use std::fmt;
use std::io;

use crate::verbs::error::VerbsError;

/// Why a VFIO device could not be opened, initialised or driven. Every variant names the device by
/// its PCI address (`0000:00:04.0`); `Display` says what failed and, where one exists, what to do.
#[derive(Debug)]
#[non_exhaustive]
pub enum VfioError {
    /// The text is not a PCI address (`DDDD:BB:DD.F` or `BB:DD.F`, hexadecimal).
    BadAddress {
        /// The text given.
        text: String,
    },
    /// No PCI device has this address (`/sys/bus/pci/devices/<address>` is missing).
    NoSuchDevice {
        /// The PCI address.
        device: String,
    },
    /// The device is not bound to `vfio-pci` (bound to another driver, or to none).
    NotBoundToVfio {
        /// The PCI address.
        device: String,
        /// The driver it is bound to, if any.
        driver: Option<String>,
    },
    /// The device has no IOMMU group: the IOMMU is off (no `intel_iommu=on`, no emulated IOMMU),
    /// and this driver never runs without one (DMA would reach all of memory).
    NoIommuGroup {
        /// The PCI address.
        device: String,
    },
    /// `/dev/vfio/vfio` could not be opened (the `vfio` module is not loaded, or no permission).
    VfioUnavailable {
        /// The PCI address.
        device: String,
        /// The failed open(2).
        source: io::Error,
    },
    /// The kernel's VFIO API version is not the one this driver speaks (`VFIO_API_VERSION`, 0).
    ApiVersion {
        /// The PCI address.
        device: String,
        /// What `VFIO_GET_API_VERSION` returned.
        version: i32,
    },
    /// The container offers no Type1 IOMMU (`VFIO_CHECK_EXTENSION(VFIO_TYPE1{,v2}_IOMMU)` is 0):
    /// `vfio_iommu_type1` is not loaded or the platform has no IOMMU driver.
    NoType1Iommu {
        /// The PCI address.
        device: String,
    },
    /// The IOMMU group is not viable: another device of the group is bound to a host driver
    /// (`VFIO_GROUP_FLAGS_VIABLE` clear). Bind every device of the group to `vfio-pci`.
    GroupNotViable {
        /// The PCI address.
        device: String,
        /// The IOMMU group number.
        group: u32,
    },
    /// A VFIO call on the container, group or device failed.
    Ioctl {
        /// The PCI address.
        device: String,
        /// The call (`VFIO_GROUP_SET_CONTAINER`, `open /dev/vfio/7`, `pread config space`, ...).
        op: &'static str,
        /// The errno.
        source: io::Error,
    },
    /// The device is not a PCI device, or VFIO describes it inconsistently.
    NotPci {
        /// The PCI address.
        device: String,
        /// What is wrong.
        what: String,
    },
    /// The device is not a virtio network device (vendor 0x1af4, device 0x1041 modern or 0x1000
    /// transitional, virtio spec §4.1.2.1).
    NotVirtioNet {
        /// The PCI address.
        device: String,
        /// PCI vendor ID.
        vendor: u16,
        /// PCI device ID.
        device_id: u16,
    },
    /// A virtio PCI capability is missing or malformed (virtio spec §4.1.4), or names a BAR
    /// region that cannot be mapped.
    Capability {
        /// The PCI address.
        device: String,
        /// What is wrong.
        what: String,
    },
    /// An MMIO access fell outside the mapped register window (a device whose capabilities
    /// lie about their lengths).
    Mmio {
        /// The PCI address.
        device: String,
        /// The register structure (`common`, `notify`, `device`).
        window: &'static str,
        /// Byte offset of the access in the window.
        offset: usize,
    },
    /// The device did not complete a reset (device_status never read back 0) within the bound.
    ResetTimeout {
        /// The PCI address.
        device: String,
        /// How long the driver waited, in milliseconds.
        waited_ms: u64,
    },
    /// Feature negotiation failed (virtio spec §3.1.1 steps 4-6, §6).
    Features {
        /// The PCI address.
        device: String,
        /// The features the device offered (bit n = feature n).
        offered: u64,
        /// What failed: a required feature missing, or FEATURES_OK refused.
        what: String,
    },
    /// A virtqueue cannot be set up (size 0, too small, or enable refused).
    Queue {
        /// The PCI address.
        device: String,
        /// The virtqueue index (0: receiveq1, 1: transmitq1).
        queue: u16,
        /// What failed.
        what: String,
    },
    /// Host memory for DMA could not be allocated.
    DmaAlloc {
        /// The PCI address.
        device: String,
        /// Bytes asked for.
        len: usize,
        /// The failed allocation.
        source: gpu_p2p::HostMemoryError,
    },
    /// mlock(2) of registered memory's pages failed (`RLIMIT_MEMLOCK`): the memory is not
    /// mapped, since the rule is that mapped memory stays locked in RAM.
    Pin {
        /// The PCI address.
        device: String,
        /// Bytes to lock.
        len: u64,
        /// The failed mlock(2).
        source: std::io::Error,
    },
    /// The IOVA window has no free range of this size.
    IovaExhausted {
        /// The PCI address.
        device: String,
        /// Bytes asked for.
        len: u64,
    },
    /// `VFIO_IOMMU_MAP_DMA` or `VFIO_IOMMU_UNMAP_DMA` failed.
    Dma {
        /// The PCI address.
        device: String,
        /// `map` or `unmap`.
        op: &'static str,
        /// The I/O virtual address of the range.
        iova: u64,
        /// Length of the range in bytes.
        len: u64,
        /// The errno (ENOMEM: the locked-memory limit `RLIMIT_MEMLOCK` is too low).
        source: io::Error,
    },
    /// The transmit ring is full: every descriptor is still owned by the device.
    TxRingFull {
        /// The PCI address.
        device: String,
        /// Descriptors in the ring.
        queue_size: u16,
    },
    /// A frame does not fit the transmit buffer or the link MTU.
    FrameTooLong {
        /// The PCI address.
        device: String,
        /// Frame length in bytes (without the virtio-net header).
        len: usize,
        /// The most this link sends, in bytes.
        max: usize,
    },
    /// The device set DEVICE_NEEDS_RESET (virtio spec §2.1.1) or FAILED: it stopped processing.
    DeviceNeedsReset {
        /// The PCI address.
        device: String,
        /// The device_status value read.
        status: u8,
    },
    /// A memory region could not be registered or deregistered with the engine.
    Verbs {
        /// The PCI address.
        device: String,
        /// The verbs error.
        source: VerbsError,
    },
    /// No memory region with this lkey is registered through this link.
    UnknownMr {
        /// The PCI address.
        device: String,
        /// The lkey.
        lkey: u32,
    },
    /// The neighbour's MAC address is not known yet (a request went out; retry later).
    Unresolved {
        /// The PCI address.
        device: String,
        /// The address being resolved.
        ip: std::net::IpAddr,
    },
    /// The device may still be reading a deregistered region (a zero-copy frame has not been
    /// sent within the bound): the region's keys are gone, and its IOMMU mapping is removed as
    /// soon as the device returns the frames' descriptors (or the link closes), never before.
    RegionBusy {
        /// The PCI address.
        device: String,
        /// The region's lkey.
        lkey: u32,
    },
    /// The link configuration, or an argument, is invalid.
    Config {
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for VfioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use VfioError::*;
        match self {
            BadAddress { text } => write!(
                f,
                "'{text}' is not a PCI address (expected DDDD:BB:DD.F or BB:DD.F, hexadecimal)"
            ),
            NoSuchDevice { device } => write!(
                f,
                "PCI device {device}: not found (/sys/bus/pci/devices/{device} is missing)"
            ),
            NotBoundToVfio { device, driver } => match driver {
                Some(d) => write!(
                    f,
                    "PCI device {device} is bound to {d}, not vfio-pci: unbind it and write \
                     vfio-pci to /sys/bus/pci/devices/{device}/driver_override, then {device} to \
                     /sys/bus/pci/drivers_probe"
                ),
                None => write!(
                    f,
                    "PCI device {device} is bound to no driver, not vfio-pci: write vfio-pci to \
                     /sys/bus/pci/devices/{device}/driver_override and {device} to \
                     /sys/bus/pci/drivers_probe"
                ),
            },
            NoIommuGroup { device } => write!(
                f,
                "PCI device {device} has no IOMMU group: no IOMMU is active (boot with \
                 intel_iommu=on / an emulated IOMMU); this driver does not run without one"
            ),
            VfioUnavailable { device, source } => write!(
                f,
                "PCI device {device}: cannot open /dev/vfio/vfio ({source}): is the vfio module \
                 loaded and are you root?"
            ),
            ApiVersion { device, version } => write!(
                f,
                "PCI device {device}: the kernel's VFIO API version is {version}, this driver \
                 speaks version 0"
            ),
            NoType1Iommu { device } => write!(
                f,
                "PCI device {device}: the VFIO container offers no Type1 IOMMU (is \
                 vfio_iommu_type1 loaded, is an IOMMU active?)"
            ),
            GroupNotViable { device, group } => write!(
                f,
                "PCI device {device}: IOMMU group {group} is not viable: every device in \
                 /sys/kernel/iommu_groups/{group}/devices must be bound to vfio-pci or unbound"
            ),
            Ioctl { device, op, source } => {
                write!(f, "PCI device {device}: {op} failed: {source}")
            }
            NotPci { device, what } => write!(f, "PCI device {device}: {what}"),
            NotVirtioNet {
                device,
                vendor,
                device_id,
            } => write!(
                f,
                "PCI device {device} ({vendor:04x}:{device_id:04x}) is not a virtio network \
                 device (1af4:1041 or 1af4:1000)"
            ),
            Capability { device, what } => {
                write!(f, "PCI device {device}: virtio capability: {what}")
            }
            Mmio {
                device,
                window,
                offset,
            } => write!(
                f,
                "PCI device {device}: MMIO access at offset {offset:#x} lies outside the {window} \
                 register window"
            ),
            ResetTimeout { device, waited_ms } => write!(
                f,
                "PCI device {device}: virtio reset did not complete (device_status not 0 after \
                 {waited_ms} ms)"
            ),
            Features {
                device,
                offered,
                what,
            } => write!(
                f,
                "PCI device {device}: virtio feature negotiation failed: {what} (device offers \
                 {offered:#018x})"
            ),
            Queue {
                device,
                queue,
                what,
            } => write!(f, "PCI device {device}: virtqueue {queue}: {what}"),
            DmaAlloc {
                device,
                len,
                source,
            } => write!(
                f,
                "PCI device {device}: cannot allocate {len} bytes of DMA memory: {source}"
            ),
            Pin {
                device,
                len,
                source,
            } => write!(
                f,
                "PCI device {device}: cannot lock {len} bytes of registered memory in RAM \
                 (mlock, RLIMIT_MEMLOCK): {source}"
            ),
            IovaExhausted { device, len } => write!(
                f,
                "PCI device {device}: no free I/O virtual address range of {len} bytes"
            ),
            Dma {
                device,
                op,
                iova,
                len,
                source,
            } => write!(
                f,
                "PCI device {device}: VFIO_IOMMU_{} of {len} bytes at iova {iova:#x} failed: \
                 {source}",
                if *op == "map" { "MAP_DMA" } else { "UNMAP_DMA" }
            ),
            TxRingFull { device, queue_size } => write!(
                f,
                "PCI device {device}: transmit ring full (all {queue_size} descriptors owned by \
                 the device)"
            ),
            FrameTooLong { device, len, max } => write!(
                f,
                "PCI device {device}: frame of {len} bytes exceeds the {max}-byte limit"
            ),
            DeviceNeedsReset { device, status } => write!(
                f,
                "PCI device {device}: device stopped (device_status {status:#04x}: \
                 DEVICE_NEEDS_RESET or FAILED)"
            ),
            Verbs { device, source } => write!(f, "PCI device {device}: {source}"),
            UnknownMr { device, lkey } => write!(
                f,
                "PCI device {device}: no memory region with lkey {lkey:#x} is registered on this \
                 link"
            ),
            Unresolved { device, ip } => write!(
                f,
                "PCI device {device}: the MAC address of {ip} is not resolved yet (ARP / \
                 Neighbor Solicitation sent)"
            ),
            RegionBusy { device, lkey } => write!(
                f,
                "PCI device {device}: memory region {lkey:#x} is still being read by the device \
                 (zero-copy frames not sent within the bound); it is unmapped once they are"
            ),
            Config { what } => write!(f, "VFIO link configuration: {what}"),
        }
    }
}

impl std::error::Error for VfioError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VfioError::VfioUnavailable { source, .. }
            | VfioError::Ioctl { source, .. }
            | VfioError::Dma { source, .. }
            | VfioError::Pin { source, .. } => Some(source),
            VfioError::DmaAlloc { source, .. } => Some(source),
            VfioError::Verbs { source, .. } => Some(source),
            _ => None,
        }
    }
}
