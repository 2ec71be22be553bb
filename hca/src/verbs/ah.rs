//! Address handles and address vectors.
//!
//! An address vector says how to reach a peer port (`struct ibv_ah_attr`, IBTA vol. 1 ch. 10):
//! on RoCE, always through a global route (GRH): the destination GID, the index of the local
//! source GID (which fixes the RoCE version and IP family), the hop limit (IP TTL), the traffic
//! class (IP DSCP/ECN) and the flow label. A connected QP (RC, UC) carries one in its
//! attributes (IBV_QP_AV); a UD QP names one per send WR through an **address handle** (AH,
//! ibv_create_ah(3)), an address vector registered in a PD.

use crate::verbs::device::Device;
use crate::verbs::error::Cause;
use crate::verbs::gid::{Gid, GidEntry};
use crate::verbs::pd::PdHandle;
use crate::verbs::table::Handle;

/// Largest IPv6 flow label (20 bits).
pub const MAX_FLOW_LABEL: u32 = 0x000f_ffff;
/// Largest service level (4 bits).
pub const MAX_SL: u8 = 15;

/// An address vector (`struct ibv_ah_attr` with `is_global = 1` and its `ibv_global_route`;
/// RoCE always routes globally). LIDs and static rate do not apply to RoCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// Hop limit (IPv6 hop limit / IPv4 TTL).
    pub hop_limit: u8,
    /// Traffic class (IPv6 traffic class / IPv4 TOS byte: DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits); RoCEv2 also derives the UDP source port from it.
    pub flow_label: u32,
    /// Service level (4 bits; maps to the Ethernet priority).
    pub sl: u8,
    /// The local port (1-based).
    pub port_num: u8,
    /// Destination MAC, if already resolved; `None` lets the link layer resolve it from the DGID
    /// (ARP / neighbour discovery).
    pub dmac: Option<[u8; 6]>,
}

impl Default for AhAttr {
    /// Zero GID, source GID index 0, hop limit 64, port 1.
    fn default() -> Self {
        AhAttr {
            dgid: Gid::ZERO,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
            port_num: 1,
            dmac: None,
        }
    }
}

impl AhAttr {
    /// Checks the address vector against the device and returns the source GID entry (rxe
    /// `rxe_av_chk_attr`; kernel `rdma_fill_sgid_attr`).
    ///
    /// # Errors
    /// [`Cause::NoSuchObject`] for a bad port or an empty source GID entry;
    /// [`Cause::OutOfRange`] for `sgid_index`, `flow_label` or `sl`; [`Cause::InvalidValue`]
    /// for a zero DGID, or a non-IPv4 DGID with an IPv4 source GID (RoCEv2 over IPv4 cannot reach
    /// an IPv6 address).
    pub fn check(&self, device: &Device) -> Result<GidEntry, Cause> {
        let port = device.check_port(self.port_num)?;
        if u32::from(self.sgid_index) >= port.gids.len() {
            return Err(Cause::OutOfRange {
                attr: "ah_attr.grh.sgid_index",
                value: self.sgid_index.into(),
                max: u64::from(port.gids.len().saturating_sub(1)),
            });
        }
        let sgid = *port
            .gids
            .get(self.sgid_index.into())
            .ok_or(Cause::NoSuchObject {
                object: crate::verbs::error::Object::Gid,
                id: self.sgid_index.into(),
            })?;
        if self.flow_label > MAX_FLOW_LABEL {
            return Err(Cause::OutOfRange {
                attr: "ah_attr.grh.flow_label",
                value: self.flow_label.into(),
                max: MAX_FLOW_LABEL.into(),
            });
        }
        if self.sl > MAX_SL {
            return Err(Cause::OutOfRange {
                attr: "ah_attr.sl",
                value: self.sl.into(),
                max: MAX_SL.into(),
            });
        }
        if self.dgid.is_zero() {
            return Err(Cause::InvalidValue {
                attr: "ah_attr.grh.dgid",
                value: 0,
            });
        }
        if sgid.gid.is_ipv4_mapped() && !self.dgid.is_ipv4_mapped() {
            return Err(Cause::InvalidValue {
                attr: "ah_attr.grh.dgid",
                value: self.dgid.interface_id(),
            });
        }
        Ok(sgid)
    }
}

/// An address handle: a checked address vector in a PD, with its source GID entry resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressHandle {
    pd: PdHandle,
    attr: AhAttr,
    sgid: GidEntry,
}

impl AddressHandle {
    /// Checks `attr` and builds the handle (ibv_create_ah(3)).
    ///
    /// # Errors
    /// As [`AhAttr::check`].
    pub fn new(pd: PdHandle, attr: AhAttr, device: &Device) -> Result<Self, Cause> {
        let sgid = attr.check(device)?;
        Ok(AddressHandle { pd, attr, sgid })
    }

    /// The protection domain.
    pub fn pd(&self) -> PdHandle {
        self.pd
    }

    /// The address vector.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The source GID entry as it was when the AH was created (GID and RoCE version).
    pub fn sgid(&self) -> &GidEntry {
        &self.sgid
    }
}

/// Handle of an [`AddressHandle`] in a [`crate::Context`].
pub type AhHandle = Handle<AddressHandle>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::gid::GidType;

    fn device() -> Device {
        let mut d = Device::soft_roce([2, 0, 0, 0, 0, 1], 1500);
        d.port
            .gids
            .add(GidEntry {
                gid: Gid::from(core::net::Ipv4Addr::new(10, 0, 0, 1)),
                gid_type: GidType::RoceV2,
            })
            .unwrap();
        d
    }

    fn good() -> AhAttr {
        AhAttr {
            dgid: Gid::link_local_from_mac([2, 0, 0, 0, 0, 2]),
            sgid_index: 1,
            ..AhAttr::default()
        }
    }

    #[test]
    fn valid_vector_resolves_sgid() {
        let d = device();
        let e = good().check(&d).unwrap();
        assert_eq!(e.gid_type, GidType::RoceV2);
        let ah = AddressHandle::new(Handle::from_raw(1, 0), good(), &d).unwrap();
        assert_eq!(ah.sgid(), &e);
        assert_eq!(ah.attr().hop_limit, 64);
    }

    #[test]
    fn invalid_vectors() {
        let d = device();
        let check = |f: fn(&mut AhAttr)| {
            let mut a = good();
            f(&mut a);
            a.check(&d)
        };
        assert!(matches!(
            check(|a| a.port_num = 2),
            Err(Cause::NoSuchObject { .. })
        ));
        assert!(matches!(
            check(|a| a.sgid_index = 5),
            Err(Cause::NoSuchObject { .. })
        ));
        assert!(matches!(
            check(|a| a.flow_label = 1 << 20),
            Err(Cause::OutOfRange { .. })
        ));
        assert!(matches!(
            check(|a| a.sl = 16),
            Err(Cause::OutOfRange { .. })
        ));
        assert!(matches!(
            check(|a| a.dgid = Gid::ZERO),
            Err(Cause::InvalidValue { .. })
        ));
        // IPv4 source GID (index 2) needs an IPv4-mapped destination.
        assert!(matches!(
            check(|a| a.sgid_index = 2),
            Err(Cause::InvalidValue { .. })
        ));
        assert!(check(|a| {
            a.sgid_index = 2;
            a.dgid = Gid::from(core::net::Ipv4Addr::new(10, 0, 0, 2));
        })
        .is_ok());
        let mut small = device();
        small.port.gids = crate::verbs::gid::GidTable::new(2);
        let mut a = good();
        a.sgid_index = 2;
        assert!(matches!(a.check(&small), Err(Cause::OutOfRange { .. })));
    }
}
