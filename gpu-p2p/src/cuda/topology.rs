//! Which path connects two GPUs of this host: the same device, NVLink, or PCIe (and how far up the
//! PCIe tree), from NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`) where present,
//! else from sysfs (`/sys/bus/pci/devices/<bus id>`: the PCI path and the NUMA node).
//!
//! The levels follow `nvidia-smi topo -m`: `SELF`, `NV#` (NVLink, # links), `PIX` (one PCIe
//! switch), `PXB` (several switches), `PHB` (a host bridge), `NODE` (host bridges of one NUMA node),
//! `SYS` (across the SMP interconnect).

use core::fmt;
use std::path::{Path, PathBuf};

/// How two GPUs (by PCI bus id) are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The same device.
    SameDevice,
    /// NVLink (directly or through NVSwitch), with this many active links between the two.
    NvLink(u32),
    /// One PCIe switch (`PIX`).
    PcieSwitch,
    /// Several PCIe switches, no host bridge (`PXB`).
    PcieMultiSwitch,
    /// Through a PCIe host bridge (`PHB`).
    PcieHostBridge,
    /// Host bridges of one NUMA node (`NODE`).
    NumaNode,
    /// Across NUMA nodes (`SYS`).
    System,
    /// Not known (neither NVML nor sysfs said).
    Unknown,
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SameDevice => f.write_str("SELF"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::PcieSwitch => f.write_str("PIX"),
            Link::PcieMultiSwitch => f.write_str("PXB"),
            Link::PcieHostBridge => f.write_str("PHB"),
            Link::NumaNode => f.write_str("NODE"),
            Link::System => f.write_str("SYS"),
            Link::Unknown => f.write_str("?"),
        }
    }
}

/// Where the topology came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// NVML.
    Nvml,
    /// sysfs PCI paths.
    Sysfs,
}

/// The link matrix of a set of GPUs (in the order given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// PCI bus ids, one per GPU.
    pub bus_ids: Vec<String>,
    /// `links[i][j]`: how GPU i reaches GPU j.
    pub links: Vec<Vec<Link>>,
    /// What the matrix was read from.
    pub source: Source,
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "topology ({:?}):", self.source)?;
        for (i, row) in self.links.iter().enumerate() {
            write!(f, "\n  GPU{i} {}", self.bus_ids[i])?;
            for l in row {
                write!(f, " {l:>5}")?;
            }
        }
        Ok(())
    }
}

/// The topology of the GPUs with these PCI bus ids: NVML when it loads, else sysfs under `/sys`.
pub fn report(bus_ids: &[String]) -> Topology {
    nvml_report(bus_ids).unwrap_or_else(|| sysfs_report(Path::new("/sys"), bus_ids))
}

/// `NVML_NVLINK_MAX_LINKS` of `nvml.h` (18 links per GPU since Hopper).
const NVML_NVLINK_MAX_LINKS: u32 = 18;

fn nvml_report(bus_ids: &[String]) -> Option<Topology> {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let devices: Vec<_> = bus_ids
        .iter()
        .map(|id| nvml.device_by_pci_bus_id(id.as_str()).ok())
        .collect::<Option<_>>()?;
    let mut links = vec![vec![Link::Unknown; bus_ids.len()]; bus_ids.len()];
    for (i, a) in devices.iter().enumerate() {
        for j in 0..devices.len() {
            links[i][j] = if i == j || same_bus_id(&bus_ids[i], &bus_ids[j]) {
                Link::SameDevice
            } else {
                let nv = (0..NVML_NVLINK_MAX_LINKS)
                    .filter(|&l| {
                        let link = a.link_wrapper_for(l);
                        link.is_active().unwrap_or(false)
                            && link
                                .remote_pci_info()
                                .map(|p| same_bus_id(&p.bus_id, &bus_ids[j]))
                                .unwrap_or(false)
                    })
                    .count() as u32;
                if nv > 0 {
                    Link::NvLink(nv)
                } else {
                    match nvml
                        .device_by_pci_bus_id(bus_ids[j].as_str())
                        .and_then(|b| a.topology_common_ancestor(b))
                    {
                        Ok(TopologyLevel::Internal) => Link::SameDevice,
                        Ok(TopologyLevel::Single) => Link::PcieSwitch,
                        Ok(TopologyLevel::Multiple) => Link::PcieMultiSwitch,
                        Ok(TopologyLevel::HostBridge) => Link::PcieHostBridge,
                        Ok(TopologyLevel::Node) => Link::NumaNode,
                        Ok(TopologyLevel::System) => Link::System,
                        Err(_) => Link::Unknown,
                    }
                }
            };
        }
    }
    Some(Topology {
        bus_ids: bus_ids.to_vec(),
        links,
        source: Source::Nvml,
    })
}

/// Bus ids compare case-insensitively and without NVML's 8-digit domain padding
/// ("00000000:3B:00.0" is "0000:3b:00.0").
fn same_bus_id(a: &str, b: &str) -> bool {
    normalize_bus_id(a) == normalize_bus_id(b)
}

fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

/// The sysfs answer: the PCI path of each device (`/sys/bus/pci/devices/<id>` resolves to
/// `/sys/devices/pci0000:00/0000:00:01.0/.../<id>`) and its NUMA node. Devices under a common bridge
/// below the root complex: `PIX` when they share the parent bridge, `PXB` deeper; same root complex:
/// `PHB`; same NUMA node: `NODE`; else `SYS`. NVLink is not visible in sysfs.
pub fn sysfs_report(sys_root: &Path, bus_ids: &[String]) -> Topology {
    let paths: Vec<Option<Vec<String>>> = bus_ids
        .iter()
        .map(|id| pci_path(sys_root, &normalize_bus_id(id)))
        .collect();
    let numa: Vec<Option<i64>> = bus_ids
        .iter()
        .map(|id| {
            let p = sys_root
                .join("bus/pci/devices")
                .join(normalize_bus_id(id))
                .join("numa_node");
            std::fs::read_to_string(p).ok()?.trim().parse().ok()
        })
        .collect();
    let n = bus_ids.len();
    let mut links = vec![vec![Link::Unknown; n]; n];
    for i in 0..n {
        for j in 0..n {
            links[i][j] = if i == j || same_bus_id(&bus_ids[i], &bus_ids[j]) {
                Link::SameDevice
            } else {
                match (&paths[i], &paths[j]) {
                    (Some(a), Some(b)) => classify(a, b, numa[i], numa[j]),
                    _ => Link::Unknown,
                }
            };
        }
    }
    Topology {
        bus_ids: bus_ids.to_vec(),
        links,
        source: Source::Sysfs,
    }
}

/// The components of the resolved device path after `/sys/devices`: `["pci0000:00",
/// "0000:00:01.0", ..., "<id>"]`.
fn pci_path(sys_root: &Path, id: &str) -> Option<Vec<String>> {
    let link = sys_root.join("bus/pci/devices").join(id);
    let real: PathBuf = std::fs::canonicalize(link).ok()?;
    let devices = std::fs::canonicalize(sys_root.join("devices")).ok()?;
    let rel = real.strip_prefix(devices).ok()?;
    Some(
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
    )
}

fn classify(a: &[String], b: &[String], numa_a: Option<i64>, numa_b: Option<i64>) -> Link {
    if a.first() != b.first() {
        return match (numa_a, numa_b) {
            (Some(x), Some(y)) if x == y && x >= 0 => Link::NumaNode,
            _ => Link::System,
        };
    }
    // Common prefix below the root complex (index 0), excluding the devices themselves.
    let common = a
        .iter()
        .zip(b.iter())
        .take(a.len().min(b.len()).saturating_sub(1))
        .take_while(|(x, y)| x == y)
        .count();
    let bridges_in_common = common.saturating_sub(1);
    if bridges_in_common == 0 {
        Link::PcieHostBridge
    } else if common + 1 == a.len() && common + 1 == b.len() {
        Link::PcieSwitch
    } else {
        Link::PcieMultiSwitch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalize() {
        assert!(same_bus_id("00000000:3B:00.0", "0000:3b:00.0"));
        assert!(!same_bus_id("0000:3b:00.0", "0000:3c:00.0"));
    }

    fn fake_sysfs(devs: &[(&str, &str, i64)]) -> tempdir::Dir {
        let root = tempdir::Dir::new();
        for (id, path, numa) in devs {
            let real = root.path().join("devices").join(path);
            std::fs::create_dir_all(&real).unwrap();
            std::fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
            let bus = root.path().join("bus/pci/devices");
            std::fs::create_dir_all(&bus).unwrap();
            std::os::unix::fs::symlink(&real, bus.join(id)).unwrap();
        }
        root
    }

    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "gpu-p2p-topo-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn sysfs_levels_follow_the_pci_tree() {
        let root = fake_sysfs(&[
            (
                "0000:03:00.0",
                "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
                0,
            ),
            (
                "0000:04:00.0",
                "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:04:00.0",
                0,
            ),
            (
                "0000:06:00.0",
                "pci0000:00/0000:00:01.0/0000:01:00.0/0000:05:00.0/0000:06:00.0",
                0,
            ),
            ("0000:07:00.0", "pci0000:00/0000:00:02.0/0000:07:00.0", 0),
            ("0000:81:00.0", "pci0000:80/0000:80:01.0/0000:81:00.0", 0),
            ("0000:c1:00.0", "pci0000:c0/0000:c0:01.0/0000:c1:00.0", 1),
        ]);
        let ids: Vec<String> = [
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:06:00.0",
            "0000:07:00.0",
            "0000:81:00.0",
            "0000:c1:00.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let t = sysfs_report(root.path(), &ids);
        assert_eq!(t.links[0][0], Link::SameDevice);
        assert_eq!(t.links[0][1], Link::PcieSwitch);
        assert_eq!(t.links[0][2], Link::PcieMultiSwitch);
        assert_eq!(t.links[0][3], Link::PcieHostBridge);
        assert_eq!(t.links[0][4], Link::NumaNode);
        assert_eq!(t.links[0][5], Link::System);
        assert_eq!(t.links[5][0], Link::System);
        let unknown = sysfs_report(root.path(), &["0000:99:00.0".into(), ids[0].clone()]);
        assert_eq!(unknown.links[0][1], Link::Unknown);
        assert!(t.to_string().contains("PIX"));
    }
}
