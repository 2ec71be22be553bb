//! The memory behind memory regions, and the copies between it and packets.
//!
//! The object model ([`crate::verbs::mr`]) knows an MR's keys, PD, access rights and I/O virtual address
//! range; this module attaches the bytes: a [`gpu_p2p::Memory`] (host pages, GPU memory) and the
//! offset in it where the MR's first byte lives. The engine never holds a Rust reference into
//! registered memory: a peer may write it at any moment, so every access is a copy through the
//! trait, checked against the key first (O(1): the key finds the MR's table slot, which indexes this
//! module's table too). A payload moves at most once:
//! from MR memory into the outgoing packet buffer (or not at all when the link gathers it in place,
//! module `tx`), or from the received packet into MR memory.

use alloc::sync::Arc;
use alloc::vec::Vec;

use gpu_p2p::Memory;

use crate::verbs::error::{KeyError, KeyErrorKind};
use crate::verbs::mr::{AccessFlags, MemoryRegion, MrTable};
use crate::verbs::pd::PdHandle;
use crate::verbs::wr::Sge;

use super::tx::TxOut;

/// The bytes of one registered MR.
#[derive(Debug, Clone)]
pub(crate) struct MrBacking {
    pub(crate) memory: Arc<dyn Memory>,
    /// Where the MR's first byte (its iova) is in `memory`.
    pub(crate) offset: usize,
}

/// MR backings indexed by the MR's table slot ([`MemoryRegion::slot`]), so lookups are O(1).
#[derive(Debug, Default)]
pub(crate) struct MrMemory {
    slots: Vec<Option<MrBacking>>,
}

/// Why a copy failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// A key check failed (unknown, invalidated, other PD, no access, out of bounds).
    Key(KeyError),
    /// The SGE list is shorter than the bytes to place (a receive buffer too small).
    Overflow,
}

impl MrMemory {
    pub(crate) fn insert(&mut self, slot: u32, backing: MrBacking) {
        let index = slot as usize;
        if self.slots.len() <= index {
            self.slots.resize(index + 1, None);
        }
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Some(backing);
        }
    }

    pub(crate) fn remove(&mut self, slot: u32) {
        if let Some(slot) = self.slots.get_mut(slot as usize) {
            *slot = None;
        }
    }

    fn backing(&self, slot: u32) -> Option<&MrBacking> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The memory and byte offset of `iova` in a region that already passed its key check.
    fn locate(
        &self,
        mr: &MemoryRegion,
        key: u32,
        iova: u64,
        len: usize,
    ) -> Result<(&Arc<dyn Memory>, usize), KeyError> {
        let out_of_bounds = KeyError {
            key,
            kind: KeyErrorKind::OutOfBounds {
                iova,
                length: len as u64,
            },
        };
        let backing = self.backing(mr.slot()).ok_or(out_of_bounds)?;
        let in_mr = mr
            .offset_of(iova)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(out_of_bounds)?;
        let at = backing.offset.checked_add(in_mr).ok_or(out_of_bounds)?;
        Ok((&backing.memory, at))
    }

    /// Copies `dst.len()` bytes of the message formed by `sges` (concatenated), starting at byte
    /// `offset` of the message, into `dst`. Every SGE touched is checked with
    /// [`MrTable::check_lkey`] for `pd` (local read access is always granted).
    pub(crate) fn gather<I: IntoIterator<Item = Sge>>(
        &self,
        mrs: &MrTable,
        pd: PdHandle,
        sges: I,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), CopyError> {
        self.walk(
            mrs,
            pd,
            sges,
            offset,
            dst.len(),
            AccessFlags::empty(),
            |mem, at, range| mem.read(at, &mut dst[range]).is_ok(),
        )
    }

    /// Describes the bytes `[offset, offset + len)` of the message formed by `sges` as payload
    /// segments of `out` (zero-copy transmit), checking every SGE touched as
    /// [`MrMemory::gather`] does. `Ok(true)`: the segments are in `out`; `Ok(false)`: a piece is
    /// in memory the CPU cannot address or there are more pieces than a packet may have (`out`
    /// then has no segments: copy with [`MrMemory::gather`] instead).
    pub(crate) fn segments<I: IntoIterator<Item = Sge>>(
        &self,
        mrs: &MrTable,
        pd: PdHandle,
        sges: I,
        offset: u64,
        len: usize,
        out: &mut TxOut<'_>,
    ) -> Result<bool, CopyError> {
        let mut all = true;
        let walked = self.walk(
            mrs,
            pd,
            sges,
            offset,
            len,
            AccessFlags::empty(),
            |mem, at, range| {
                if all && !out.push_segment(mem, at, range.len()) {
                    all = false;
                }
                gpu_p2p::check_range(at, range.len(), mem.len()).is_ok()
            },
        );
        if walked.is_err() || !all {
            out.reset();
        }
        walked.map(|()| all)
    }

    /// Copies `src` into the buffers of `sges` (concatenated), starting at byte `offset`, checking
    /// every SGE touched with [`MrTable::check_lkey`] for LOCAL_WRITE.
    pub(crate) fn scatter<I: IntoIterator<Item = Sge>>(
        &self,
        mrs: &MrTable,
        pd: PdHandle,
        sges: I,
        offset: u64,
        src: &[u8],
    ) -> Result<(), CopyError> {
        self.walk(
            mrs,
            pd,
            sges,
            offset,
            src.len(),
            AccessFlags::LOCAL_WRITE,
            |mem, at, range| mem.write(at, &src[range]).is_ok(),
        )
    }

    /// Walks the byte range `[offset, offset + len)` of an SGE list, calling `copy(memory,
    /// memory_offset, range_in_buffer)` for each piece after checking its lkey.
    #[allow(clippy::too_many_arguments)]
    fn walk<I, F>(
        &self,
        mrs: &MrTable,
        pd: PdHandle,
        sges: I,
        offset: u64,
        len: usize,
        needed: AccessFlags,
        mut copy: F,
    ) -> Result<(), CopyError>
    where
        I: IntoIterator<Item = Sge>,
        F: FnMut(&Arc<dyn Memory>, usize, core::ops::Range<usize>) -> bool,
    {
        let mut skip = offset;
        let mut done = 0usize;
        for sge in sges {
            if done == len {
                return Ok(());
            }
            let sge_len = u64::from(sge.length);
            if skip >= sge_len {
                skip -= sge_len;
                continue;
            }
            let avail = (sge_len - skip) as usize;
            let n = avail.min(len - done);
            let iova = sge.addr.wrapping_add(skip);
            let mr = mrs
                .check_lkey(pd, sge.lkey, iova, n as u64, needed)
                .map_err(CopyError::Key)?;
            let (mem, at) = self.locate(mr, sge.lkey, iova, n).map_err(CopyError::Key)?;
            if !copy(mem, at, done..done + n) {
                return Err(CopyError::Key(KeyError {
                    key: sge.lkey,
                    kind: KeyErrorKind::OutOfBounds {
                        iova,
                        length: n as u64,
                    },
                }));
            }
            done += n;
            skip = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(CopyError::Overflow)
        }
    }

    /// Checks an rkey for `pd` and `needed` over `[va, va + len)` and returns where the bytes are.
    pub(crate) fn remote<'a>(
        &'a self,
        mrs: &MrTable,
        pd: PdHandle,
        rkey: u32,
        va: u64,
        len: usize,
        needed: AccessFlags,
    ) -> Result<(&'a Arc<dyn Memory>, usize), KeyError> {
        let mr = mrs.check_rkey(pd, rkey, va, len as u64, needed)?;
        self.locate(mr, rkey, va, len)
    }
}
