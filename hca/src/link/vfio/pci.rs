//! PCI configuration space: the header fields the driver needs and the virtio vendor capabilities
//! that say where a modern virtio device keeps its register structures.
//!
//! A PCI function's configuration space (PCI Local Bus Specification 3.0, §6.1) starts with a
//! header of vendor and device IDs, the command register (memory decoding, bus mastering, INTx
//! disable), the status register (bit 4: a capability list exists) and, at offset 0x34, the
//! pointer to a linked list of capabilities. Virtio 1.x (virtio spec §4.1.4) puts one
//! vendor-specific capability (ID 0x09) per register structure in that list: the common
//! configuration, the notification area, the ISR status and the device-specific configuration,
//! each as "BAR n, offset, length". Everything here parses bytes read from the device: a list that
//! loops, points outside the 256 bytes, or names a BAR that does not exist is an error, never a
//! hang or a panic.

use core::mem::{offset_of, size_of};

/// Bytes of the configuration space read (the conventional space; capabilities live here).
pub(crate) const CONFIG_LEN: usize = 256;

/// Offsets in the configuration space header (PCI 3.0 §6.1, type 0 header).
pub(crate) mod offset {
    /// Vendor ID, 16 bits.
    pub(crate) const VENDOR_ID: usize = 0x00;
    /// Device ID, 16 bits.
    pub(crate) const DEVICE_ID: usize = 0x02;
    /// Command register, 16 bits.
    pub(crate) const COMMAND: usize = 0x04;
    /// Status register, 16 bits.
    pub(crate) const STATUS: usize = 0x06;
    /// Capabilities pointer, 8 bits (low two bits reserved).
    pub(crate) const CAPABILITIES: usize = 0x34;
}

/// Command register bits (PCI 3.0 §6.2.2).
pub(crate) mod command {
    /// Memory space: the device answers memory accesses to its BARs.
    pub(crate) const MEMORY: u16 = 1 << 1;
    /// Bus master: the device may issue DMA.
    pub(crate) const BUS_MASTER: u16 = 1 << 2;
    /// Interrupt disable: no legacy INTx (this driver polls, or uses MSI-X).
    pub(crate) const INTX_DISABLE: u16 = 1 << 10;
}

/// Status register bit: a capability list exists (PCI 3.0 §6.2.3).
const STATUS_CAP_LIST: u16 = 1 << 4;

/// Capability ID of a vendor-specific capability (PCI Code and ID Assignment §2), which virtio uses.
const CAP_ID_VENDOR: u8 = 0x09;

/// The virtio vendor capability (`struct virtio_pci_cap`, virtio spec §4.1.4). Multi-byte fields
/// are little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VirtioPciCap {
    /// Generic PCI field: PCI_CAP_ID_VNDR (0x09).
    pub(crate) cap_vndr: u8,
    /// Generic PCI field: next capability pointer.
    pub(crate) cap_next: u8,
    /// Generic PCI field: capability length.
    pub(crate) cap_len: u8,
    /// Which structure this is ([`CfgType`]).
    pub(crate) cfg_type: u8,
    /// The BAR holding it (0..=5).
    pub(crate) bar: u8,
    /// Multiple capabilities of one type are told apart by this.
    pub(crate) id: u8,
    /// Padding.
    pub(crate) padding: [u8; 2],
    /// Offset of the structure within the BAR.
    pub(crate) offset: u32,
    /// Length of the structure in bytes.
    pub(crate) length: u32,
}

/// `struct virtio_pci_notify_cap` (virtio spec §4.1.4.4): the notification capability adds the
/// multiplier of the queues' `queue_notify_off`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VirtioPciNotifyCap {
    /// The common part.
    pub(crate) cap: VirtioPciCap,
    /// Multiplier for `queue_notify_off` (bytes).
    pub(crate) notify_off_multiplier: u32,
}

/// `cfg_type` values (virtio spec §4.1.4).
pub(crate) mod cfg_type {
    /// Common configuration.
    pub(crate) const COMMON: u8 = 1;
    /// Notifications.
    pub(crate) const NOTIFY: u8 = 2;
    /// ISR status.
    pub(crate) const ISR: u8 = 3;
    /// Device-specific configuration.
    pub(crate) const DEVICE: u8 = 4;
}

/// Where a register structure lives: BAR index, offset and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// BAR index (0..=5).
    pub(crate) bar: u8,
    /// Offset in the BAR, bytes.
    pub(crate) offset: u32,
    /// Length, bytes.
    pub(crate) length: u32,
}

/// The virtio register structures of a device (the first capability of each type, as the spec
/// tells drivers to use: §4.1.4.1 "the driver SHOULD use the first instance").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VirtioCaps {
    /// Common configuration (required).
    pub(crate) common: Window,
    /// Notification area (required) and its `notify_off_multiplier`.
    pub(crate) notify: Window,
    /// Bytes between the notification addresses of queues whose `queue_notify_off` differ by one.
    pub(crate) notify_off_multiplier: u32,
    /// ISR status (required by the spec; unused while polling).
    pub(crate) isr: Window,
    /// Device-specific configuration (MAC, status, MTU for virtio-net).
    pub(crate) device: Option<Window>,
}

/// The header fields of a configuration space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) vendor_id: u16,
    pub(crate) device_id: u16,
    pub(crate) command: u16,
    pub(crate) status: u16,
}

fn le16(config: &[u8; CONFIG_LEN], at: usize) -> u16 {
    u16::from_le_bytes([config[at], config[at + 1]])
}

fn le32(config: &[u8; CONFIG_LEN], at: usize) -> u32 {
    u32::from_le_bytes([config[at], config[at + 1], config[at + 2], config[at + 3]])
}

/// The header of a configuration space.
pub(crate) fn header(config: &[u8; CONFIG_LEN]) -> Header {
    Header {
        vendor_id: le16(config, offset::VENDOR_ID),
        device_id: le16(config, offset::DEVICE_ID),
        command: le16(config, offset::COMMAND),
        status: le16(config, offset::STATUS),
    }
}

/// Walks the capability list and collects the virtio structures.
///
/// # Errors
/// A description of what is wrong: no capability list, a pointer into the header or past the
/// end, a loop (more than 48 capabilities: 256 bytes hold at most 48 of 4+ bytes after the 64-byte
/// header), a virtio capability shorter than its structure, a BAR index above 5, or a required
/// structure (common, notify, ISR) missing.
pub(crate) fn virtio_caps(config: &[u8; CONFIG_LEN]) -> Result<VirtioCaps, String> {
    if le16(config, offset::STATUS) & STATUS_CAP_LIST == 0 {
        return Err("the device has no PCI capability list".into());
    }
    let mut common = None;
    let mut notify = None;
    let mut isr = None;
    let mut device = None;
    let mut at = usize::from(config[offset::CAPABILITIES] & !3);
    let mut seen = 0;
    while at != 0 {
        seen += 1;
        if seen > 48 {
            return Err("the capability list loops".into());
        }
        if !(0x40..=CONFIG_LEN - 2).contains(&at) {
            return Err(format!("capability pointer {at:#x} is outside 0x40..0xff"));
        }
        let id = config[at];
        let next = usize::from(config[at + 1] & !3);
        if id == CAP_ID_VENDOR {
            let cap = read_cap(config, at)?;
            if cap.cfg_type <= cfg_type::DEVICE && cap.bar > 5 {
                return Err(format!(
                    "virtio capability of type {} at {at:#x} names BAR {} (0..=5 exist)",
                    cap.cfg_type, cap.bar
                ));
            }
            let window = Window {
                bar: cap.bar,
                offset: cap.offset,
                length: cap.length,
            };
            match cap.cfg_type {
                cfg_type::COMMON if common.is_none() => common = Some(window),
                cfg_type::NOTIFY if notify.is_none() => {
                    if usize::from(cap.cap_len) < size_of::<VirtioPciNotifyCap>()
                        || at + size_of::<VirtioPciNotifyCap>() > CONFIG_LEN
                    {
                        return Err(format!(
                            "notification capability at {at:#x} is {} bytes, needs {}",
                            cap.cap_len,
                            size_of::<VirtioPciNotifyCap>()
                        ));
                    }
                    let mult = le32(
                        config,
                        at + offset_of!(VirtioPciNotifyCap, notify_off_multiplier),
                    );
                    notify = Some((window, mult));
                }
                cfg_type::ISR if isr.is_none() => isr = Some(window),
                cfg_type::DEVICE if device.is_none() => device = Some(window),
                _ => {}
            }
        }
        at = next;
    }
    let missing = |what: &str| format!("no {what} capability (not a modern virtio 1.x device?)");
    let (notify, notify_off_multiplier) = notify.ok_or_else(|| missing("notification"))?;
    Ok(VirtioCaps {
        common: common.ok_or_else(|| missing("common configuration"))?,
        notify,
        notify_off_multiplier,
        isr: isr.ok_or_else(|| missing("ISR status"))?,
        device,
    })
}

fn read_cap(config: &[u8; CONFIG_LEN], at: usize) -> Result<VirtioPciCap, String> {
    if at + size_of::<VirtioPciCap>() > CONFIG_LEN {
        return Err(format!(
            "virtio capability at {at:#x} runs past the configuration space"
        ));
    }
    let cap = VirtioPciCap {
        cap_vndr: config[at],
        cap_next: config[at + offset_of!(VirtioPciCap, cap_next)],
        cap_len: config[at + offset_of!(VirtioPciCap, cap_len)],
        cfg_type: config[at + offset_of!(VirtioPciCap, cfg_type)],
        bar: config[at + offset_of!(VirtioPciCap, bar)],
        id: config[at + offset_of!(VirtioPciCap, id)],
        padding: [0; 2],
        offset: le32(config, at + offset_of!(VirtioPciCap, offset)),
        length: le32(config, at + offset_of!(VirtioPciCap, length)),
    };
    if usize::from(cap.cap_len) < size_of::<VirtioPciCap>() {
        return Err(format!(
            "virtio capability at {at:#x} is {} bytes, needs {}",
            cap.cap_len,
            size_of::<VirtioPciCap>()
        ));
    }
    Ok(cap)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn cap_layouts_match_the_spec() {
        assert_eq!(size_of::<VirtioPciCap>(), 16);
        assert_eq!(offset_of!(VirtioPciCap, cfg_type), 3);
        assert_eq!(offset_of!(VirtioPciCap, bar), 4);
        assert_eq!(offset_of!(VirtioPciCap, id), 5);
        assert_eq!(offset_of!(VirtioPciCap, offset), 8);
        assert_eq!(offset_of!(VirtioPciCap, length), 12);
        assert_eq!(size_of::<VirtioPciNotifyCap>(), 20);
        assert_eq!(offset_of!(VirtioPciNotifyCap, notify_off_multiplier), 16);
    }

    /// A configuration space of QEMU's virtio-net-pci (disable-legacy=on): common at BAR4+0,
    /// ISR at +0x1000, device at +0x2000, notify at +0x3000 (multiplier 4), plus an MSI-X
    /// capability (ID 0x11) first in the list.
    pub(crate) fn qemu_like_config() -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..2].copy_from_slice(&0x1af4u16.to_le_bytes());
        c[2..4].copy_from_slice(&0x1041u16.to_le_bytes());
        c[6..8].copy_from_slice(&STATUS_CAP_LIST.to_le_bytes());
        c[offset::CAPABILITIES] = 0x98;
        // MSI-X at 0x98 -> 0x84
        c[0x98] = 0x11;
        c[0x99] = 0x84;
        let mut put = |at: usize, next: u8, len: u8, ty: u8, off: u32, length: u32| {
            c[at] = CAP_ID_VENDOR;
            c[at + 1] = next;
            c[at + 2] = len;
            c[at + 3] = ty;
            c[at + 4] = 4;
            c[at + 8..at + 12].copy_from_slice(&off.to_le_bytes());
            c[at + 12..at + 16].copy_from_slice(&length.to_le_bytes());
        };
        put(0x84, 0x70, 16, cfg_type::COMMON, 0, 0x1000);
        put(0x70, 0x60, 16, cfg_type::ISR, 0x1000, 0x1000);
        put(0x60, 0x4c, 16, cfg_type::DEVICE, 0x2000, 0x1000);
        put(0x4c, 0x00, 20, cfg_type::NOTIFY, 0x3000, 0x1000);
        c[0x4c + 16..0x4c + 20].copy_from_slice(&4u32.to_le_bytes());
        c
    }

    #[test]
    fn parses_qemu_layout() {
        let c = qemu_like_config();
        let h = header(&c);
        assert_eq!((h.vendor_id, h.device_id), (0x1af4, 0x1041));
        let caps = virtio_caps(&c).unwrap();
        assert_eq!(
            caps.common,
            Window {
                bar: 4,
                offset: 0,
                length: 0x1000
            }
        );
        assert_eq!(caps.notify.offset, 0x3000);
        assert_eq!(caps.notify_off_multiplier, 4);
        assert_eq!(caps.isr.offset, 0x1000);
        assert_eq!(caps.device.unwrap().offset, 0x2000);
    }

    #[test]
    fn refuses_loops_bad_pointers_and_missing_structures() {
        let mut c = qemu_like_config();
        c[0x4c + 1] = 0x84; // notify -> common: a loop
        assert!(virtio_caps(&c).unwrap_err().contains("loops"));

        let mut c = qemu_like_config();
        c[offset::CAPABILITIES] = 0x10; // into the header
        assert!(virtio_caps(&c).unwrap_err().contains("outside"));

        let mut c = qemu_like_config();
        c[0x4c + 2] = 16; // notify capability too short for its multiplier
        assert!(virtio_caps(&c).unwrap_err().contains("notification"));

        let mut c = qemu_like_config();
        c[0x60 + 1] = 0x00; // list ends before notify
        assert!(virtio_caps(&c).unwrap_err().contains("no notification"));

        let mut c = qemu_like_config();
        c[0x84 + 4] = 7; // BAR 7
        assert!(virtio_caps(&c).unwrap_err().contains("BAR 7"));

        let mut c = qemu_like_config();
        c[6] = 0; // no capability list
        assert!(virtio_caps(&c)
            .unwrap_err()
            .contains("no PCI capability list"));
    }

    #[test]
    fn never_panics_on_any_bytes() {
        // A cheap sweep: every capability pointer value over random-ish contents.
        let mut c = [0u8; CONFIG_LEN];
        for (i, b) in c.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        c[6] = 0x10;
        for p in 0..=255u8 {
            c[offset::CAPABILITIES] = p;
            let _ = virtio_caps(&c);
        }
    }
}
