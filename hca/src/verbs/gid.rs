//! GIDs and the per-port GID table.
//!
//! A GID (Global Identifier, IBTA vol. 1 ch. 4) is a 128-bit address with the layout of an IPv6
//! address. On RoCE the port's GIDs are derived from the addresses of the Ethernet interface
//! (IBTA Annex A17; the kernel's `roce_gid_mgmt`):
//! * the link-local GID `fe80::<EUI-64 of the MAC>`;
//! * one GID per IP address: the IPv6 address itself, or `::ffff:a.b.c.d` for an IPv4 address.
//!
//! Each address appears once per RoCE version: a **RoCEv1** entry (the GRH rides directly on
//! Ethernet, ethertype 0x8915) and a **RoCEv2** entry (the packet rides in UDP/IP, port 4791). An
//! address handle or a connected QP names its source address by `sgid_index`, an index into this
//! table, which so also picks the RoCE version and, for RoCEv2, IPv4 or IPv6.

use alloc::vec;
use alloc::vec::Vec;

use crate::verbs::error::{Cause, Object};

/// A 128-bit Global Identifier in network byte order (IBTA vol. 1 §4.1.1): the wire crate's type,
/// re-exported so that verbs and packets speak of the same GID.
pub use roce::Gid;

/// The modified EUI-64 of a MAC address (RFC 4291 appendix A), as rxe derives its node GUID.
pub const fn eui64_from_mac(mac: [u8; 6]) -> [u8; 8] {
    [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// The RoCE version of a GID table entry (`enum ibv_gid_type`, kernel `ib_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// RoCEv1: GRH directly over Ethernet (ethertype 0x8915), IBTA Annex A16.
    RoceV1,
    /// RoCEv2: BTH over UDP/IPv4 or UDP/IPv6 (destination port 4791), IBTA Annex A17.
    RoceV2,
    /// A native InfiniBand port's GID (`IBV_GID_TYPE_IB`): reported by the libibverbs backend
    /// on an InfiniBand HCA; a RoCE port never has one.
    Ib,
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// The address.
    pub gid: Gid,
    /// The RoCE version packets sent from this entry use.
    pub gid_type: GidType,
}

/// A port's GID table: `len` entries, each empty or holding a [`GidEntry`].
///
/// The link layer fills it from its interface addresses (as the kernel's GID cache does for rxe);
/// verbs read it through `sgid_index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidTable {
    entries: Vec<Option<GidEntry>>,
}

impl GidTable {
    /// An empty table of `len` entries (`ibv_port_attr.gid_tbl_len`).
    pub fn new(len: u32) -> Self {
        GidTable {
            entries: vec![None; len as usize],
        }
    }

    /// The number of entries (used or not).
    pub fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    /// Whether the table has no entries at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `index`, `None` if the index is out of range or the entry is empty.
    pub fn get(&self, index: u32) -> Option<&GidEntry> {
        self.entries.get(index as usize)?.as_ref()
    }

    /// The index of an entry equal to `entry`.
    pub fn find(&self, entry: &GidEntry) -> Option<u32> {
        self.entries
            .iter()
            .position(|e| e.as_ref() == Some(entry))
            .map(|i| i as u32)
    }

    /// Adds an entry in the first free slot and returns its index; an entry already present keeps
    /// its index.
    ///
    /// # Errors
    /// [`Cause::InvalidValue`] for the zero GID; [`Cause::TooManyObjects`] when the table is full.
    pub fn add(&mut self, entry: GidEntry) -> Result<u32, Cause> {
        if entry.gid.is_zero() {
            return Err(Cause::InvalidValue {
                attr: "gid",
                value: 0,
            });
        }
        if let Some(i) = self.find(&entry) {
            return Ok(i);
        }
        let free = self
            .entries
            .iter()
            .position(Option::is_none)
            .ok_or(Cause::TooManyObjects {
                object: Object::Gid,
                max: self.len(),
            })?;
        self.entries[free] = Some(entry);
        Ok(free as u32)
    }

    /// Clears the entry at `index`.
    ///
    /// # Errors
    /// [`Cause::NoSuchObject`] if the index is out of range or the entry is already empty.
    pub fn remove(&mut self, index: u32) -> Result<GidEntry, Cause> {
        self.entries
            .get_mut(index as usize)
            .and_then(Option::take)
            .ok_or(Cause::NoSuchObject {
                object: Object::Gid,
                id: index,
            })
    }

    /// The used entries with their indices.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &GidEntry)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    const MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30];

    #[test]
    fn link_local_gid_uses_modified_eui64() {
        let g = Gid::link_local_from_mac(MAC);
        assert_eq!(
            format!("{g}"),
            "fe80::5eff:fe10:2030",
            "U/L bit of 0x02 flips to 0x00"
        );
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g.interface_id(), 0x0000_5eff_fe10_2030);
        assert!(!g.is_ipv4_mapped());
        assert_eq!(
            eui64_from_mac(MAC),
            [0, 0, 0x5e, 0xff, 0xfe, 0x10, 0x20, 0x30]
        );
    }

    #[test]
    fn ipv4_mapped_gid() {
        let g = Gid::from(core::net::Ipv4Addr::new(192, 168, 1, 7));
        assert_eq!(format!("{g}"), "::ffff:192.168.1.7");
        assert!(g.is_ipv4_mapped());
    }

    #[test]
    fn table_add_find_remove() {
        let mut t = GidTable::new(2);
        let v1 = GidEntry {
            gid: Gid::link_local_from_mac(MAC),
            gid_type: GidType::RoceV1,
        };
        let v2 = GidEntry {
            gid_type: GidType::RoceV2,
            ..v1
        };
        assert_eq!(t.add(v1), Ok(0));
        assert_eq!(t.add(v2), Ok(1));
        assert_eq!(t.add(v1), Ok(0), "duplicates keep their index");
        let v4 = GidEntry {
            gid: Gid::from(core::net::Ipv4Addr::new(10, 0, 0, 1)),
            gid_type: GidType::RoceV2,
        };
        assert!(matches!(t.add(v4), Err(Cause::TooManyObjects { .. })));
        assert_eq!(t.remove(0), Ok(v1));
        assert!(t.remove(0).is_err());
        assert!(t.remove(7).is_err());
        assert_eq!(t.add(v4), Ok(0));
        assert_eq!(t.get(0), Some(&v4));
        assert_eq!(t.find(&v2), Some(1));
        assert_eq!(t.iter().count(), 2);
        assert!(t
            .add(GidEntry {
                gid: Gid::ZERO,
                ..v4
            })
            .is_err());
    }
}
