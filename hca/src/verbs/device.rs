//! The HCA and its port: queryable attributes, the GID and P_Key tables, path MTUs.
//!
//! `ibv_query_device(3)` reports what an HCA can do ([`DeviceAttr`]): how many QPs, CQs, MRs ... it
//! supports, how deep its queues may be, how many scatter/gather entries a WR may carry.
//! `ibv_query_port(3)` reports the state of one port ([`PortAttr`]): whether the link is up, its
//! MTUs, the sizes of its GID and P_Key tables. The software HCA has one port, numbered 1 (verbs
//! number ports from 1), with an Ethernet link layer; its defaults mirror Linux rxe
//! (`drivers/infiniband/sw/rxe/rxe_param.h`, Linux 6.x), so that programs tuned for rxe see the
//! same limits.

use crate::verbs::error::{Cause, Object};
use crate::verbs::gid::{eui64_from_mac, Gid, GidEntry, GidTable, GidType};
use alloc::vec;
use alloc::vec::Vec;

/// Atomic operation support (`enum ibv_atomic_cap`, ibv_query_device(3)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AtomicCap {
    /// No atomic operations (`IBV_ATOMIC_NONE`).
    None = 0,
    /// Atomics are atomic among QPs of this HCA only (`IBV_ATOMIC_HCA`); rxe's level.
    Hca = 1,
    /// Atomics are atomic with respect to the CPU and other HCAs too (`IBV_ATOMIC_GLOB`).
    Glob = 2,
}

/// Device attributes, the fields of `struct ibv_device_attr` a RoCE HCA fills in
/// (ibv_query_device(3)). Counts are objects; sizes are bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version, as a number (rxe: 0).
    pub fw_ver: u64,
    /// Node GUID, host order (rxe: the EUI-64 of the interface MAC).
    pub node_guid: u64,
    /// System image GUID, host order (rxe: same as the node GUID).
    pub sys_image_guid: u64,
    /// Largest MR, in bytes (rxe: `u64::MAX`).
    pub max_mr_size: u64,
    /// Supported page sizes, a bit per power of two (rxe: `0xfffff000`, 4 KiB and up).
    pub page_size_cap: u64,
    /// IEEE OUI of the vendor (rxe: 0).
    pub vendor_id: u32,
    /// Vendor part id (rxe: 0).
    pub vendor_part_id: u32,
    /// Hardware version (rxe: 0).
    pub hw_ver: u32,
    /// Most QPs (rxe: 2^20 - 16; QPNs are random 24-bit values from 16 up).
    pub max_qp: u32,
    /// Most outstanding WRs per send or receive queue (rxe: 2^20).
    pub max_qp_wr: u32,
    /// Most SGEs per send or receive WR (rxe: 32).
    pub max_sge: u32,
    /// Most SGEs per RDMA READ WR (rxe: 32).
    pub max_sge_rd: u32,
    /// Most CQs (rxe: 2^20).
    pub max_cq: u32,
    /// Most CQEs per CQ (rxe: 2^15 - 1).
    pub max_cqe: u32,
    /// Most MRs (rxe: 2^19 - 1).
    pub max_mr: u32,
    /// Most PDs (rxe: 2^20).
    pub max_pd: u32,
    /// Most outstanding RDMA READ / atomic requests a QP may accept as responder
    /// (`max_dest_rd_atomic` limit; rxe: 128).
    pub max_qp_rd_atom: u32,
    /// Most RDMA READ / atomic responder resources of the whole device (rxe: 0x3f000).
    pub max_res_rd_atom: u32,
    /// Most outstanding RDMA READ / atomic requests a QP may issue as requester
    /// (`max_rd_atomic` limit; rxe: 128).
    pub max_qp_init_rd_atom: u32,
    /// Atomic operation support (rxe: [`AtomicCap::Hca`]).
    pub atomic_cap: AtomicCap,
    /// Most address handles (rxe: 2^15 - 1).
    pub max_ah: u32,
    /// Most SRQs (rxe: 2^20 - 0x20001).
    pub max_srq: u32,
    /// Most outstanding WRs per SRQ (rxe: 2^20).
    pub max_srq_wr: u32,
    /// Most SGEs per SRQ WR (rxe: 27).
    pub max_srq_sge: u32,
    /// Most bytes of inline data per send WR (rxe: 32 SGEs x 16 bytes = 512).
    pub max_inline_data: u32,
    /// P_Key table length (rxe: 64).
    pub max_pkeys: u16,
    /// Local CA ACK delay, the `timeout`-style exponent (4.096 us x 2^n) of the HCA's own ACK
    /// turnaround (IBTA vol. 1 ch. 9 transport timers; rxe: 15).
    pub local_ca_ack_delay: u8,
    /// Number of ports (rxe: 1).
    pub phys_port_cnt: u8,
}

/// `DEFAULT_MAX_VALUE` of rxe_param.h.
const RXE_DEFAULT_MAX: u32 = 1 << 20;

impl Default for DeviceAttr {
    /// The rxe defaults (rxe_param.h, `enum rxe_device_param`), with zero GUIDs.
    fn default() -> Self {
        DeviceAttr {
            fw_ver: 0,
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: RXE_DEFAULT_MAX - crate::verbs::qp::MIN_QPN,
            max_qp_wr: RXE_DEFAULT_MAX,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: RXE_DEFAULT_MAX,
            max_cqe: (1 << 15) - 1,
            max_mr: (RXE_DEFAULT_MAX >> 1) - 1,
            max_pd: RXE_DEFAULT_MAX,
            max_qp_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            max_qp_init_rd_atom: 128,
            atomic_cap: AtomicCap::Hca,
            max_ah: (1 << 15) - 1,
            max_srq: RXE_DEFAULT_MAX - 0x0002_0001,
            max_srq_wr: RXE_DEFAULT_MAX,
            max_srq_sge: 27,
            max_inline_data: 32 * 16,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
        }
    }
}

/// Path MTU: the largest payload of one IB transport packet (`enum ibv_mtu`; IBTA vol. 1
/// §14.2.5.6): the wire crate's type, re-exported under the verbs name.
pub use roce::PathMtu;

/// Logical port state (`enum ibv_port_state`, IBTA vol. 1 ch. 14 PortInfo.PortState).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PortState {
    /// No state change (`IBV_PORT_NOP`).
    Nop = 0,
    /// The link is down (`IBV_PORT_DOWN`).
    Down = 1,
    /// Link up, not configured (`IBV_PORT_INIT`).
    Init = 2,
    /// Configured, not yet forwarding (`IBV_PORT_ARMED`).
    Armed = 3,
    /// Up and passing traffic (`IBV_PORT_ACTIVE`).
    Active = 4,
    /// Waiting to become active (`IBV_PORT_ACTIVE_DEFER`).
    ActiveDefer = 5,
}

/// The link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LinkLayer {
    /// Not reported (`IBV_LINK_LAYER_UNSPECIFIED`).
    Unspecified = 0,
    /// Native InfiniBand (`IBV_LINK_LAYER_INFINIBAND`).
    InfiniBand = 1,
    /// Ethernet, i.e. RoCE (`IBV_LINK_LAYER_ETHERNET`).
    Ethernet = 2,
}

/// Port attributes, the fields of `struct ibv_port_attr` a RoCE port fills in
/// (ibv_query_port(3)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest path MTU the port supports (rxe: 4096).
    pub max_mtu: PathMtu,
    /// Path MTU of the link as configured (rxe: from the interface MTU, 1024 for 1500; UD QPs use
    /// it as their path MTU).
    pub active_mtu: PathMtu,
    /// GID table length (rxe: 1024).
    pub gid_tbl_len: u32,
    /// Largest message, in bytes (rxe: 2^31).
    pub max_msg_sz: u64,
    /// P_Key violation counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length (rxe: 64).
    pub pkey_tbl_len: u16,
    /// Base LID: always 0 on RoCE (no subnet manager).
    pub lid: u16,
    /// LID of the subnet manager: 0 on RoCE.
    pub sm_lid: u16,
    /// LID mask control: 0 on RoCE.
    pub lmc: u8,
    /// Virtual lanes supported (rxe: 1).
    pub max_vl_num: u8,
    /// Physical port state, IBTA PortPhysicalState (5 = LinkUp, 3 = Disabled, 2 = Polling).
    pub phys_state: u8,
    /// The link layer: Ethernet.
    pub link_layer: LinkLayer,
}

/// Physical state "LinkUp" (IBTA PortInfo.PortPhysicalState).
pub const PHYS_STATE_LINK_UP: u8 = 5;

impl Default for PortAttr {
    /// An active rxe port on a 1500-byte Ethernet link (rxe_param.h `enum rxe_port_param`).
    fn default() -> Self {
        PortAttr {
            state: PortState::Active,
            max_mtu: PathMtu::Mtu4096,
            active_mtu: PathMtu::Mtu1024,
            gid_tbl_len: 1024,
            max_msg_sz: 1 << 31,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 64,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            phys_state: PHYS_STATE_LINK_UP,
            link_layer: LinkLayer::Ethernet,
        }
    }
}

/// The default partition key, full membership (IBTA vol. 1 ch. 10, partitions): the only P_Key RoCE
/// uses.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A port's P_Key table: `len` entries, 0 meaning "unused". rxe fills only index 0 with
/// [`DEFAULT_PKEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkeyTable {
    entries: Vec<u16>,
}

impl PkeyTable {
    /// A table of `len` entries with [`DEFAULT_PKEY`] at index 0 (if `len > 0`).
    pub fn new(len: u16) -> Self {
        let mut entries = vec![0; len as usize];
        if let Some(first) = entries.first_mut() {
            *first = DEFAULT_PKEY;
        }
        PkeyTable { entries }
    }

    /// The number of entries.
    pub fn len(&self) -> u16 {
        self.entries.len() as u16
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The P_Key at `index`; `None` if out of range or unused (ibv_query_pkey(3)).
    pub fn get(&self, index: u16) -> Option<u16> {
        self.entries
            .get(index as usize)
            .copied()
            .filter(|&p| p != 0)
    }

    /// Sets the entry at `index` (0 clears it).
    ///
    /// # Errors
    /// [`Cause::OutOfRange`] if `index` is past the end.
    pub fn set(&mut self, index: u16, pkey: u16) -> Result<(), Cause> {
        let len = self.len();
        let e = self
            .entries
            .get_mut(index as usize)
            .ok_or(Cause::OutOfRange {
                attr: "pkey_index",
                value: index.into(),
                max: u64::from(len.saturating_sub(1)),
            })?;
        *e = pkey;
        Ok(())
    }
}

/// One HCA port: its attributes and its GID and P_Key tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// ibv_query_port(3) attributes.
    pub attr: PortAttr,
    /// The GID table (`attr.gid_tbl_len` entries).
    pub gids: GidTable,
    /// The P_Key table (`attr.pkey_tbl_len` entries).
    pub pkeys: PkeyTable,
}

impl Port {
    /// A port with the given attributes, an empty GID table and the default P_Key table.
    pub fn new(attr: PortAttr) -> Self {
        Port {
            gids: GidTable::new(attr.gid_tbl_len),
            pkeys: PkeyTable::new(attr.pkey_tbl_len),
            attr,
        }
    }
}

/// A software HCA: its attributes and its single port (port number 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// ibv_query_device(3) attributes.
    pub attr: DeviceAttr,
    /// Port 1.
    pub port: Port,
}

impl Device {
    /// A device with the given attributes and port 1.
    pub fn new(attr: DeviceAttr, port: PortAttr) -> Self {
        Device {
            attr,
            port: Port::new(port),
        }
    }

    /// A soft-RoCE device on an Ethernet interface, as rxe sets one up: rxe default limits, node
    /// and system image GUID from the MAC's EUI-64, port 1 active with the path MTU derived from
    /// `eth_mtu` (bytes; below 336 gives 256), and the link-local GID `fe80::<EUI-64>` at index 0
    /// (RoCEv1) and 1 (RoCEv2). Add IP-derived GIDs with [`GidTable::add`].
    pub fn soft_roce(mac: [u8; 6], eth_mtu: u32) -> Self {
        let guid = u64::from_be_bytes(eui64_from_mac(mac));
        let attr = DeviceAttr {
            node_guid: guid,
            sys_image_guid: guid,
            ..DeviceAttr::default()
        };
        let port = PortAttr {
            active_mtu: PathMtu::from_link_mtu(eth_mtu as usize).unwrap_or(PathMtu::Mtu256),
            ..PortAttr::default()
        };
        let mut dev = Device::new(attr, port);
        let gid = Gid::link_local_from_mac(mac);
        for gid_type in [GidType::RoceV1, GidType::RoceV2] {
            // A fresh table of 1024 entries cannot be full; a zero GID cannot come from a MAC.
            let _ = dev.port.gids.add(GidEntry { gid, gid_type });
        }
        dev
    }

    /// The port numbered `port_num` (1-based); `None` for any other number.
    pub fn port(&self, port_num: u8) -> Option<&Port> {
        (port_num == 1).then_some(&self.port)
    }

    /// Mutable form of [`Self::port`].
    pub fn port_mut(&mut self, port_num: u8) -> Option<&mut Port> {
        (port_num == 1).then_some(&mut self.port)
    }

    /// Checks a port number.
    ///
    /// # Errors
    /// [`Cause::NoSuchObject`] unless `1 <= port_num <= phys_port_cnt`.
    pub fn check_port(&self, port_num: u8) -> Result<&Port, Cause> {
        self.port(port_num).ok_or(Cause::NoSuchObject {
            object: Object::Port,
            id: port_num.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_mirror_rxe_param_h() {
        let a = DeviceAttr::default();
        assert_eq!(a.max_sge, 32);
        assert_eq!(a.max_sge_rd, 32);
        assert_eq!(a.max_cqe, 32767);
        assert_eq!(a.max_qp_rd_atom, 128);
        assert_eq!(a.max_qp_init_rd_atom, 128);
        assert_eq!(a.max_srq_sge, 27);
        assert_eq!(a.max_inline_data, 512);
        assert_eq!(a.max_mr_size, u64::MAX);
        assert_eq!(a.atomic_cap, AtomicCap::Hca);
        assert_eq!(a.phys_port_cnt, 1);
        let p = PortAttr::default();
        assert_eq!(p.max_msg_sz, 1 << 31);
        assert_eq!(p.lid, 0);
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        assert_eq!(p.gid_tbl_len, 1024);
        assert_eq!(p.pkey_tbl_len, 64);
    }

    #[test]
    fn port_mtu_follows_the_link_like_rxe() {
        for (eth, mtu) in [
            (1500, PathMtu::Mtu1024),
            (9000, PathMtu::Mtu4096),
            (4096, PathMtu::Mtu2048),
            (100, PathMtu::Mtu256),
        ] {
            let d = Device::soft_roce([2, 0, 0, 0, 0, 1], eth);
            assert_eq!(d.port.attr.active_mtu, mtu, "eth mtu {eth}");
        }
        assert_eq!(PathMtu::Mtu1024.code(), 3);
        assert!(PathMtu::Mtu256 < PathMtu::Mtu4096);
    }

    #[test]
    fn soft_roce_device() {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let d = Device::soft_roce(mac, 1500);
        assert_eq!(d.attr.node_guid, 0x5054_00ff_fe12_3456);
        assert_eq!(d.attr.sys_image_guid, d.attr.node_guid);
        assert_eq!(d.port.attr.active_mtu, PathMtu::Mtu1024);
        assert_eq!(d.port.gids.get(0).unwrap().gid_type, GidType::RoceV1);
        assert_eq!(d.port.gids.get(1).unwrap().gid_type, GidType::RoceV2);
        assert_eq!(
            d.port.gids.get(0).unwrap().gid,
            Gid::link_local_from_mac(mac)
        );
        assert!(d.port(1).is_some());
        assert!(d.port(0).is_none());
        assert!(d.port(2).is_none());
        assert!(d.check_port(2).is_err());
    }

    #[test]
    fn pkey_table() {
        let mut t = PkeyTable::new(64);
        assert_eq!(t.get(0), Some(DEFAULT_PKEY));
        assert_eq!(t.get(1), None);
        assert_eq!(t.get(64), None);
        t.set(1, 0x8001).unwrap();
        assert_eq!(t.get(1), Some(0x8001));
        assert!(t.set(64, 1).is_err());
        assert_eq!(t.len(), 64);
    }
}
