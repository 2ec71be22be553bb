//! The registration cache of user buffers for zero-copy sends ([`RegCache`]).

use std::sync::Arc;

use gpu_p2p::UserMemory;
use hca::soft::DeviceError;
use hca::verbs::Verbs;
use hca::{AccessFlags, PdHandle};

/// The registration cache: user buffers registered for zero-copy sends, by page-aligned range,
/// so that a buffer passed again (every iteration of a training loop) is not registered again
/// (NCCL's user-buffer registration cache). A lookup finds a registration that covers the range;
/// a miss registers the range rounded out to pages. At most [`RegCache::CAPACITY`]
/// registrations are kept; the least recently used one is evicted to make room, and evicted
/// registrations are deregistered once no WR that reads user memory is outstanding on the
/// device (a WR may still point at one).
///
/// A registration only names a range of addresses (the software HCA copies from the address
/// when it builds a packet; nothing is pinned), so a buffer freed and another allocated at the
/// same place reuse it correctly, and a stale one is never read: the HCA reads user memory only
/// for WRs posted by [`SendConnector::post_from`](crate::transport::SendConnector::post_from), and no peer can address it (no remote
/// access).
#[derive(Debug)]
pub struct RegCache {
    /// `(start, end, lkey, last use)`.
    pub(super) entries: Vec<(usize, usize, u32, u64)>,
    /// Evicted registrations to deregister once no user-memory WR is outstanding.
    pub(super) evicted: Vec<u32>,
    pub(super) clock: u64,
    /// Registrations made (misses).
    pub registrations: u64,
    /// Lookups served without registering (hits).
    pub hits: u64,
}

impl RegCache {
    /// Most registrations kept.
    pub const CAPACITY: usize = 64;
    pub(super) const PAGE: usize = 4096;

    pub(super) fn new() -> RegCache {
        RegCache {
            entries: Vec::new(),
            evicted: Vec::new(),
            clock: 0,
            registrations: 0,
            hits: 0,
        }
    }

    /// The lkey of a registration covering `[addr, addr + len)`, registering it on a miss.
    /// `quiet`: no WR reading user memory is outstanding on the device.
    pub(super) fn lookup(
        &mut self,
        dev: &dyn Verbs,
        pd: PdHandle,
        addr: usize,
        len: usize,
        quiet: bool,
    ) -> Result<u32, DeviceError> {
        self.clock += 1;
        if quiet {
            for lkey in self.evicted.drain(..) {
                let _ = dev.dereg_mr(lkey);
            }
        }
        let end = addr + len;
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 <= addr && end <= e.1) {
            e.3 = self.clock;
            self.hits += 1;
            return Ok(e.2);
        }
        if self.entries.len() >= Self::CAPACITY {
            if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].3) {
                let (_, _, lkey, _) = self.entries.swap_remove(i);
                self.evicted.push(lkey);
            }
        }
        let start = addr & !(Self::PAGE - 1);
        let stop = end.div_ceil(Self::PAGE) * Self::PAGE;
        let len = stop - start;
        // SAFETY: the HCA reads a registered user range only while a WR whose SGE points into
        // it is outstanding, and `post_from`'s contract keeps the range alive and unwritten
        // until `drain` has seen that WR complete (the registration is local-only: no peer can
        // make the HCA read it); `post_from` exposed the provenance of the range.
        let mem = Arc::new(unsafe { UserMemory::new(start, len) });
        let mr = dev.reg_mr(pd, mem, 0, len, start as u64, AccessFlags::empty())?;
        self.registrations += 1;
        self.entries.push((start, stop, mr.lkey(), self.clock));
        Ok(mr.lkey())
    }
}
