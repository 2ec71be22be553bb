//! The geometry of a rank's slot rings: where ring `(peer, channel)` lies in a region, and how
//! many WRs each QP needs.

use crate::transport::SlotHeader;

/// Geometry of the rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) nchannels: usize,
    pub(super) nslots: usize,
    pub(super) slot_bytes: usize,
}

impl Layout {
    pub(super) fn stride(&self) -> usize {
        SlotHeader::LEN + self.slot_bytes
    }
    pub(super) fn ring_bytes(&self) -> usize {
        self.nslots * self.stride()
    }
    /// Offset of ring `(peer index, channel)` in a region of rings.
    pub(super) fn ring_offset(&self, peer_index: usize, channel: usize) -> usize {
        (peer_index * self.nchannels + channel) * self.ring_bytes()
    }
    pub(super) fn recv_wrs(&self) -> u32 {
        2 * self.nslots as u32 + 8
    }
    pub(super) fn send_wrs(&self) -> u32 {
        4 * self.nslots as u32 + 16
    }
}
