//! The send and receive connectors of one channel ([`RoceSend`], [`RoceRecv`]): the slot
//! protocol's steps as WRITE_WITH_IMMs, credits as SEND_WITH_IMMs.
//!
//! # The header only when the operation changes
//! A step's [`SlotHeader`] is 64 bytes in front of the payload; with it a full slot of 128 KiB
//! is 131 136 bytes on the wire, 33 packets at a 4096-byte PMTU where the payload needs 32. The
//! header carries the payload length (the receive completion's byte count says it too), the
//! immediate (the completion carries it) and the operation's [`OpDesc`], which is the same for
//! every step of one operation. So a sender writes the header only on the first step after the
//! descriptor changed (the first step of each operation on the channel); the other steps write
//! the payload alone, into the slot's payload area, and set [`IMM_HEADER`] clear in the
//! immediate. The receiver keeps the last descriptor it read on the channel: RC delivers a QP's
//! writes in order, so it is the sender's. A step is then exactly `ceil(len / PMTU)` packets.
//!
//! The immediate on this path (RoCE only; [`Imm`] is the transport-neutral view):
//! `step mod 2^15 << 17 | header << 16 | chunk`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hca::{SendOp, Sge};

use super::channel::{Channel, WR_CREDIT, WR_DATA, WR_DATA_USER};
use super::device::lock;
use super::stats::Blocked;
use crate::transport::{
    Abort, AbortReason, Imm, OpDesc, RecvChunk, RecvConnector, SendConnector, SlotHeader,
    TransportError, WaitFor,
};

/// Bit of the wire immediate that says the write starts with a [`SlotHeader`] (see the
/// [module docs](self#the-header-only-when-the-operation-changes)).
pub(super) const IMM_HEADER: u32 = 1 << 16;

/// Bits of the channel step the wire immediate carries (15: the other bit is [`IMM_HEADER`]).
const IMM_STEP_MASK: u32 = 0x7fff;

/// The wire immediate of step `step`, chunk `chunk`, with or without a header.
pub(super) fn wire_imm(step: u32, chunk: u16, header: bool) -> u32 {
    (step & IMM_STEP_MASK) << 17 | if header { IMM_HEADER } else { 0 } | u32::from(chunk)
}

/// Sending end of one channel.
pub(super) struct RoceSend {
    pub(super) ch: Arc<Channel>,
    /// Next step to post.
    pub(super) step: u32,
    pub(super) slot_held: bool,
    /// The descriptor of the last header written on this channel: steps of the same operation
    /// go without one.
    pub(super) last_desc: Option<OpDesc>,
}

impl RoceSend {
    pub(super) fn slot_offset(&self, step: u32) -> usize {
        self.ch.send_off + (step as usize % self.ch.layout.nslots) * self.ch.layout.stride()
    }

    pub(super) fn remote_slot(&self, step: u32) -> u64 {
        self.ch.remote_ring
            + ((step as usize % self.ch.layout.nslots) * self.ch.layout.stride()) as u64
    }

    pub(super) fn check_post(&self, len: usize) -> Result<(), TransportError> {
        if len > self.ch.layout.slot_bytes {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post longer than a slot",
            });
        }
        Ok(())
    }

    /// Waits for the next step's slot: a credit from the peer, the staging slot's previous WR
    /// complete, and room in the send queue.
    pub(super) fn wait_free(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let (step, nslots, depth) = (
            self.step,
            self.ch.layout.nslots as u32,
            self.ch.layout.send_wrs(),
        );
        let mut first = true;
        let stats = &self.ch.hca.stats;
        self.ch.wait(timeout, WaitFor::Credit, |st| {
            let blocked = if step.wrapping_sub(st.credit) >= nslots {
                Some(Blocked::Credit)
            } else if step.wrapping_sub(st.data_done) >= nslots {
                Some(Blocked::Ack)
            } else if st.sq_outstanding >= depth {
                Some(Blocked::Sq)
            } else {
                None
            };
            if let (Some(b), true) = (blocked, first) {
                stats.blocked(b);
            }
            first = false;
            blocked.is_none().then_some(())
        })
    }

    /// Posts step `self.step` as one WRITE_WITH_IMM of `len` bytes of payload: staged in the
    /// staging slot (`payload` `None`) or at `payload`, preceded by the slot header when the
    /// descriptor differs from the last one sent on this channel.
    pub(super) fn post_write(
        &mut self,
        len: usize,
        chunk: u16,
        desc: &OpDesc,
        payload: Option<Sge>,
    ) -> Result<(), TransportError> {
        let imm = Imm {
            step: self.step as u16,
            chunk,
        };
        let with_header = self.last_desc != Some(*desc);
        let off = self.slot_offset(self.step);
        if with_header {
            let b = SlotHeader {
                len: len as u32,
                imm,
                desc: *desc,
            }
            .encode();
            // SAFETY: the staging slot of `step` is ours (its previous WR completed:
            // `wait_free`); the header is 64 bytes at its start, inside the send region.
            unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.ch.send.ptr(off), b.len()) };
        }
        // The header, if any, and the staged payload are one SGE from the staging slot.
        let (head_off, head_len) = match (with_header, payload.is_some()) {
            (true, true) => (off, SlotHeader::LEN),
            (true, false) => (off, SlotHeader::LEN + len),
            (false, true) => (off, 0),
            (false, false) => (off + SlotHeader::LEN, len),
        };
        let head = Sge {
            addr: self.ch.send.iova(head_off),
            length: head_len as u32,
            lkey: self.ch.send.mr.lkey(),
        };
        let mut sges = [head, head];
        // No SGE of length 0 (some HCAs read one as 2 GiB): an empty step has no SGE.
        let nsge = match payload {
            Some(p) if head_len == 0 => {
                sges[0] = p;
                1
            }
            Some(p) => {
                sges[1] = p;
                2
            }
            None => usize::from(head_len > 0),
        };
        let skip = if with_header { 0 } else { SlotHeader::LEN };
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: self.remote_slot(self.step) + skip as u64,
            rkey: self.ch.rkey,
            imm_data: wire_imm(self.step, chunk, with_header),
        };
        let kind = if payload.is_some() {
            WR_DATA_USER
        } else {
            WR_DATA
        };
        let mut st = self.ch.state();
        self.ch
            .post_send(&mut st, kind | u64::from(self.step), &sges[..nsge], op)?;
        if payload.is_some() {
            st.user_wrs += 1;
            self.ch.hca.user_wrs.fetch_add(1, Ordering::AcqRel);
        }
        self.last_desc = Some(*desc);
        self.step = self.step.wrapping_add(1);
        st.posted = self.step;
        self.ch.hca.stats.post(
            st.posted.wrapping_sub(st.credit),
            st.posted.wrapping_sub(st.data_done),
        );
        self.slot_held = false;
        Ok(())
    }
}

impl SendConnector for RoceSend {
    fn peer(&self) -> usize {
        self.ch.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ch.layout.slot_bytes
    }

    fn wait_slot(&mut self, timeout: Duration) -> Result<&mut [u8], TransportError> {
        if !self.slot_held {
            self.wait_free(timeout)?;
            self.slot_held = true;
        }
        let off = self.slot_offset(self.step) + SlotHeader::LEN;
        // SAFETY: the staging slot of `step` is ours: the HCA finished the WR that last read it
        // (`data_done`) and posts nothing from it until our `post`. It lies inside the send
        // region, and the slice borrows `self` mutably, so it ends before `post`.
        Ok(unsafe {
            core::slice::from_raw_parts_mut(self.ch.send.ptr(off), self.ch.layout.slot_bytes)
        })
    }

    fn post(&mut self, len: usize, chunk: u16, desc: &OpDesc) -> Result<(), TransportError> {
        if !self.slot_held {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post without a slot from wait_slot",
            });
        }
        self.check_post(len)?;
        self.post_write(len, chunk, desc, None)
    }

    unsafe fn post_from(
        &mut self,
        src: &[u8],
        region: &[u8],
        chunk: u16,
        desc: &OpDesc,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.check_post(src.len())?;
        if self.slot_held {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "post_from while a slot from wait_slot is held",
            });
        }
        self.wait_free(timeout)?;
        self.slot_held = true;
        let payload = if src.is_empty() {
            None
        } else {
            let quiet = self.ch.hca.user_wrs.load(Ordering::Acquire) == 0;
            // Register the whole buffer `src` lies in (one registration serves every chunk of
            // it); the SGE below still covers `src` only.
            let (s, r) = (src.as_ptr_range(), region.as_ptr_range());
            let reg = if r.start <= s.start && s.end <= r.end {
                region
            } else {
                src
            };
            let lkey = lock(&self.ch.hca.regs)
                .lookup(
                    &*self.ch.hca.dev,
                    self.ch.hca.pd,
                    // The HCA addresses user memory by address, as a NIC would by DMA address;
                    // `gpu_p2p::UserMemory` turns it back into a pointer with this provenance.
                    reg.as_ptr().expose_provenance(),
                    reg.len(),
                    quiet,
                )
                .map_err(self.ch.verbs_err("ibv_reg_mr"))?;
            // The SGE's address carries `src`'s provenance too (`UserMemory` reads through it).
            let _ = src.as_ptr().expose_provenance();
            Some(Sge {
                addr: src.as_ptr() as u64,
                length: src.len() as u32,
                lkey,
            })
        };
        self.post_write(src.len(), chunk, desc, payload)
    }

    fn drain(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let step = self.step;
        self.ch.wait(timeout, WaitFor::Drain, |st| {
            (st.credit == step && st.data_done == step).then_some(())
        })
    }

    fn abort(&mut self, abort: Abort) {
        self.ch.send_abort(abort);
        self.ch.quiesce();
    }
}

impl Drop for RoceSend {
    fn drop(&mut self) {
        self.ch.send_abort(Abort {
            origin: self.ch.rank,
            reason: AbortReason::Closed,
        });
        self.ch.quiesce();
    }
}

/// Receiving end of one channel.
pub(super) struct RoceRecv {
    pub(super) ch: Arc<Channel>,
    /// Next step to receive.
    pub(super) step: u32,
    pub(super) held: Option<SlotHeader>,
    /// The descriptor of the last header read on this channel, which the steps without a
    /// header belong to.
    pub(super) last_desc: Option<OpDesc>,
    /// The timeout of the last wait, for the send-queue wait of a credit.
    pub(super) timeout: Duration,
}

impl RoceRecv {
    pub(super) fn slot_offset(&self) -> usize {
        self.ch.recv_off + (self.step as usize % self.ch.layout.nslots) * self.ch.layout.stride()
    }

    pub(super) fn protocol(&self, what: String) -> TransportError {
        TransportError::Protocol {
            peer: self.ch.peer,
            channel: self.ch.channel,
            what,
        }
    }
}

impl RecvConnector for RoceRecv {
    fn peer(&self) -> usize {
        self.ch.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ch.layout.slot_bytes
    }

    fn wait(&mut self, timeout: Duration) -> Result<RecvChunk<'_>, TransportError> {
        self.timeout = timeout;
        let header = match self.held {
            Some(h) => h,
            None => {
                let (raw, byte_len) = self
                    .ch
                    .wait(timeout, WaitFor::Data, |st| st.arrivals.pop_front())?;
                let step = raw >> 17;
                let imm = Imm {
                    step: self.step as u16,
                    chunk: raw as u16,
                };
                if step != self.step & IMM_STEP_MASK {
                    return Err(self.protocol(format!(
                        "immediate carries step {step} where step {} was expected (mod 2^15)",
                        self.step & IMM_STEP_MASK
                    )));
                }
                let slot_bytes = self.ch.layout.slot_bytes;
                let h = if raw & IMM_HEADER == 0 {
                    let Some(desc) = self.last_desc else {
                        return Err(self.protocol(
                            "a write without a slot header before any header on the channel".into(),
                        ));
                    };
                    if byte_len as usize > slot_bytes {
                        return Err(self.protocol(format!(
                            "write of {byte_len} bytes in a slot of {slot_bytes}"
                        )));
                    }
                    SlotHeader {
                        len: byte_len,
                        imm,
                        desc,
                    }
                } else {
                    let mut b = [0u8; SlotHeader::LEN];
                    // SAFETY: the slot lies inside the receive region; its write completed
                    // before the CQE we polled (under the engine lock its write was made under),
                    // and the credit protocol keeps the peer from writing it again before our
                    // release. A peer that breaks the protocol can only change byte values,
                    // valid for `u8`.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            self.ch.recv.ptr(self.slot_offset()),
                            b.as_mut_ptr(),
                            b.len(),
                        )
                    };
                    let h = SlotHeader::decode(&b);
                    if h.imm != imm {
                        return Err(self.protocol(format!(
                            "slot header says {:?}, the immediate {imm:?}",
                            h.imm
                        )));
                    }
                    if h.len as usize > slot_bytes
                        || byte_len as usize != SlotHeader::LEN + h.len as usize
                    {
                        return Err(self.protocol(format!(
                            "write of {byte_len} bytes with a header of {} payload bytes in a \
                             slot of {slot_bytes}",
                            h.len
                        )));
                    }
                    self.last_desc = Some(h.desc);
                    h
                };
                self.held = Some(h);
                h
            }
        };
        let off = self.slot_offset() + SlotHeader::LEN;
        // SAFETY: as for the header above; `len <= slot_bytes` was checked, and the slice borrows
        // `self`, so it ends before `release` hands the slot back.
        let data =
            unsafe { core::slice::from_raw_parts(self.ch.recv.ptr(off), header.len as usize) };
        Ok(RecvChunk {
            imm: header.imm,
            desc: header.desc,
            data,
        })
    }

    fn release(&mut self) -> Result<(), TransportError> {
        if self.held.take().is_none() {
            return Err(TransportError::Usage {
                peer: self.ch.peer,
                what: "release without a chunk from wait",
            });
        }
        self.step = self.step.wrapping_add(1);
        self.ch.wait_sq(self.timeout, WaitFor::Credit)?;
        let mut st = self.ch.state();
        // The credit leaves with the rank's next post or poll (one round, one sendmmsg(2) per
        // source port with the deferred ACK of the data it returns and, in recvCopySend and
        // recvReduceSend, the next WRITE_WITH_IMM), not in a round of its own.
        self.ch.post_send_as(
            &mut st,
            WR_CREDIT,
            &[],
            SendOp::SendWithImm {
                imm_data: self.step,
            },
            self.ch.hca.caller_driven,
        )
    }

    fn abort(&mut self, abort: Abort) {
        self.ch.send_abort(abort);
    }
}

impl Drop for RoceRecv {
    fn drop(&mut self) {
        self.ch.send_abort(Abort {
            origin: self.ch.rank,
            reason: AbortReason::Closed,
        });
    }
}
