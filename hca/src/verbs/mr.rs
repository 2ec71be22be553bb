//! Memory regions, access flags and the lkey / rkey checks.
//!
//! An RDMA device reads and writes application memory directly, so the memory must be
//! *registered* first (ibv_reg_mr(3), IBTA vol. 1 §10.6): a memory region (MR) is a range of I/O
//! virtual addresses (`iova .. iova + length`) in one protection domain, with access rights
//! ([`AccessFlags`]). Registration returns two keys:
//! * the **lkey**, which the local program puts in its scatter/gather entries (SGEs);
//! * the **rkey**, which it hands to a peer so that the peer's RDMA READ / WRITE / atomic requests
//!   (their RETH or AtomicETH) may touch the region.
//!
//! Both keys are 32 bits drawn from the context's [`RandomSource`] (the operating system's
//! random source in every device of this crate, see [`crate::verbs::random`]): nonzero, unlike the
//! key of any live region, and unlike the key the same table slot carried last, so a key kept
//! from an old registration stops working the moment the MR is deregistered, even once its slot
//! is reused. A lookup is O(1): the table finds the region's slot through a hash map keyed by the
//! key (module [`table`](crate::verbs::table)). As in rxe, the rkey equals the lkey when the MR
//! grants any remote access, and is 0 (which never resolves) otherwise.
//!
//! ## What an off-path attacker must guess
//!
//! Over RoCEv2 anyone who can send a UDP datagram to the device can send any packet; the ICRC is
//! a CRC, not a MAC, and nothing but numbers authorizes a packet. Say the attacker knows both IP
//! addresses (so the engine's source-address check, rxe `check_addr`, passes), the P_Key (0xffff
//! by default) and a region's address and length; it must still guess what this crate draws from
//! the OS random source:
//! * a **QPN** names one of `n` live QPs (of the packet's transport, in a state that takes it)
//!   with probability `n / (2^24 - 16)`: QPNs are uniform among the free values from 16 up
//!   (module [`qp`](crate::verbs::qp));
//! * a **PSN** is a given QP's expected PSN with probability 2^-24 (start PSNs are random in
//!   every tool and in `collectives`; see [`qp`](crate::verbs::qp) for why only that PSN acts);
//! * an **rkey** names one of `m` regions of the QP's PD with the needed remote access with
//!   probability `m / (2^32 - 1)`: keys are 32 random nonzero bits.
//!
//! Average forged packets per success (the reciprocal of the per-packet probability, rounded
//! to powers of 2; `n` and `m` as above, `n < 2^20` and `m < 2^19` at this device's limits):
//!
//! | forged packet | must guess | packets | below 2^40 when |
//! |---|---|---|---|
//! | RC WRITE, atomic or READ executed | QPN, PSN, rkey | `2^80 / (n m)` | never at the limits (`n m < 2^39`: at least 2^41) |
//! | RC SEND delivered, or any RC request at the expected PSN that breaks a rule (bad rkey, opcode sequence, length: a class C NAK moves the QP to ERR) | QPN, PSN | `2^48 / n` | `n > 2^8` RC QPs (2^28 at `n = 2^20`) |
//! | UC WRITE FIRST / ONLY executed | QPN, rkey | `2^56 / (n m)` | `n m > 2^16` (e.g. 256 UC QPs and 256 writable regions) |
//! | UC SEND FIRST / ONLY delivered (and any UC FIRST / ONLY drops the message in progress) | QPN | `2^24 / n` | always |
//! | UD SEND delivered | QPN, Q_Key | `2^24 / n` with a known Q_Key (`rdma-pingpong --ud` uses rdma-core's 0x11111111), `2^56 / n` with a random secret one | always with a known Q_Key; `n > 2^16` with a secret one |
//! | RC ACK, NAK or READ response accepted by a requester | QPN, a PSN among its `w` outstanding ones (`w + 1` for a PSN sequence error NAK) | `2^48 / W`, `W` the sum of `w + 1` over the busy RC QPs | `W > 2^8`: two QPs with full windows of 128 (one QP: 2^41) |
//! | CNP | QPN | `2^24 / n` | always, but a CNP only reaches the rate-control hook, which does nothing yet (no DCQCN) |
//!
//! Why UC and UD are weaker: a UC responder starts a new message on any FIRST or ONLY whatever
//! its PSN (IBTA vol. 1 §9.8.4, rxe `check_psn`), so the PSN protects nothing; UD is
//! connectionless (§9.8.5): any node may send to a UD QP that knows its QPN and Q_Key, and the
//! application authenticates what it receives. A forged RC response's effects: a NAK fails the
//! WQE and moves the QP to ERR; an ACK completes WQEs whose packets may still be lost (then
//! never resent); a READ response places its payload in the READ's local buffer.
//!
//! So the issue-17 goal (at least 2^40 packets for any forged request executed or response
//! accepted) holds for RC RDMA WRITE / READ / atomic at any scale, for RC SEND with at most 256
//! RC QPs, and for forged responses with one busy QP; it does not hold for UC and UD at all,
//! nor for RC SENDs and responses with more QPs. The BTH offers no more secret bits (QPN, PSN,
//! rkey and Q_Key are all of them), so closing the rest needs something outside it: link or
//! network authentication (IPsec ESP or MACsec between the hosts), keeping UDP port 4791 off
//! untrusted networks (a dedicated VLAN or fabric, a firewall that admits only the peers), or
//! (not done) pinning each connection's UDP source port as learned from its first valid packet
//! (up to 16 more bits, where the peer keeps a stable source port per QP, as rxe and this crate
//! do). Before keys and QPNs were random, the first MR of every process had rkey 0x179 and QPNs
//! counted from 16, and one sweep of 2^24 PSNs sufficed for an RC WRITE.
//!
//! This module records addresses and lengths only; the memory behind an MR (host pages, GPU
//! memory) is attached by the layer that moves data.
//! This module records addresses and lengths only; the memory behind an MR (host pages, GPU
//! memory) is attached by the layer that moves data.

use crate::verbs::error::{Cause, KeyError, KeyErrorKind, Object};
use crate::verbs::pd::PdHandle;
use crate::verbs::random::RandomSource;
use crate::verbs::table::KeyedTable;

pub use super::attr::AccessFlags;

impl AccessFlags {
    /// Checks the flags of ibv_reg_mr(3).
    ///
    /// # Errors
    /// [`Cause::AccessFlags`] for unknown bits, or REMOTE_WRITE / REMOTE_ATOMIC without
    /// LOCAL_WRITE.
    pub fn check_mr(self) -> Result<(), Cause> {
        let unknown = self.bits() & !AccessFlags::all().bits() != 0;
        let needs_local_write =
            self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
        if unknown || (needs_local_write && !self.contains(AccessFlags::LOCAL_WRITE)) {
            return Err(Cause::AccessFlags { flags: self.bits() });
        }
        Ok(())
    }
}

/// A registered memory region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRegion {
    pd: PdHandle,
    addr: u64,
    iova: u64,
    length: u64,
    access: AccessFlags,
    lkey: u32,
    rkey: u32,
    invalidated: bool,
    /// The MR table slot (what the engine indexes the memory behind the region by).
    slot: u32,
}

impl MemoryRegion {
    /// An MR that a hardware backend registered (its keys come from the HCA).
    #[cfg(feature = "std")]
    pub(crate) fn from_hca(
        pd: PdHandle,
        addr: u64,
        iova: u64,
        length: u64,
        access: AccessFlags,
        keys: (u32, u32),
    ) -> MemoryRegion {
        MemoryRegion {
            pd,
            addr,
            iova,
            length,
            access,
            lkey: keys.0,
            rkey: keys.1,
            invalidated: false,
            slot: 0,
        }
    }

    /// The protection domain.
    pub fn pd(&self) -> PdHandle {
        self.pd
    }

    /// Where the memory lives in the registering process (the `addr` of ibv_reg_mr(3)).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The I/O virtual address of the first byte: what SGEs and RETHs name (equal to `addr`
    /// unless registered with ibv_reg_mr_iova(3)).
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes (at least 1).
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key: equal to the lkey if the MR grants any remote access, 0 otherwise (rxe).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Whether the keys were invalidated (by a LOCAL_INV WR or a SEND with Invalidate, IBTA vol. 1
    /// §10.6.5): every key check then fails with [`KeyErrorKind::Invalidated`] until the region
    /// is deregistered. (Fast registration, which would make it valid again, is not offered.)
    pub fn is_invalidated(&self) -> bool {
        self.invalidated
    }

    /// Whether `[iova, iova + length)` lies inside the region. Never overflows: works for ranges
    /// ending at `u64::MAX` and rejects ranges that would wrap. A zero-length range is inside if
    /// `iova` is within `[start, end]` (as rxe `mr_check_range`).
    pub fn contains(&self, iova: u64, length: u64) -> bool {
        match iova.checked_sub(self.iova) {
            Some(offset) => offset <= self.length && length <= self.length - offset,
            None => false,
        }
    }

    /// The byte offset of `iova` from the start of the region, if `iova` is in `[start, end]`.
    pub fn offset_of(&self, iova: u64) -> Option<u64> {
        iova.checked_sub(self.iova).filter(|&o| o <= self.length)
    }

    /// The region's slot in its [`MrTable`] (unique among live regions, reused after
    /// deregistration; 0 for a region a hardware HCA registered).
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// Most regions one table holds (2^24 - 1): live keys then fill at most 2^-8 of the 32-bit key
/// space, so a new key almost always takes one draw.
pub const MAX_MR: u32 = 0x00ff_ffff;

/// The MR table of a device: registration, deregistration and O(1) key checks.
pub struct MrTable {
    table: KeyedTable<MemoryRegion>,
    max_mr_size: u64,
}

impl MrTable {
    /// An empty table holding up to `max_mr` regions (at most [`MAX_MR`]) of at most
    /// `max_mr_size` bytes each.
    pub fn new(max_mr: u32, max_mr_size: u64) -> Self {
        MrTable {
            table: KeyedTable::new(max_mr.min(MAX_MR), 1, u32::MAX),
            max_mr_size,
        }
    }

    /// Registered regions.
    pub fn len(&self) -> u32 {
        self.table.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// Registers `length` bytes at `addr`, addressed by peers and SGEs as `iova ..` (ibv_reg_mr(3)
    /// uses `iova == addr`; ibv_reg_mr_iova(3) sets it).
    ///
    /// # Errors
    /// [`Cause::AccessFlags`] (see [`AccessFlags::check_mr`]); [`Cause::InvalidValue`] for a zero
    /// length or a range that wraps past `u64::MAX`; [`Cause::OutOfRange`] above `max_mr_size`;
    /// [`Cause::TooManyObjects`] when `max_mr` regions exist.
    ///
    /// The key is 32 bits from `random`: nonzero, unlike the key of any registered region, and
    /// unlike the key this table slot carried last (see the [module docs](self)).
    pub fn register(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        iova: u64,
        access: AccessFlags,
        random: &mut dyn RandomSource,
    ) -> Result<&MemoryRegion, Cause> {
        access.check_mr()?;
        if length == 0 {
            return Err(Cause::InvalidValue {
                attr: "length",
                value: 0,
            });
        }
        if length > self.max_mr_size {
            return Err(Cause::OutOfRange {
                attr: "length",
                value: length,
                max: self.max_mr_size,
            });
        }
        if addr.checked_add(length).is_none() {
            return Err(Cause::InvalidValue {
                attr: "addr",
                value: addr,
            });
        }
        if iova.checked_add(length).is_none() {
            return Err(Cause::InvalidValue {
                attr: "iova",
                value: iova,
            });
        }
        let remote = access.intersects(AccessFlags::REMOTE);
        let too_many = Cause::TooManyObjects {
            object: Object::Mr,
            max: self.table.max(),
        };
        let made = self.table.insert(random, |key, slot| {
            Ok::<_, Cause>(MemoryRegion {
                pd,
                addr,
                iova,
                length,
                access,
                lkey: key,
                rkey: if remote { key } else { 0 },
                invalidated: false,
                slot,
            })
        })?;
        made.map(|(_, mr)| &*mr).ok_or(too_many)
    }

    /// Deregisters the region with this lkey: both keys stop resolving at once (ibv_dereg_mr(3)).
    ///
    /// # Errors
    /// [`Cause::NoSuchObject`] if the lkey names no registered region.
    pub fn deregister(&mut self, lkey: u32) -> Result<MemoryRegion, Cause> {
        let not_found = Cause::NoSuchObject {
            object: Object::Mr,
            id: lkey,
        };
        self.table.remove(lkey).ok_or(not_found)
    }

    /// The region whose lkey is `lkey`. O(1).
    pub fn lookup_lkey(&self, lkey: u32) -> Option<&MemoryRegion> {
        self.table.get(lkey)
    }

    /// The region whose rkey is `rkey` (a region without remote access has no rkey). O(1).
    pub fn lookup_rkey(&self, rkey: u32) -> Option<&MemoryRegion> {
        self.lookup_lkey(rkey).filter(|mr| mr.rkey == rkey)
    }

    /// Invalidates the keys of the region named by `key` (its lkey or rkey), on behalf of a QP of
    /// `pd`: a LOCAL_INV WR (IBTA vol. 1 §10.6.5) or a received SEND with Invalidate (§9.4.1.1,
    /// IETH). The region stays registered; its keys stop working at once. Invalidating an
    /// already invalid region succeeds and changes nothing. O(1).
    ///
    /// # Errors
    /// [`KeyErrorKind::UnknownKey`] if `key` names no region (or is the `0` rkey of a region
    /// without remote access); [`KeyErrorKind::WrongPd`] if the region belongs to another PD
    /// (IBTA vol. 1 §10.6.5: a QP may only invalidate regions of its own PD; rxe `rxe_invalidate_mr`).
    pub fn invalidate(&mut self, pd: PdHandle, key: u32) -> Result<(), KeyError> {
        let unknown = KeyError {
            key,
            kind: KeyErrorKind::UnknownKey,
        };
        let mr = self.table.get_mut(key).ok_or(unknown)?;
        if key != mr.lkey && key != mr.rkey {
            return Err(unknown);
        }
        if mr.pd != pd {
            return Err(KeyError {
                key,
                kind: KeyErrorKind::WrongPd {
                    expected: pd.index(),
                    found: mr.pd.index(),
                },
            });
        }
        mr.invalidated = true;
        Ok(())
    }

    /// The registered regions, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &MemoryRegion> + '_ {
        self.table.iter().map(|(_, mr)| mr)
    }

    /// Checks a local access through an lkey (an SGE of a WR on a QP of `pd`): the key names a
    /// region of `pd` that grants `needed` (empty for reads, LOCAL_WRITE for writes into local
    /// memory) and contains `[iova, iova + length)`. O(1).
    ///
    /// The engine maps any failure to `IBV_WC_LOC_PROT_ERR` on a send WR
    /// ([`KeyError::local_wc_status`]) and to a local QP operation error on a receive WQE.
    ///
    /// # Errors
    /// [`KeyErrorKind::UnknownKey`], [`KeyErrorKind::Invalidated`], [`KeyErrorKind::WrongPd`],
    /// [`KeyErrorKind::AccessDenied`], [`KeyErrorKind::OutOfBounds`], checked in that order (rxe
    /// `lookup_mr`, `mr_check_range`).
    pub fn check_lkey(
        &self,
        pd: PdHandle,
        lkey: u32,
        iova: u64,
        length: u64,
        needed: AccessFlags,
    ) -> Result<&MemoryRegion, KeyError> {
        let mr = self.lookup_lkey(lkey).ok_or(KeyError {
            key: lkey,
            kind: KeyErrorKind::UnknownKey,
        })?;
        Self::check(mr, pd, lkey, iova, length, needed)
    }

    /// Checks a remote access through an rkey (a RETH or AtomicETH received on a QP of `pd`):
    /// the key names a region of `pd` with remote access that grants `needed` (REMOTE_READ,
    /// REMOTE_WRITE or REMOTE_ATOMIC) and contains `[iova, iova + length)`. O(1).
    ///
    /// The responder answers any failure with a "remote access error" NAK (AETH NAK code, IBTA
    /// vol. 1 ch. 9), which the requester completes as `IBV_WC_REM_ACCESS_ERR`
    /// ([`KeyError::remote_wc_status`]). A zero-length RDMA request does not validate its rkey (it
    /// accesses no memory); that rule is the engine's: it does not call this check then.
    ///
    /// # Errors
    /// As [`Self::check_lkey`]; the lkey of a region without remote access gives
    /// [`KeyErrorKind::AccessDenied`].
    pub fn check_rkey(
        &self,
        pd: PdHandle,
        rkey: u32,
        iova: u64,
        length: u64,
        needed: AccessFlags,
    ) -> Result<&MemoryRegion, KeyError> {
        let mr = self.lookup_lkey(rkey).ok_or(KeyError {
            key: rkey,
            kind: KeyErrorKind::UnknownKey,
        })?;
        if mr.pd == pd && mr.rkey != rkey {
            return Err(KeyError {
                key: rkey,
                kind: KeyErrorKind::AccessDenied {
                    needed,
                    granted: mr.access,
                },
            });
        }
        Self::check(mr, pd, rkey, iova, length, needed)
    }

    fn check(
        mr: &MemoryRegion,
        pd: PdHandle,
        key: u32,
        iova: u64,
        length: u64,
        needed: AccessFlags,
    ) -> Result<&MemoryRegion, KeyError> {
        if mr.invalidated {
            return Err(KeyError {
                key,
                kind: KeyErrorKind::Invalidated,
            });
        }
        if mr.pd != pd {
            return Err(KeyError {
                key,
                kind: KeyErrorKind::WrongPd {
                    expected: pd.index(),
                    found: mr.pd.index(),
                },
            });
        }
        if !mr.access.contains(needed) {
            return Err(KeyError {
                key,
                kind: KeyErrorKind::AccessDenied {
                    needed,
                    granted: mr.access,
                },
            });
        }
        if !mr.contains(iova, length) {
            return Err(KeyError {
                key,
                kind: KeyErrorKind::OutOfBounds { iova, length },
            });
        }
        Ok(mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::random::OsRandom;
    use crate::verbs::table::Handle;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::vec::Vec;

    const PD: PdHandle = Handle::from_raw(1, 0);
    const PD2: PdHandle = Handle::from_raw(2, 0);
    const RW: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ);

    fn table() -> MrTable {
        MrTable::new(1000, u64::MAX)
    }

    #[test]
    fn access_flag_rules() {
        assert!(AccessFlags::empty().check_mr().is_ok());
        assert!(AccessFlags::REMOTE_READ.check_mr().is_ok());
        assert!(AccessFlags::LOCAL_WRITE.check_mr().is_ok());
        assert!(RW.check_mr().is_ok());
        assert_eq!(
            AccessFlags::REMOTE_WRITE.check_mr(),
            Err(Cause::AccessFlags { flags: 2 })
        );
        assert_eq!(
            (AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ).check_mr(),
            Err(Cause::AccessFlags { flags: 0xc })
        );
        assert!(AccessFlags::from_bits_retain(1 << 20).check_mr().is_err());
        let mut t = table();
        let e = t.register(
            PD,
            0x1000,
            64,
            0x1000,
            AccessFlags::REMOTE_WRITE,
            &mut OsRandom,
        );
        assert_eq!(e.unwrap_err().errno(), crate::verbs::error::errno::EINVAL);
        assert!(t.is_empty());
    }

    #[test]
    fn registration_argument_checks() {
        let mut t = MrTable::new(2, 1 << 20);
        assert!(matches!(
            t.register(PD, 0, 0, 0, RW, &mut OsRandom),
            Err(Cause::InvalidValue { attr: "length", .. })
        ));
        assert!(matches!(
            t.register(PD, 0, (1 << 20) + 1, 0, RW, &mut OsRandom),
            Err(Cause::OutOfRange { attr: "length", .. })
        ));
        assert!(matches!(
            t.register(PD, u64::MAX - 10, 11, 0, RW, &mut OsRandom),
            Err(Cause::InvalidValue { attr: "addr", .. })
        ));
        assert!(matches!(
            t.register(PD, 0, 11, u64::MAX - 10, RW, &mut OsRandom),
            Err(Cause::InvalidValue { attr: "iova", .. })
        ));
        t.register(PD, 0, 1, 0, RW, &mut OsRandom).unwrap();
        t.register(PD, 0, 1, 0, RW, &mut OsRandom).unwrap();
        assert_eq!(
            t.register(PD, 0, 1, 0, RW, &mut OsRandom).unwrap_err(),
            Cause::TooManyObjects {
                object: Object::Mr,
                max: 2
            }
        );
    }

    #[test]
    fn key_layout_and_remote_key() {
        let mut t = table();
        let mr = t
            .register(PD, 0x1000, 4096, 0x1000, RW, &mut OsRandom)
            .unwrap()
            .clone();
        assert_ne!(mr.lkey(), 0, "key 0 is never used");
        assert_eq!(mr.rkey(), mr.lkey());
        let local = t
            .register(
                PD,
                0x1000,
                4096,
                0x1000,
                AccessFlags::LOCAL_WRITE,
                &mut OsRandom,
            )
            .unwrap()
            .clone();
        assert_eq!(local.rkey(), 0, "no remote access, no rkey (rxe)");
        assert!(t.lookup_rkey(local.lkey()).is_none());
        assert!(t.lookup_lkey(0).is_none());
        assert!(t.lookup_rkey(0).is_none());
        assert_eq!(t.lookup_lkey(mr.lkey()), Some(&mr));
    }

    #[test]
    fn reregistration_changes_low_byte_and_old_keys_die_at_once() {
        let mut t = MrTable::new(1, u64::MAX);
        let mut seen = Vec::new();
        let mut prev: Option<MemoryRegion> = None;
        for _ in 0..300 {
            let mr = t.register(PD, 0, 8, 0, RW, &mut OsRandom).unwrap().clone();
            if let Some(p) = &prev {
                assert_eq!(mr.slot(), p.slot(), "a table of one reuses its slot");
                assert_ne!(
                    p.lkey(),
                    mr.lkey(),
                    "a reused slot never repeats its last key"
                );
                assert!(t.lookup_lkey(p.lkey()).is_none());
                assert!(t.lookup_rkey(p.rkey()).is_none());
            }
            seen.push(mr.lkey());
            let removed = t.deregister(mr.lkey()).unwrap();
            assert_eq!(removed, mr);
            assert!(t.lookup_lkey(mr.lkey()).is_none());
            assert!(t.lookup_rkey(mr.rkey()).is_none());
            assert_eq!(
                t.check_rkey(PD, mr.rkey(), 0, 8, AccessFlags::REMOTE_READ)
                    .unwrap_err()
                    .kind,
                KeyErrorKind::UnknownKey
            );
            assert!(t.deregister(mr.lkey()).is_err(), "double dereg fails");
            prev = Some(mr);
        }
        seen.sort_unstable();
        seen.dedup();
        // 32 random bits: two equal keys among 300 have probability about 1e-5, three about 1e-10.
        assert!(
            seen.len() >= 299,
            "keys are random: {} distinct of 300",
            seen.len()
        );
    }

    #[test]
    fn check_kinds_in_rxe_order() {
        let mut t = table();
        let mr = t
            .register(PD, 0x1000, 0x100, 0x1000, RW, &mut OsRandom)
            .unwrap()
            .clone();
        let k = mr.lkey();
        let kind = |r: Result<&MemoryRegion, KeyError>| r.map(|_| ()).unwrap_err().kind;
        assert!(t
            .check_lkey(PD, k, 0x1000, 0x100, AccessFlags::LOCAL_WRITE)
            .is_ok());
        assert_eq!(
            kind(t.check_lkey(PD, k ^ 1, 0x1000, 1, AccessFlags::empty())),
            KeyErrorKind::UnknownKey
        );
        assert_eq!(
            kind(t.check_lkey(PD, k + 0x100, 0x1000, 1, AccessFlags::empty())),
            KeyErrorKind::UnknownKey
        );
        assert_eq!(
            kind(t.check_lkey(PD2, k, 0x1000, 1, AccessFlags::empty())),
            KeyErrorKind::WrongPd {
                expected: 2,
                found: 1
            }
        );
        assert_eq!(
            kind(t.check_rkey(PD, k, 0x1000, 8, AccessFlags::REMOTE_ATOMIC)),
            KeyErrorKind::AccessDenied {
                needed: AccessFlags::REMOTE_ATOMIC,
                granted: RW
            }
        );
        assert_eq!(
            kind(t.check_rkey(PD, k, 0x10ff, 2, AccessFlags::REMOTE_WRITE)),
            KeyErrorKind::OutOfBounds {
                iova: 0x10ff,
                length: 2
            }
        );
        assert_eq!(
            kind(t.check_rkey(PD, k, 0xfff, 1, AccessFlags::REMOTE_READ)),
            KeyErrorKind::OutOfBounds {
                iova: 0xfff,
                length: 1
            }
        );
        // Access is checked before bounds, as rxe's lookup_mr precedes mr_check_range.
        assert!(matches!(
            kind(t.check_rkey(PD, k, 0, 1, AccessFlags::REMOTE_ATOMIC)),
            KeyErrorKind::AccessDenied { .. }
        ));
        // A region without remote access refuses its lkey used as an rkey.
        let local = t
            .register(PD, 0, 0x100, 0, AccessFlags::LOCAL_WRITE, &mut OsRandom)
            .unwrap()
            .lkey();
        assert!(matches!(
            kind(t.check_rkey(PD, local, 0, 1, AccessFlags::REMOTE_READ)),
            KeyErrorKind::AccessDenied { .. }
        ));
        // Local writes need LOCAL_WRITE.
        let ro = t
            .register(PD, 0, 0x100, 0, AccessFlags::REMOTE_READ, &mut OsRandom)
            .unwrap()
            .lkey();
        assert!(t.check_lkey(PD, ro, 0, 0x100, AccessFlags::empty()).is_ok());
        assert!(matches!(
            kind(t.check_lkey(PD, ro, 0, 1, AccessFlags::LOCAL_WRITE)),
            KeyErrorKind::AccessDenied { .. }
        ));
    }

    #[test]
    fn invalidation_kills_both_keys_until_deregistration() {
        let mut t = table();
        let mr = t
            .register(PD, 0x1000, 0x100, 0x1000, RW, &mut OsRandom)
            .unwrap()
            .clone();
        let k = mr.lkey();
        assert_eq!(
            t.invalidate(PD2, k).unwrap_err().kind,
            KeyErrorKind::WrongPd {
                expected: 2,
                found: 1
            }
        );
        assert_eq!(
            t.invalidate(PD, k ^ 1).unwrap_err().kind,
            KeyErrorKind::UnknownKey
        );
        assert!(t.check_lkey(PD, k, 0x1000, 1, AccessFlags::empty()).is_ok());
        t.invalidate(PD, k).unwrap();
        assert!(t.invalidate(PD, k).is_ok(), "idempotent");
        assert!(t.lookup_lkey(k).unwrap().is_invalidated());
        for r in [
            t.check_lkey(PD, k, 0x1000, 1, AccessFlags::empty()),
            t.check_rkey(PD, k, 0x1000, 1, AccessFlags::REMOTE_READ),
        ] {
            assert_eq!(r.unwrap_err().kind, KeyErrorKind::Invalidated);
        }
        t.deregister(k).unwrap();
        let local = t
            .register(PD, 0, 0x100, 0, AccessFlags::LOCAL_WRITE, &mut OsRandom)
            .unwrap()
            .clone();
        assert_eq!(
            t.invalidate(PD, 0).unwrap_err().kind,
            KeyErrorKind::UnknownKey,
            "the 0 rkey of a local-only region names nothing"
        );
        assert!(t.invalidate(PD, local.lkey()).is_ok());
    }

    #[test]
    fn bounds_near_the_top_of_the_address_space() {
        let mut t = table();
        let base = u64::MAX - 4096;
        let mr = t
            .register(PD, base, 4096, base, RW, &mut OsRandom)
            .unwrap()
            .clone();
        assert!(mr.contains(base, 4096));
        assert!(mr.contains(u64::MAX - 1, 1));
        assert!(mr.contains(u64::MAX, 0), "zero bytes at the end");
        assert!(!mr.contains(u64::MAX, 1));
        assert!(!mr.contains(u64::MAX - 1, 2));
        assert!(!mr.contains(base, u64::MAX));
        assert!(!mr.contains(u64::MAX, u64::MAX));
        assert!(!mr.contains(base - 1, 1));
        assert!(t
            .check_rkey(
                PD,
                mr.rkey(),
                u64::MAX - 8,
                u64::MAX,
                AccessFlags::REMOTE_READ
            )
            .is_err());
        assert_eq!(mr.offset_of(u64::MAX), Some(4096), "the end itself");
        assert_eq!(mr.offset_of(u64::MAX - 1), Some(4095));
        assert_eq!(mr.offset_of(base - 1), None);
    }

    proptest! {
        #[test]
        fn contains_matches_wide_arithmetic(
            start in any::<u64>(),
            len in 1u64..=u64::MAX,
            iova in any::<u64>(),
            length in any::<u64>(),
        ) {
            let len = len.min(u64::MAX - start).max(1);
            prop_assume!(start.checked_add(len).is_some());
            let mr = MemoryRegion {
                pd: PD, addr: start, iova: start, length: len,
                access: RW, lkey: 0, rkey: 0, invalidated: false, slot: 0,
            };
            let (s, e) = (start as u128, start as u128 + len as u128);
            let (a, b) = (iova as u128, iova as u128 + length as u128);
            prop_assert_eq!(mr.contains(iova, length), a >= s && b <= e);
        }

        #[test]
        fn random_register_dereg_sequences(ops in proptest::collection::vec((any::<bool>(), 0usize..8), 1..300)) {
            let mut t = MrTable::new(6, u64::MAX);
            let mut live: HashMap<u32, MemoryRegion> = HashMap::new();
            let mut dead: Vec<u32> = Vec::new();
            let mut last_key_of_index: HashMap<u32, u32> = HashMap::new();
            for (reg, pick) in ops {
                if reg {
                    match t.register(PD, pick as u64 * 8, 8, pick as u64 * 8, RW, &mut OsRandom) {
                        Ok(mr) => {
                            let mr = mr.clone();
                            if let Some(old) = last_key_of_index.insert(mr.slot(), mr.lkey()) {
                                prop_assert_ne!(old, mr.lkey());
                            }
                            dead.retain(|&k| k != mr.lkey());
                            live.insert(mr.lkey(), mr);
                        }
                        Err(_) => prop_assert_eq!(live.len(), 6),
                    }
                } else if !live.is_empty() {
                    let key = *live.keys().nth(pick % live.len()).unwrap();
                    prop_assert!(t.deregister(key).is_ok());
                    live.remove(&key);
                    dead.push(key);
                }
                for (k, mr) in &live {
                    prop_assert_eq!(t.lookup_lkey(*k), Some(mr));
                    prop_assert_eq!(t.lookup_rkey(*k), Some(mr));
                }
                for k in &dead {
                    prop_assert!(t.lookup_lkey(*k).is_none());
                }
                prop_assert_eq!(t.len() as usize, live.len());
            }
        }
    }
}
