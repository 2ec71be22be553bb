//! The virtio PCI transport of a modern (1.x) device: the common configuration registers, device
//! initialisation and feature negotiation, queue set-up and notification (virtio spec §3.1,
//! §4.1.4).
//!
//! The registers live in BAR windows that the PCI capabilities name (see `pci`); every access is a
//! volatile MMIO load or store of the register's own width through `sys`, checked against the
//! window's length. 64-bit registers are written as two 32-bit halves, low first (§4.1.3.1).
//! Every wait on the device (reset) is bounded.

use core::mem::{offset_of, size_of};
use std::time::{Duration, Instant};

use super::error::VfioError;
use super::os;
use super::pci::{VirtioCaps, Window};

/// `struct virtio_pci_common_cfg` (virtio spec §4.1.4.3), little-endian; this driver uses the
/// 1.0 fields (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct VirtioPciCommonCfg {
    /// Which 32 feature bits `device_feature` shows (0: bits 0-31, 1: bits 32-63).
    pub(crate) device_feature_select: u32,
    /// The device's feature bits (read-only).
    pub(crate) device_feature: u32,
    /// Which 32 feature bits `driver_feature` takes.
    pub(crate) driver_feature_select: u32,
    /// The driver's accepted feature bits.
    pub(crate) driver_feature: u32,
    /// MSI-X vector for configuration changes.
    pub(crate) config_msix_vector: u16,
    /// Virtqueues the device has (read-only).
    pub(crate) num_queues: u16,
    /// Device status (§2.1).
    pub(crate) device_status: u8,
    /// Changes whenever the device configuration changes (read-only).
    pub(crate) config_generation: u8,
    /// The queue the `queue_*` fields address.
    pub(crate) queue_select: u16,
    /// Queue size: the device's maximum on read; the driver may write a smaller power of two.
    pub(crate) queue_size: u16,
    /// MSI-X vector of the queue.
    pub(crate) queue_msix_vector: u16,
    /// 1 enables the queue.
    pub(crate) queue_enable: u16,
    /// The queue's notification offset, in units of `notify_off_multiplier` (read-only).
    pub(crate) queue_notify_off: u16,
    /// IOVA of the descriptor table.
    pub(crate) queue_desc: u64,
    /// IOVA of the available ring ("driver area").
    pub(crate) queue_driver: u64,
    /// IOVA of the used ring ("device area").
    pub(crate) queue_device: u64,
}

/// Device status bits (virtio spec §2.1).
pub(crate) mod status {
    /// The guest has noticed the device.
    pub(crate) const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive the device.
    pub(crate) const DRIVER: u8 = 2;
    /// The driver is set up and ready.
    pub(crate) const DRIVER_OK: u8 = 4;
    /// The driver has acknowledged the features it understands; negotiation is complete.
    pub(crate) const FEATURES_OK: u8 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub(crate) const DEVICE_NEEDS_RESET: u8 = 0x40;
    /// The driver gave up on the device.
    pub(crate) const FAILED: u8 = 0x80;
}

/// Feature bits (virtio spec §6 and §5.1.3).
pub(crate) mod feature {
    /// virtio-net: the device reports its maximum MTU in its configuration.
    pub(crate) const NET_F_MTU: u64 = 1 << 3;
    /// virtio-net: the device has a MAC address in its configuration.
    pub(crate) const NET_F_MAC: u64 = 1 << 5;
    /// virtio 1.0 or later (no legacy interface).
    pub(crate) const VERSION_1: u64 = 1 << 32;
    /// The device's DMA goes through the platform's IOMMU (virtio spec §6.1: without it, a
    /// device may bypass the IOMMU and use physical addresses).
    pub(crate) const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// `VIRTIO_MSI_NO_VECTOR`: no interrupt for this source.
pub(crate) const MSI_NO_VECTOR: u16 = 0xffff;

/// How long [`Transport::reset`] waits for the device to report the reset done.
pub(crate) const RESET_TIMEOUT: Duration = Duration::from_secs(1);

/// The features this driver accepts when offered: VERSION_1 and ACCESS_PLATFORM are required,
/// MAC and MTU are used if offered. No others: every feature accepted changes what the device may
/// do, and this driver uses none of the offloads.
pub(crate) const WANTED_FEATURES: u64 =
    feature::VERSION_1 | feature::ACCESS_PLATFORM | feature::NET_F_MAC | feature::NET_F_MTU;

/// The MMIO windows of one modern virtio PCI device.
#[derive(Debug)]
pub(crate) struct Transport {
    device: String,
    /// Mapped BARs by index (only those a capability names).
    bars: Vec<Option<os::Mmio>>,
    caps: VirtioCaps,
}

impl Transport {
    /// A transport over `bars` (indexed by BAR number). Checks that every window lies inside its
    /// mapped BAR and that the common configuration window holds the 1.0 structure.
    pub(crate) fn new(
        device: &str,
        bars: Vec<Option<os::Mmio>>,
        caps: VirtioCaps,
    ) -> Result<Transport, VfioError> {
        let t = Transport {
            device: device.to_owned(),
            bars,
            caps,
        };
        let mut windows = vec![
            ("common configuration", caps.common),
            ("notification", caps.notify),
            ("ISR status", caps.isr),
        ];
        if let Some(d) = caps.device {
            windows.push(("device configuration", d));
        }
        for (what, w) in windows {
            let bar_len = t
                .bars
                .get(usize::from(w.bar))
                .and_then(|b| b.as_ref())
                .map(|b| b.len())
                .ok_or_else(|| t.cap_error(format!("BAR {} of the {what} is not mapped", w.bar)))?;
            if u64::from(w.offset) + u64::from(w.length) > bar_len as u64 {
                return Err(t.cap_error(format!(
                    "the {what} ({} bytes at {:#x}) exceeds BAR {} ({bar_len} bytes)",
                    w.length, w.offset, w.bar
                )));
            }
        }
        if (caps.common.length as usize) < size_of::<VirtioPciCommonCfg>() {
            return Err(t.cap_error(format!(
                "the common configuration is {} bytes, needs {}",
                caps.common.length,
                size_of::<VirtioPciCommonCfg>()
            )));
        }
        Ok(t)
    }

    fn cap_error(&self, what: String) -> VfioError {
        VfioError::Capability {
            device: self.device.clone(),
            what,
        }
    }

    fn mmio_error(&self, window: &'static str, offset: usize) -> VfioError {
        VfioError::Mmio {
            device: self.device.clone(),
            window,
            offset,
        }
    }

    /// The BAR mapping and absolute offset of `offset` in window `w`, if `size` bytes fit.
    fn locate(&self, w: Window, offset: usize, size: usize) -> Option<(&os::Mmio, usize)> {
        if offset.checked_add(size)? > w.length as usize {
            return None;
        }
        let bar = self.bars.get(usize::from(w.bar))?.as_ref()?;
        Some((bar, w.offset as usize + offset))
    }

    fn common_read8(&self, offset: usize) -> Result<u8, VfioError> {
        self.locate(self.caps.common, offset, 1)
            .and_then(|(b, at)| b.read8(at))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_read16(&self, offset: usize) -> Result<u16, VfioError> {
        self.locate(self.caps.common, offset, 2)
            .and_then(|(b, at)| b.read16(at))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_read32(&self, offset: usize) -> Result<u32, VfioError> {
        self.locate(self.caps.common, offset, 4)
            .and_then(|(b, at)| b.read32(at))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_write8(&self, offset: usize, value: u8) -> Result<(), VfioError> {
        self.locate(self.caps.common, offset, 1)
            .and_then(|(b, at)| b.write8(at, value))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_write16(&self, offset: usize, value: u16) -> Result<(), VfioError> {
        self.locate(self.caps.common, offset, 2)
            .and_then(|(b, at)| b.write16(at, value))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_write32(&self, offset: usize, value: u32) -> Result<(), VfioError> {
        self.locate(self.caps.common, offset, 4)
            .and_then(|(b, at)| b.write32(at, value))
            .ok_or_else(|| self.mmio_error("common", offset))
    }

    fn common_write64(&self, offset: usize, value: u64) -> Result<(), VfioError> {
        self.common_write32(offset, value as u32)?;
        self.common_write32(offset + 4, (value >> 32) as u32)
    }

    /// Reads device_status.
    pub(crate) fn status(&self) -> Result<u8, VfioError> {
        self.common_read8(offset_of!(VirtioPciCommonCfg, device_status))
    }

    fn set_status(&self, value: u8) -> Result<(), VfioError> {
        self.common_write8(offset_of!(VirtioPciCommonCfg, device_status), value)
    }

    /// Adds `bits` to device_status.
    fn add_status(&self, bits: u8) -> Result<(), VfioError> {
        let s = self.status()?;
        self.set_status(s | bits)
    }

    /// Resets the device (writes 0 to device_status) and waits, at most `timeout`, until it reads
    /// back 0 (§2.1.2: the driver must not touch the device before the reset completes).
    pub(crate) fn reset(&self, timeout: Duration) -> Result<(), VfioError> {
        self.set_status(0)?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.status()? == 0 {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(VfioError::ResetTimeout {
                    device: self.device.clone(),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            spins += 1;
            if spins > 100 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Marks the device FAILED (the driver gave up, §3.1.1), ignoring errors.
    pub(crate) fn fail(&self) {
        let _ = self.add_status(status::FAILED);
    }

    /// The 64 feature bits the device offers.
    pub(crate) fn device_features(&self) -> Result<u64, VfioError> {
        let sel = offset_of!(VirtioPciCommonCfg, device_feature_select);
        let val = offset_of!(VirtioPciCommonCfg, device_feature);
        self.common_write32(sel, 0)?;
        let lo = self.common_read32(val)?;
        self.common_write32(sel, 1)?;
        let hi = self.common_read32(val)?;
        Ok(u64::from(lo) | u64::from(hi) << 32)
    }

    fn set_driver_features(&self, features: u64) -> Result<(), VfioError> {
        let sel = offset_of!(VirtioPciCommonCfg, driver_feature_select);
        let val = offset_of!(VirtioPciCommonCfg, driver_feature);
        self.common_write32(sel, 0)?;
        self.common_write32(val, features as u32)?;
        self.common_write32(sel, 1)?;
        self.common_write32(val, (features >> 32) as u32)
    }

    /// Steps 1-6 of device initialisation (§3.1.1): reset, ACKNOWLEDGE, DRIVER, feature
    /// negotiation (VERSION_1 and ACCESS_PLATFORM required, [`WANTED_FEATURES`] accepted when
    /// offered), FEATURES_OK and its check. Returns the negotiated features. On failure after
    /// the reset, the device is marked FAILED.
    pub(crate) fn negotiate(&self, reset_timeout: Duration) -> Result<u64, VfioError> {
        self.reset(reset_timeout)?;
        let r = self.negotiate_after_reset();
        if r.is_err() {
            self.fail();
        }
        r
    }

    fn negotiate_after_reset(&self) -> Result<u64, VfioError> {
        self.add_status(status::ACKNOWLEDGE)?;
        self.add_status(status::DRIVER)?;
        let offered = self.device_features()?;
        let fail = |what: &str| VfioError::Features {
            device: self.device.clone(),
            offered,
            what: what.to_owned(),
        };
        if offered & feature::VERSION_1 == 0 {
            return Err(fail(
                "the device does not offer VIRTIO_F_VERSION_1 (a legacy-only device; QEMU: \
                 disable-legacy=on)",
            ));
        }
        if offered & feature::ACCESS_PLATFORM == 0 {
            return Err(fail(
                "the device does not offer VIRTIO_F_ACCESS_PLATFORM: its DMA would bypass the \
                 IOMMU (QEMU: iommu_platform=on)",
            ));
        }
        let accepted = offered & WANTED_FEATURES;
        self.set_driver_features(accepted)?;
        self.add_status(status::FEATURES_OK)?;
        if self.status()? & status::FEATURES_OK == 0 {
            return Err(fail(
                "the device refused the accepted features (FEATURES_OK cleared)",
            ));
        }
        Ok(accepted)
    }

    /// Selects queue `index` and returns its maximum size (0: the queue does not exist).
    pub(crate) fn queue_max_size(&self, index: u16) -> Result<u16, VfioError> {
        self.common_write16(offset_of!(VirtioPciCommonCfg, queue_select), index)?;
        self.common_read16(offset_of!(VirtioPciCommonCfg, queue_size))
    }

    /// Configures and enables queue `index` with `size` descriptors at the given IOVAs and MSI-X
    /// `vector` ([`MSI_NO_VECTOR`]: none). Returns the byte offset of its notification address in
    /// the notification window.
    pub(crate) fn setup_queue(
        &self,
        index: u16,
        size: u16,
        vector: u16,
        areas: (u64, u64, u64),
    ) -> Result<usize, VfioError> {
        let (desc, driver, device) = areas;
        self.common_write16(offset_of!(VirtioPciCommonCfg, queue_select), index)?;
        self.common_write16(offset_of!(VirtioPciCommonCfg, queue_size), size)?;
        let msix = offset_of!(VirtioPciCommonCfg, queue_msix_vector);
        self.common_write16(msix, vector)?;
        // §4.1.5.1.2.1: the device answers NO_VECTOR when it cannot use the vector.
        if vector != MSI_NO_VECTOR && self.common_read16(msix)? != vector {
            return Err(VfioError::Queue {
                device: self.device.clone(),
                queue: index,
                what: format!("the device refused MSI-X vector {vector}"),
            });
        }
        self.common_write64(offset_of!(VirtioPciCommonCfg, queue_desc), desc)?;
        self.common_write64(offset_of!(VirtioPciCommonCfg, queue_driver), driver)?;
        self.common_write64(offset_of!(VirtioPciCommonCfg, queue_device), device)?;
        let off = self.common_read16(offset_of!(VirtioPciCommonCfg, queue_notify_off))?;
        let at = usize::from(off) * self.caps.notify_off_multiplier as usize;
        if self.locate(self.caps.notify, at, 2).is_none() {
            return Err(VfioError::Queue {
                device: self.device.clone(),
                queue: index,
                what: format!(
                    "notification offset {off} x {} lies outside the {}-byte notification window",
                    self.caps.notify_off_multiplier, self.caps.notify.length
                ),
            });
        }
        self.common_write16(offset_of!(VirtioPciCommonCfg, queue_enable), 1)?;
        if self.common_read16(offset_of!(VirtioPciCommonCfg, queue_enable))? != 1 {
            return Err(VfioError::Queue {
                device: self.device.clone(),
                queue: index,
                what: "the device did not enable the queue".into(),
            });
        }
        Ok(at)
    }

    /// Step 8 of initialisation: DRIVER_OK; the device starts processing its queues.
    pub(crate) fn driver_ok(&self) -> Result<(), VfioError> {
        self.add_status(status::DRIVER_OK)
    }

    /// Notifies the device that queue `index` has new buffers (§4.1.5.2: write the queue index
    /// at its notification address).
    pub(crate) fn notify(&self, notify_at: usize, index: u16) -> Result<(), VfioError> {
        self.locate(self.caps.notify, notify_at, 2)
            .and_then(|(b, at)| b.write16(at, index))
            .ok_or_else(|| self.mmio_error("notify", notify_at))
    }

    /// Reads `buf.len()` bytes of the device configuration at `offset` as one consistent
    /// snapshot: repeats while config_generation changes during the read (§4.1.4.3.1), at most
    /// 64 times. Each byte is read with an 8-bit access, which the spec allows for every field
    /// read this way (MAC bytes; 16-bit fields are read whole by the caller).
    pub(crate) fn device_config(&self, offset: usize, buf: &mut [u8]) -> Result<(), VfioError> {
        let w = self
            .caps
            .device
            .ok_or_else(|| self.cap_error("no device configuration capability".into()))?;
        let gen_at = offset_of!(VirtioPciCommonCfg, config_generation);
        for _ in 0..64 {
            let before = self.common_read8(gen_at)?;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = self
                    .locate(w, offset + i, 1)
                    .and_then(|(bar, at)| bar.read8(at))
                    .ok_or_else(|| self.mmio_error("device", offset + i))?;
            }
            if self.common_read8(gen_at)? == before {
                return Ok(());
            }
        }
        Err(self.cap_error("the device configuration kept changing while read".into()))
    }

    /// Reads the 16-bit device configuration field at `offset` with one 16-bit access.
    pub(crate) fn device_config16(&self, offset: usize) -> Result<u16, VfioError> {
        let w = self
            .caps
            .device
            .ok_or_else(|| self.cap_error("no device configuration capability".into()))?;
        self.locate(w, offset, 2)
            .and_then(|(bar, at)| bar.read16(at))
            .ok_or_else(|| self.mmio_error("device", offset))
    }

    /// The number of queues the device has.
    pub(crate) fn num_queues(&self) -> Result<u16, VfioError> {
        self.common_read16(offset_of!(VirtioPciCommonCfg, num_queues))
    }
}

impl Drop for Transport {
    /// Resets the device so that it stops all DMA before the queues' memory is unmapped (the
    /// owner drops the transport before the queues).
    fn drop(&mut self) {
        let _ = self.reset(RESET_TIMEOUT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_cfg_layout_matches_the_spec() {
        assert_eq!(offset_of!(VirtioPciCommonCfg, device_feature_select), 0x00);
        assert_eq!(offset_of!(VirtioPciCommonCfg, device_feature), 0x04);
        assert_eq!(offset_of!(VirtioPciCommonCfg, driver_feature_select), 0x08);
        assert_eq!(offset_of!(VirtioPciCommonCfg, driver_feature), 0x0c);
        assert_eq!(offset_of!(VirtioPciCommonCfg, config_msix_vector), 0x10);
        assert_eq!(offset_of!(VirtioPciCommonCfg, num_queues), 0x12);
        assert_eq!(offset_of!(VirtioPciCommonCfg, device_status), 0x14);
        assert_eq!(offset_of!(VirtioPciCommonCfg, config_generation), 0x15);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_select), 0x16);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_size), 0x18);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_msix_vector), 0x1a);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_enable), 0x1c);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_notify_off), 0x1e);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_desc), 0x20);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_driver), 0x28);
        assert_eq!(offset_of!(VirtioPciCommonCfg, queue_device), 0x30);
        assert_eq!(size_of::<VirtioPciCommonCfg>(), 0x38);
    }
}
