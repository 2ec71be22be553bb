//! Opening a PCI device through VFIO: container, group, device, and its regions.
//!
//! VFIO (Linux `Documentation/driver-api/vfio.rst`) gives a process a PCI device safely: the
//! device must be bound to `vfio-pci`; the unit of isolation is the IOMMU *group* (devices that
//! can reach each other's DMA), which is usable only when *viable* (no device of the group is
//! driven by the host); a *container* holds groups and one IOMMU context, here the Type1 IOMMU in
//! which the driver maps its DMA memory. The device file then exposes regions: BARs (mmap-able
//! register windows) and the PCI configuration space (read and written with pread/pwrite).
//!
//! Every step checks what the kernel says and fails with a [`VfioError`] naming the device and
//! the step, before any later step runs.

use std::fmt;
use std::sync::Arc;

use vfio_bindings::bindings::vfio::{
    vfio_irq_info, vfio_region_info, VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_DEVICE_FLAGS_PCI,
    VFIO_GROUP_FLAGS_VIABLE, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE, VFIO_TYPE1_IOMMU,
};

use super::dma::Container;
use super::error::VfioError;
use super::os;
use super::pci::CONFIG_LEN;

/// A PCI address, `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// PCI domain (segment), 16 bits.
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl PciAddress {
    /// Parses `DDDD:BB:DD.F` or `BB:DD.F` (hexadecimal; domain 0 when omitted), as `lspci` and
    /// sysfs write them.
    ///
    /// # Errors
    /// [`VfioError::BadAddress`].
    pub fn parse(text: &str) -> Result<PciAddress, VfioError> {
        let bad = || VfioError::BadAddress {
            text: text.to_owned(),
        };
        let hex = |s: &str, max_digits: usize| -> Result<u32, VfioError> {
            if s.is_empty() || s.len() > max_digits {
                return Err(bad());
            }
            u32::from_str_radix(s, 16).map_err(|_| bad())
        };
        let parts: Vec<&str> = text.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, r] => (hex(d, 4)?, hex(b, 2)?, *r),
            [b, r] => (0, hex(b, 2)?, *r),
            _ => return Err(bad()),
        };
        let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
        let (device, function) = (hex(dev, 2)?, hex(func, 1)?);
        if device > 31 || function > 7 {
            return Err(bad());
        }
        Ok(PciAddress {
            domain: domain as u16,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    /// `0000:00:04.0`, as sysfs names the device.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Where this driver puts its IOVAs: from 4 GiB (above the 32-bit MSI window at 0xfee00000 that
/// x86 IOMMUs reserve) for 64 GiB, inside the 39-bit address width of the smallest VT-d
/// implementations (QEMU's intel-iommu default).
pub(crate) const IOVA_BASE: u64 = 1 << 32;
/// Length of the IOVA window, bytes.
pub(crate) const IOVA_LEN: u64 = 64 << 30;

/// An open VFIO PCI device in its own container.
#[derive(Debug)]
pub(crate) struct VfioDevice {
    name: String,
    /// The container (shared with every DMA mapping, which must be able to unmap itself).
    container: Arc<Container>,
    /// The group stays open while the device is used (closing it detaches the container).
    _group: os::Fd,
    group_number: u32,
    fd: os::Fd,
    config: vfio_region_info,
    num_regions: u32,
}

impl VfioDevice {
    /// Opens `addr`: checks the driver binding and the IOMMU group in sysfs, opens a container
    /// and checks its API version and Type1 support, opens the group and checks it is viable,
    /// attaches it, selects the Type1 IOMMU (v2 when offered), opens the device and checks it is
    /// PCI with a readable configuration region.
    pub(crate) fn open(addr: &PciAddress) -> Result<VfioDevice, VfioError> {
        let name = addr.to_string();
        let ioctl = |op: &'static str| {
            let name = name.clone();
            move |source| VfioError::Ioctl {
                device: name,
                op,
                source,
            }
        };
        if !os::pci_device_exists(&name) {
            return Err(VfioError::NoSuchDevice { device: name });
        }
        let driver = os::pci_driver(&name).map_err(ioctl("read the driver link in sysfs"))?;
        if driver.as_deref() != Some("vfio-pci") {
            return Err(VfioError::NotBoundToVfio {
                device: name,
                driver,
            });
        }
        let group_number = os::pci_iommu_group(&name)
            .map_err(ioctl("read the iommu_group link in sysfs"))?
            .ok_or_else(|| VfioError::NoIommuGroup {
                device: name.clone(),
            })?;
        let container = os::open_container().map_err(|source| VfioError::VfioUnavailable {
            device: name.clone(),
            source,
        })?;
        let version = os::get_api_version(&container).map_err(ioctl("VFIO_GET_API_VERSION"))?;
        if version != VFIO_API_VERSION as i32 {
            return Err(VfioError::ApiVersion {
                device: name,
                version,
            });
        }
        let v2 = os::check_extension(&container, VFIO_TYPE1v2_IOMMU)
            .map_err(ioctl("VFIO_CHECK_EXTENSION"))?;
        let v1 = os::check_extension(&container, VFIO_TYPE1_IOMMU)
            .map_err(ioctl("VFIO_CHECK_EXTENSION"))?;
        if !v1 && !v2 {
            return Err(VfioError::NoType1Iommu { device: name });
        }
        let group = os::open_group(group_number).map_err(ioctl("open /dev/vfio/<group>"))?;
        let status = os::group_get_status(&group).map_err(ioctl("VFIO_GROUP_GET_STATUS"))?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                device: name,
                group: group_number,
            });
        }
        os::group_set_container(&group, &container).map_err(ioctl("VFIO_GROUP_SET_CONTAINER"))?;
        let iommu = if v2 {
            VFIO_TYPE1v2_IOMMU
        } else {
            VFIO_TYPE1_IOMMU
        };
        os::set_iommu(&container, iommu).map_err(ioctl("VFIO_SET_IOMMU"))?;
        let info = os::iommu_get_info(&container).map_err(ioctl("VFIO_IOMMU_GET_INFO"))?;
        if info.iova_pgsizes != 0 && info.iova_pgsizes & 0x1000 == 0 {
            return Err(VfioError::NotPci {
                device: name,
                what: format!(
                    "the IOMMU does not map 4 KiB pages (page sizes {:#x})",
                    info.iova_pgsizes
                ),
            });
        }
        let fd =
            os::group_get_device_fd(&group, &name).map_err(ioctl("VFIO_GROUP_GET_DEVICE_FD"))?;
        let dinfo = os::device_get_info(&fd).map_err(ioctl("VFIO_DEVICE_GET_INFO"))?;
        if dinfo.flags & VFIO_DEVICE_FLAGS_PCI == 0 {
            return Err(VfioError::NotPci {
                device: name,
                what: format!(
                    "VFIO reports flags {:#x} without VFIO_DEVICE_FLAGS_PCI",
                    dinfo.flags
                ),
            });
        }
        if dinfo.num_regions <= VFIO_PCI_CONFIG_REGION_INDEX {
            return Err(VfioError::NotPci {
                device: name,
                what: format!(
                    "VFIO reports {} regions, no configuration space",
                    dinfo.num_regions
                ),
            });
        }
        let config = os::device_get_region_info(&fd, VFIO_PCI_CONFIG_REGION_INDEX)
            .map_err(ioctl("VFIO_DEVICE_GET_REGION_INFO (config)"))?;
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        if config.size < CONFIG_LEN as u64 || config.flags & rw != rw {
            return Err(VfioError::NotPci {
                device: name,
                what: format!(
                    "configuration region of {} bytes, flags {:#x}",
                    config.size, config.flags
                ),
            });
        }
        let container = Arc::new(Container::new(container, name.clone(), IOVA_BASE, IOVA_LEN));
        Ok(VfioDevice {
            name,
            container,
            _group: group,
            group_number,
            fd,
            config,
            num_regions: dinfo.num_regions,
        })
    }

    /// The PCI address, as sysfs writes it.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The IOMMU group number.
    pub(crate) fn group(&self) -> u32 {
        self.group_number
    }

    /// The container, for DMA mappings.
    pub(crate) fn container(&self) -> &Arc<Container> {
        &self.container
    }

    fn ioctl_error(&self, op: &'static str, source: std::io::Error) -> VfioError {
        VfioError::Ioctl {
            device: self.name.clone(),
            op,
            source,
        }
    }

    /// The first 256 bytes of the configuration space.
    pub(crate) fn read_config(&self) -> Result<[u8; CONFIG_LEN], VfioError> {
        let mut buf = [0u8; CONFIG_LEN];
        os::region_read(&self.fd, self.config.offset, &mut buf)
            .map_err(|e| self.ioctl_error("pread of the configuration space", e))?;
        Ok(buf)
    }

    /// Reads the 16-bit configuration register at `offset`.
    pub(crate) fn config_read16(&self, offset: usize) -> Result<u16, VfioError> {
        let mut b = [0u8; 2];
        os::region_read(&self.fd, self.config.offset + offset as u64, &mut b)
            .map_err(|e| self.ioctl_error("pread of the configuration space", e))?;
        Ok(u16::from_le_bytes(b))
    }

    /// Writes the 16-bit configuration register at `offset`.
    pub(crate) fn config_write16(&self, offset: usize, value: u16) -> Result<(), VfioError> {
        os::region_write(
            &self.fd,
            self.config.offset + offset as u64,
            &value.to_le_bytes(),
        )
        .map_err(|e| self.ioctl_error("pwrite of the configuration space", e))
    }

    /// `VFIO_DEVICE_GET_IRQ_INFO` of interrupt `index`.
    pub(crate) fn irq_info(&self, index: u32) -> Result<vfio_irq_info, VfioError> {
        os::device_get_irq_info(&self.fd, index)
            .map_err(|e| self.ioctl_error("VFIO_DEVICE_GET_IRQ_INFO", e))
    }

    /// Makes vectors `0..fds.len()` of interrupt `index` signal `fds`.
    pub(crate) fn set_irq_eventfds(&self, index: u32, fds: &[&os::Fd]) -> Result<(), VfioError> {
        os::device_set_irq_eventfds(&self.fd, index, fds)
            .map_err(|e| self.ioctl_error("VFIO_DEVICE_SET_IRQS", e))
    }

    /// Maps BAR `bar` (0..=5) whole.
    pub(crate) fn map_bar(&self, bar: u8) -> Result<os::Mmio, VfioError> {
        let cap = |what: String| VfioError::Capability {
            device: self.name.clone(),
            what,
        };
        if u32::from(bar) >= self.num_regions.min(6) {
            return Err(cap(format!("BAR {bar} does not exist")));
        }
        let info = os::device_get_region_info(&self.fd, u32::from(bar))
            .map_err(|e| self.ioctl_error("VFIO_DEVICE_GET_REGION_INFO (BAR)", e))?;
        if info.size == 0 {
            return Err(cap(format!("BAR {bar} is not implemented (size 0)")));
        }
        if info.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(cap(format!(
                "BAR {bar} cannot be mmap()ed (region flags {:#x}): an I/O port BAR?",
                info.flags
            )));
        }
        let len = usize::try_from(info.size)
            .map_err(|_| cap(format!("BAR {bar} of {} bytes", info.size)))?;
        os::map_region(&self.fd, info.offset, len).map_err(|e| self.ioctl_error("mmap of a BAR", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_parse_and_print() {
        let a = PciAddress::parse("0000:00:04.0").unwrap();
        assert_eq!(a.to_string(), "0000:00:04.0");
        let b = PciAddress::parse("3a:1f.7").unwrap();
        assert_eq!(b.to_string(), "0000:3a:1f.7");
        for bad in [
            "",
            "00:04",
            "0000:00:20.0",
            "00:04.8",
            "x0:04.0",
            "00000:00:04.0",
            "0:0:0:0.0",
        ] {
            assert!(
                matches!(PciAddress::parse(bad), Err(VfioError::BadAddress { .. })),
                "{bad}"
            );
        }
    }
}
