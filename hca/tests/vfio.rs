//! The VFIO link against the real kernel of the machine the tests run on: the refusals that need no
//! VFIO device (a bad address, a missing device, a device bound to another driver). Opening stops at
//! the first sysfs check that fails, so no device is touched. The driver logic is unit-tested against
//! a fake kernel and device (`src/link/vfio/tests.rs`); a real device is driven in a QEMU guest by
//! `tests/vfio_guest.rs` (ignored by default).
#![cfg(target_os = "linux")]

use std::path::Path;

use hca::link::vfio::{PciAddress, VfioError, VfioLink, VfioLinkConfig};

#[test]
fn a_malformed_address_is_refused() {
    for text in ["", "00:04", "0000:00:20.0", "00:04.8", "zz:04.0"] {
        match PciAddress::parse(text) {
            Err(e @ VfioError::BadAddress { .. }) => {
                assert!(e.to_string().contains("is not a PCI address"), "{e}")
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

#[test]
fn a_missing_device_is_named() {
    let addr = PciAddress::parse("ffff:ff:1f.7").unwrap();
    let e = VfioLink::open(&VfioLinkConfig::new(addr)).unwrap_err();
    assert!(matches!(e, VfioError::NoSuchDevice { .. }), "{e}");
    assert!(e.to_string().contains("ffff:ff:1f.7"), "{e}");
}

/// The first PCI function bound to a driver other than vfio-pci, if the machine has one.
fn device_bound_elsewhere() -> Option<(String, String)> {
    let mut entries: Vec<_> = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    entries.into_iter().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let driver = std::fs::read_link(e.path().join("driver")).ok()?;
        let driver = driver.file_name()?.to_string_lossy().into_owned();
        (driver != "vfio-pci").then_some((name, driver))
    })
}

#[test]
fn a_device_bound_to_another_driver_is_refused_with_the_fix() {
    let Some((name, driver)) = device_bound_elsewhere() else {
        eprintln!("skipped: no PCI device bound to a driver other than vfio-pci here");
        return;
    };
    let addr = PciAddress::parse(&name).unwrap();
    assert_eq!(addr.to_string(), name);
    let e = VfioLink::open(&VfioLinkConfig::new(addr)).unwrap_err();
    match &e {
        VfioError::NotBoundToVfio {
            device,
            driver: Some(d),
        } => {
            assert_eq!(device, &name);
            assert_eq!(d, &driver);
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains(&format!("bound to {driver}, not vfio-pci")),
        "{text}"
    );
    assert!(text.contains("driver_override"), "{text}");
    // Nothing was changed: the device is still bound to its driver.
    let still =
        std::fs::read_link(Path::new("/sys/bus/pci/devices").join(&name).join("driver")).unwrap();
    assert!(still.ends_with(&driver));
}
