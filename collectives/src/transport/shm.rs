//! The intra-node transport: slot rings in memory shared by the ranks of one host (NCCL's SHM
//! transport), or by the threads of one process.
//!
//! # Segments
//! Every rank owns one *segment*: the receive rings of all its peers on this transport. Like an
//! RDMA receive buffer, it is the receiver's memory that senders write into. A segment is a
//! POSIX shared-memory object (`shm_open` + `ftruncate`, mapped with `memmap2`) named
//! `/coll-<tag>-<rank>-<pid>`, where `<tag>` is a one-way hash of the communicator's magic (not
//! the magic: that is the rendezvous secret); the name
//! travels to the peers in the bootstrap's connection-info round, the peers map it, and after a
//! bootstrap barrier (every peer has mapped it) the owner unlinks the name, so a crash later leaks
//! nothing. For [`TransportKind::InProcess`] the segment is anonymous memory and the "name" is a
//! key into a process-wide table, removed the same way.
//!
//! ```text
//! segment:  [ header, 4096 B ][ ring (0,0) ][ ring (0,1) ] ... [ ring (nranks-1, nchannels-1) ]
//!           ring (p, c) = the receive ring of channel c from peer p (unused for p == owner)
//! ring:     [ RingCtrl, 256 B ][ slot 0: SlotHeader 64 B | payload slot_bytes ] ... [ slot nslots-1 ]
//! RingCtrl: line 0: tail (sender), recv_waiting (receiver)
//!           line 1: head (receiver), send_waiting (sender)
//!           line 2: sender_abort (sender), receiver_abort (receiver)
//! ```
//!
//! Each word has one writer; the counters live on separate cache lines so that the sender's
//! stores to `tail` and the receiver's stores to `head` do not bounce one line between cores.
//! `tail` and `head` count steps modulo 2^32 (compared with wrapping subtraction).
//!
//! # Memory ordering
//! * Sender: writes header + payload, then `tail.store(k + 1, Release)`; receiver:
//!   `tail.load(Acquire)`, then reads the slot. Prevents the receiver from reading a slot before
//!   its contents are written (read-after-write race on the slot).
//! * Receiver: finishes reading the slot, then `head.store(k + 1, Release)`; sender:
//!   `head.load(Acquire)`, then overwrites that slot with step `k + nslots`. Prevents the sender
//!   from overwriting bytes the receiver is still reading (write-after-read race).
//! * Abort words: stored with Release after the aborting side's last post, loaded with Acquire,
//!   so a peer that sees the abort also sees every post made before it.
//! * Wake-ups: see [`super::wait`].

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};

use super::sys::{self, Liveness};
use super::wait::{notify, WaitEnd, WaitPolicy, Waiter};
use super::{
    Abort, AbortReason, Imm, OpDesc, PeerConnectors, RecvChunk, RecvConnector, SendConnector,
    SetupContext, SlotHeader, Transport, TransportError, TransportKind, WaitFor,
};
use crate::codec::{Reader, Writer};

/// Bytes reserved at the start of a segment for its header.
const SEGMENT_HEADER_BYTES: usize = 4096;
/// Bytes of a ring's control block (three cache lines, padded).
const RING_CTRL_BYTES: usize = 256;
/// "COLLSHM1".
const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"COLLSHM1");
const SEGMENT_VERSION: u32 = 1;

/// The control block at the start of every ring. Shared between two processes: only atomics.
#[repr(C, align(64))]
pub(crate) struct RingCtrl {
    /// Steps posted by the sender.
    tail: AtomicU32,
    /// Set by the receiver while it sleeps on `tail`.
    recv_waiting: AtomicU32,
    _pad0: [u32; 14],
    /// Steps consumed (released) by the receiver: the credits.
    head: AtomicU32,
    /// Set by the sender while it sleeps on `head`.
    send_waiting: AtomicU32,
    _pad1: [u32; 14],
    /// The sender's abort word ([`Abort::to_word`]), 0 while it runs.
    sender_abort: AtomicU32,
    /// The receiver's abort word, 0 while it runs.
    receiver_abort: AtomicU32,
    _pad2: [u32; 14],
}

/// Geometry shared by every ring of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    nranks: usize,
    nchannels: usize,
    nslots: usize,
    slot_bytes: usize,
}

impl Layout {
    fn from_ctx(ctx: &SetupContext<'_>) -> Layout {
        Layout {
            nranks: ctx.nranks,
            nchannels: ctx.nchannels,
            nslots: ctx.nslots,
            slot_bytes: ctx.slot_bytes,
        }
    }

    fn slot_stride(&self) -> usize {
        SlotHeader::LEN + self.slot_bytes
    }

    fn ring_bytes(&self) -> usize {
        RING_CTRL_BYTES + self.nslots * self.slot_stride()
    }

    fn segment_bytes(&self) -> usize {
        SEGMENT_HEADER_BYTES + self.nranks * self.nchannels * self.ring_bytes()
    }

    /// Offset of the ring that carries channel `channel` from `sender` into a segment.
    fn ring_offset(&self, sender: usize, channel: usize) -> usize {
        SEGMENT_HEADER_BYTES + (sender * self.nchannels + channel) * self.ring_bytes()
    }

    fn encode_header(&self, owner: usize) -> [u8; 40] {
        let mut w = Writer::default();
        w.u64(SEGMENT_MAGIC)
            .u32(SEGMENT_VERSION)
            .u32(owner as u32)
            .u32(self.nranks as u32)
            .u32(self.nchannels as u32)
            .u32(self.nslots as u32)
            .u32(self.slot_bytes as u32)
            .u64(self.segment_bytes() as u64);
        let mut out = [0u8; 40];
        out.copy_from_slice(&w.buf);
        out
    }
}

/// A mapped segment, shared by every connector that uses one of its rings.
struct Mapping {
    map: MmapRaw,
}

impl Mapping {
    fn len(&self) -> usize {
        self.map.len()
    }
    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

/// Segments of the in-process namespace, by name.
static PROCESS_SEGMENTS: Mutex<BTreeMap<String, Arc<Mapping>>> = Mutex::new(BTreeMap::new());

fn process_segments() -> std::sync::MutexGuard<'static, BTreeMap<String, Arc<Mapping>>> {
    // A panic while the lock was held leaves a map that is still consistent (single inserts and
    // removes), so a poisoned lock is used as is.
    PROCESS_SEGMENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where segment names live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Namespace {
    /// POSIX shared memory (`/dev/shm`): processes of one host.
    Posix,
    /// A table in this process: threads of one process.
    Process,
}

/// This rank's own segment, with its name until [`Transport::finish`] unlinks it.
struct OwnedSegment {
    name: String,
    namespace: Namespace,
    mapping: Arc<Mapping>,
    linked: bool,
}

impl OwnedSegment {
    fn create(name: String, namespace: Namespace, bytes: usize) -> Result<Self, TransportError> {
        let setup_err = |op: &'static str, source: io::Error| TransportError::Setup {
            peer: None,
            op,
            on: name.clone(),
            source,
        };
        let map = match namespace {
            Namespace::Posix => {
                let file = match sys::shm_create(&name) {
                    // A stale object of a crashed process whose pid was reused: ours to replace.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let _ = sys::shm_unlink(&name);
                        sys::shm_create(&name)
                    }
                    other => other,
                }
                .map_err(|e| setup_err("shm_open", e))?;
                let map = Self::map_file(&file, bytes);
                if map.is_err() {
                    let _ = sys::shm_unlink(&name);
                }
                map.map_err(|e| setup_err("ftruncate/mmap", e))?
            }
            Namespace::Process => MmapRaw::from(
                MmapOptions::new()
                    .len(bytes)
                    .map_anon()
                    .map_err(|e| setup_err("mmap anonymous", e))?,
            ),
        };
        let mapping = Arc::new(Mapping { map });
        if namespace == Namespace::Process {
            process_segments().insert(name.clone(), mapping.clone());
        }
        Ok(OwnedSegment {
            name,
            namespace,
            mapping,
            linked: true,
        })
    }

    fn map_file(file: &File, bytes: usize) -> io::Result<MmapRaw> {
        file.set_len(bytes as u64)?;
        MmapOptions::new().len(bytes).map_raw(file)
    }

    fn unlink(&mut self) -> io::Result<()> {
        if !self.linked {
            return Ok(());
        }
        self.linked = false;
        match self.namespace {
            Namespace::Posix => sys::shm_unlink(&self.name),
            Namespace::Process => {
                process_segments().remove(&self.name);
                Ok(())
            }
        }
    }
}

impl Drop for OwnedSegment {
    fn drop(&mut self) {
        // Error paths that never reached `finish`: do not leak the name.
        let _ = self.unlink();
    }
}

/// One ring inside a mapped segment.
struct Ring {
    mapping: Arc<Mapping>,
    offset: usize,
    nslots: u32,
    slot_bytes: usize,
}

impl Ring {
    fn new(mapping: Arc<Mapping>, layout: &Layout, sender: usize, channel: usize) -> Ring {
        Ring {
            offset: layout.ring_offset(sender, channel),
            nslots: layout.nslots as u32,
            slot_bytes: layout.slot_bytes,
            mapping,
        }
    }

    fn ctrl(&self) -> &RingCtrl {
        // SAFETY: `offset + RING_CTRL_BYTES` lies inside the mapping (the layout was validated
        // against the mapping's length when the ring was made), the mapping is page aligned and
        // `offset` a multiple of 64, so the pointer is aligned for `RingCtrl`. The mapping lives
        // as long as `self.mapping`. `RingCtrl` holds only atomics (and padding never accessed),
        // which are valid for any bit pattern and may be shared with other processes.
        unsafe { &*(self.mapping.base().add(self.offset) as *const RingCtrl) }
    }

    fn slot_ptr(&self, step: u32) -> *mut u8 {
        let slot = (step % self.nslots) as usize;
        let off = self.offset + RING_CTRL_BYTES + slot * (SlotHeader::LEN + self.slot_bytes);
        // SAFETY: in bounds of the mapping, as validated for the whole ring.
        unsafe { self.mapping.base().add(off) }
    }

    /// The header of the slot of `step`, copied out (the peer may be hostile: never reference
    /// shared bytes that are then interpreted).
    fn read_header(&self, step: u32) -> SlotHeader {
        let mut b = [0u8; SlotHeader::LEN];
        // SAFETY: the slot header lies inside the mapping; the credit protocol gives the
        // receiver this slot until it releases it, and a plain byte copy is valid for any bytes.
        unsafe { core::ptr::copy_nonoverlapping(self.slot_ptr(step), b.as_mut_ptr(), b.len()) };
        SlotHeader::decode(&b)
    }

    fn write_header(&self, step: u32, header: &SlotHeader) {
        let b = header.encode();
        // SAFETY: as in `read_header`, on the sender's side: the slot is the sender's until it
        // advances `tail` past `step`.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.slot_ptr(step), b.len()) };
    }

    /// The payload of the slot of `step`, `len` bytes.
    ///
    /// # Safety
    /// The caller must hold the slot under the credit protocol (a sender between a credit for
    /// `step` and its post; a receiver between seeing `tail > step` and its release) and give
    /// the returned slice a lifetime no longer than that, and `len <= slot_bytes`.
    unsafe fn payload(&mut self, step: u32, len: usize) -> &mut [u8] {
        // SAFETY: per the function contract the slot is exclusively ours for the slice's
        // lifetime (a peer breaking the protocol can only change byte values, which are valid
        // for `u8`; no decision is taken on payload bytes), and it lies inside the mapping.
        unsafe { core::slice::from_raw_parts_mut(self.slot_ptr(step).add(SlotHeader::LEN), len) }
    }
}

fn wait_error(end: WaitEnd, peer: usize, channel: usize, waiting_for: WaitFor) -> TransportError {
    match end {
        WaitEnd::Timeout(d) => TransportError::Timeout {
            peer,
            channel,
            waiting_for,
            after_ms: d.as_millis(),
        },
        WaitEnd::Died(pid) => TransportError::PeerDied { peer, pid },
        WaitEnd::Aborted(abort) => TransportError::PeerAborted { peer, abort },
    }
}

/// Sending end of one shared-memory ring.
struct ShmSend {
    ring: Ring,
    rank: usize,
    peer: usize,
    channel: usize,
    /// Next step to post.
    step: u32,
    /// Last `head` seen.
    head_seen: u32,
    /// A slot was granted by `wait_slot` and not yet posted.
    slot_held: bool,
    aborted: bool,
    liveness: Arc<Liveness>,
    policy: WaitPolicy,
}

impl ShmSend {
    /// Waits until fewer than `limit` steps are outstanding.
    fn wait_outstanding_below(
        &mut self,
        limit: u32,
        timeout: Duration,
        waiting_for: WaitFor,
    ) -> Result<(), TransportError> {
        if self.step.wrapping_sub(self.head_seen) < limit {
            return Ok(());
        }
        let ctrl = self.ring.ctrl();
        let (step, nslots) = (self.step, self.ring.nslots);
        let waiter = Waiter {
            word: &ctrl.head,
            waiting: &ctrl.send_waiting,
            peer_abort: &ctrl.receiver_abort,
            liveness: &self.liveness,
            policy: self.policy,
        };
        let head = waiter
            .wait(timeout, || {
                // Acquire: see module docs (write-after-read race on the slot).
                let head = ctrl.head.load(Ordering::Acquire);
                let outstanding = step.wrapping_sub(head);
                (outstanding < limit || outstanding > nslots).then_some(head)
            })
            .map_err(|e| wait_error(e, self.peer, self.channel, waiting_for))?;
        if step.wrapping_sub(head) > nslots {
            return Err(TransportError::Protocol {
                peer: self.peer,
                channel: self.channel,
                what: format!("credit for step {head} but only {step} steps were posted"),
            });
        }
        self.head_seen = head;
        Ok(())
    }
}

impl SendConnector for ShmSend {
    fn peer(&self) -> usize {
        self.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    fn wait_slot(&mut self, timeout: Duration) -> Result<&mut [u8], TransportError> {
        if !self.slot_held {
            self.wait_outstanding_below(self.ring.nslots, timeout, WaitFor::Credit)?;
            self.slot_held = true;
        }
        // SAFETY: the slot of `step` is ours: fewer than `nslots` steps are outstanding, so the
        // receiver released step `step - nslots`, the last user of this slot. The slice borrows
        // `self` mutably, so it ends before `post` can hand the slot over.
        Ok(unsafe { self.ring.payload(self.step, self.ring.slot_bytes) })
    }

    fn post(&mut self, len: usize, chunk: u16, desc: &OpDesc) -> Result<(), TransportError> {
        if !self.slot_held {
            return Err(TransportError::Usage {
                peer: self.peer,
                what: "post without a slot from wait_slot",
            });
        }
        if len > self.ring.slot_bytes {
            return Err(TransportError::Usage {
                peer: self.peer,
                what: "post longer than a slot",
            });
        }
        let header = SlotHeader {
            len: len as u32,
            imm: Imm {
                step: self.step as u16,
                chunk,
            },
            desc: *desc,
        };
        self.ring.write_header(self.step, &header);
        self.step = self.step.wrapping_add(1);
        self.slot_held = false;
        let ctrl = self.ring.ctrl();
        // Release: see module docs (read-after-write race on the slot).
        ctrl.tail.store(self.step, Ordering::Release);
        notify(&ctrl.tail, &ctrl.recv_waiting);
        Ok(())
    }

    fn drain(&mut self, timeout: Duration) -> Result<(), TransportError> {
        self.wait_outstanding_below(1, timeout, WaitFor::Drain)
    }

    fn abort(&mut self, abort: Abort) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        let ctrl = self.ring.ctrl();
        // Release: see module docs (abort words).
        ctrl.sender_abort.store(abort.to_word(), Ordering::Release);
        sys::futex_wake(&ctrl.tail);
    }
}

impl Drop for ShmSend {
    fn drop(&mut self) {
        let origin = self.rank;
        self.abort(Abort {
            origin,
            reason: AbortReason::Closed,
        });
    }
}

/// Receiving end of one shared-memory ring.
struct ShmRecv {
    ring: Ring,
    rank: usize,
    peer: usize,
    channel: usize,
    /// Next step to receive.
    step: u32,
    /// Last `tail` seen.
    tail_seen: u32,
    /// The header of the chunk returned by `wait` and not yet released.
    held: Option<SlotHeader>,
    aborted: bool,
    liveness: Arc<Liveness>,
    policy: WaitPolicy,
}

impl RecvConnector for ShmRecv {
    fn peer(&self) -> usize {
        self.peer
    }

    fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    fn wait(&mut self, timeout: Duration) -> Result<RecvChunk<'_>, TransportError> {
        let header = match self.held {
            Some(h) => h,
            None => {
                if self.tail_seen == self.step {
                    let ctrl = self.ring.ctrl();
                    let step = self.step;
                    let waiter = Waiter {
                        word: &ctrl.tail,
                        waiting: &ctrl.recv_waiting,
                        peer_abort: &ctrl.sender_abort,
                        liveness: &self.liveness,
                        policy: self.policy,
                    };
                    let tail = waiter
                        .wait(timeout, || {
                            // Acquire: see module docs (read-after-write race on the slot).
                            let tail = ctrl.tail.load(Ordering::Acquire);
                            (tail != step).then_some(tail)
                        })
                        .map_err(|e| wait_error(e, self.peer, self.channel, WaitFor::Data))?;
                    if tail.wrapping_sub(step) > self.ring.nslots {
                        return Err(TransportError::Protocol {
                            peer: self.peer,
                            channel: self.channel,
                            what: format!(
                                "{} steps posted ahead of step {step}, more than the {} slots",
                                tail.wrapping_sub(step),
                                self.ring.nslots
                            ),
                        });
                    }
                    self.tail_seen = tail;
                }
                let h = self.ring.read_header(self.step);
                if h.imm.step != self.step as u16 {
                    return Err(TransportError::Protocol {
                        peer: self.peer,
                        channel: self.channel,
                        what: format!(
                            "immediate carries step {} where step {} was expected",
                            h.imm.step, self.step as u16
                        ),
                    });
                }
                if h.len as usize > self.ring.slot_bytes {
                    return Err(TransportError::Protocol {
                        peer: self.peer,
                        channel: self.channel,
                        what: format!(
                            "payload of {} bytes in a slot of {} bytes",
                            h.len, self.ring.slot_bytes
                        ),
                    });
                }
                self.held = Some(h);
                h
            }
        };
        // SAFETY: `tail > step` was observed with Acquire, so the slot holds a posted step that
        // the sender will not overwrite before our release; `len` was checked against the slot
        // size; the slice borrows `self`, so it ends before `release`.
        let data = unsafe { self.ring.payload(self.step, header.len as usize) };
        Ok(RecvChunk {
            imm: header.imm,
            desc: header.desc,
            data,
        })
    }

    fn release(&mut self) -> Result<(), TransportError> {
        if self.held.take().is_none() {
            return Err(TransportError::Usage {
                peer: self.peer,
                what: "release without a chunk from wait",
            });
        }
        self.step = self.step.wrapping_add(1);
        let ctrl = self.ring.ctrl();
        // Release: see module docs (write-after-read race on the slot).
        ctrl.head.store(self.step, Ordering::Release);
        notify(&ctrl.head, &ctrl.send_waiting);
        Ok(())
    }

    fn abort(&mut self, abort: Abort) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        let ctrl = self.ring.ctrl();
        // Release: see module docs (abort words).
        ctrl.receiver_abort
            .store(abort.to_word(), Ordering::Release);
        sys::futex_wake(&ctrl.head);
    }
}

impl Drop for ShmRecv {
    fn drop(&mut self) {
        let origin = self.rank;
        self.abort(Abort {
            origin,
            reason: AbortReason::Closed,
        });
    }
}

/// The shared-memory transport ([`TransportKind::Shm`]) or its in-process variant
/// ([`TransportKind::InProcess`]).
pub struct ShmTransport {
    namespace: Namespace,
    own: Option<OwnedSegment>,
}

impl ShmTransport {
    /// Shared memory between processes of one host.
    pub fn new() -> Self {
        ShmTransport {
            namespace: Namespace::Posix,
            own: None,
        }
    }

    /// Anonymous memory between threads of one process.
    pub fn in_process() -> Self {
        ShmTransport {
            namespace: Namespace::Process,
            own: None,
        }
    }

    fn open_peer(
        &self,
        ctx: &SetupContext<'_>,
        peer: usize,
        info: &[u8],
    ) -> Result<Arc<Mapping>, TransportError> {
        let bad = |what: String| TransportError::BadInfo { peer, what };
        let mut r = Reader::new(info);
        let name = r.str("segment name").map_err(|e| bad(e.to_string()))?;
        let bytes = r.u64("segment size").map_err(|e| bad(e.to_string()))? as usize;
        let layout = Layout::from_ctx(ctx);
        if bytes != layout.segment_bytes() {
            return Err(bad(format!(
                "segment {name} has {bytes} bytes, this rank's geometry needs {}",
                layout.segment_bytes()
            )));
        }
        let mapping = match self.namespace {
            Namespace::Posix => {
                let file =
                    sys::shm_open_existing(&name).map_err(|source| TransportError::Setup {
                        peer: Some(peer),
                        op: "shm_open",
                        on: name.clone(),
                        source,
                    })?;
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if len < bytes as u64 {
                    return Err(bad(format!(
                        "segment {name} is {len} bytes, {bytes} announced"
                    )));
                }
                let map = MmapOptions::new()
                    .len(bytes)
                    .map_raw(&file)
                    .map_err(|source| TransportError::Setup {
                        peer: Some(peer),
                        op: "mmap",
                        on: name.clone(),
                        source,
                    })?;
                Arc::new(Mapping { map })
            }
            Namespace::Process => process_segments().get(&name).cloned().ok_or_else(|| {
                bad(format!(
                    "no in-process segment {name} (is the peer in another process?)"
                ))
            })?,
        };
        if mapping.len() < bytes {
            return Err(bad(format!(
                "segment {name} maps only {} bytes",
                mapping.len()
            )));
        }
        let mut header = [0u8; 40];
        // SAFETY: the mapping holds at least SEGMENT_HEADER_BYTES; the header was written by its
        // owner before its name was published and is never written again.
        unsafe {
            core::ptr::copy_nonoverlapping(mapping.base(), header.as_mut_ptr(), header.len())
        };
        if header != layout.encode_header(peer) {
            return Err(bad(format!(
                "segment {name} header does not match (owner, geometry or version differ)"
            )));
        }
        Ok(mapping)
    }
}

impl Default for ShmTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        match self.namespace {
            Namespace::Posix => TransportKind::Shm,
            Namespace::Process => TransportKind::InProcess,
        }
    }

    fn setup(
        &mut self,
        ctx: &SetupContext<'_>,
        peers: &[usize],
    ) -> Result<Vec<u8>, TransportError> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let layout = Layout::from_ctx(ctx);
        // The tag names the communicator without showing its magic, the rendezvous secret, to
        // everyone who can list /dev/shm.
        let tag = crate::bootstrap::secret::public_tag(ctx.tag);
        let name = format!("/coll-{tag:016x}-{}-{}", ctx.rank, sys::getpid());
        let seg = OwnedSegment::create(name, self.namespace, layout.segment_bytes())?;
        let header = layout.encode_header(ctx.rank);
        // SAFETY: the fresh mapping is at least SEGMENT_HEADER_BYTES long and no peer knows its
        // name yet, so nothing else accesses it.
        unsafe {
            core::ptr::copy_nonoverlapping(header.as_ptr(), seg.mapping.base(), header.len())
        };
        let mut w = Writer::default();
        w.str(&seg.name).u64(layout.segment_bytes() as u64);
        self.own = Some(seg);
        Ok(w.buf)
    }

    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        peers: &[usize],
        infos: &[Vec<u8>],
    ) -> Result<Vec<PeerConnectors>, TransportError> {
        let layout = Layout::from_ctx(ctx);
        let mut out = Vec::with_capacity(peers.len());
        for &peer in peers {
            let own = match &self.own {
                Some(seg) => seg.mapping.clone(),
                None => {
                    return Err(TransportError::BadInfo {
                        peer,
                        what: "connect before setup".into(),
                    })
                }
            };
            let info = infos.get(peer).map(Vec::as_slice).unwrap_or(&[]);
            let theirs = self.open_peer(ctx, peer, info)?;
            let pid = ctx.cards.get(peer).map_or(0, |c| c.pid);
            let liveness = Arc::new(Liveness::watch(pid));
            let mut send: Vec<Box<dyn SendConnector>> = Vec::with_capacity(ctx.nchannels);
            let mut recv: Vec<Box<dyn RecvConnector>> = Vec::with_capacity(ctx.nchannels);
            for channel in 0..ctx.nchannels {
                send.push(Box::new(ShmSend {
                    ring: Ring::new(theirs.clone(), &layout, ctx.rank, channel),
                    rank: ctx.rank,
                    peer,
                    channel,
                    step: 0,
                    head_seen: 0,
                    slot_held: false,
                    aborted: false,
                    liveness: liveness.clone(),
                    policy: ctx.wait,
                }));
                recv.push(Box::new(ShmRecv {
                    ring: Ring::new(own.clone(), &layout, peer, channel),
                    rank: ctx.rank,
                    peer,
                    channel,
                    step: 0,
                    tail_seen: 0,
                    held: None,
                    aborted: false,
                    liveness: liveness.clone(),
                    policy: ctx.wait,
                }));
            }
            out.push(PeerConnectors { peer, send, recv });
        }
        Ok(out)
    }

    fn finish(&mut self) -> Result<(), TransportError> {
        if let Some(seg) = &mut self.own {
            seg.unlink().map_err(|source| TransportError::Setup {
                peer: None,
                op: "shm_unlink",
                on: seg.name.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::BusinessCard;
    use crate::transport::CollKind;
    use crate::DataType;

    #[test]
    fn ring_ctrl_layout() {
        assert_eq!(core::mem::size_of::<RingCtrl>(), 192);
        assert_eq!(core::mem::align_of::<RingCtrl>(), 64);
        assert_eq!(core::mem::offset_of!(RingCtrl, tail), 0);
        assert_eq!(core::mem::offset_of!(RingCtrl, head), 64);
        assert_eq!(core::mem::offset_of!(RingCtrl, sender_abort), 128);
        assert_eq!(core::mem::offset_of!(RingCtrl, receiver_abort), 132);
        assert!(core::mem::size_of::<RingCtrl>() <= RING_CTRL_BYTES);
    }

    fn cards(n: usize) -> Vec<BusinessCard> {
        (0..n)
            .map(|rank| BusinessCard::local(rank, TransportKind::Auto))
            .collect()
    }

    /// Two ranks in this thread over one transport kind: rank 0 sends, rank 1 receives.
    fn pair(transport: fn() -> ShmTransport, tag: u64) -> (PeerConnectors, PeerConnectors) {
        let cards = cards(2);
        let ctx = |rank| SetupContext {
            rank,
            nranks: 2,
            nchannels: 1,
            nslots: 2,
            slot_bytes: 64,
            tag,
            cards: &cards,
            wait: WaitPolicy::OVERSUBSCRIBED,
            bootstrap_addr: None,
        };
        let (mut t0, mut t1) = (transport(), transport());
        let infos = vec![
            t0.setup(&ctx(0), &[1]).unwrap(),
            t1.setup(&ctx(1), &[0]).unwrap(),
        ];
        let c0 = t0.connect(&ctx(0), &[1], &infos).unwrap().pop().unwrap();
        let c1 = t1.connect(&ctx(1), &[0], &infos).unwrap().pop().unwrap();
        t0.finish().unwrap();
        t1.finish().unwrap();
        (c0, c1)
    }

    fn desc() -> OpDesc {
        OpDesc::new(0, CollKind::Broadcast, DataType::U8, None, Some(0), 5)
    }

    #[test]
    fn credits_bound_the_sender_and_data_flows_in_order() {
        for (transport, tag) in [
            (ShmTransport::new as fn() -> ShmTransport, 0x5eed_0001),
            (
                ShmTransport::in_process as fn() -> ShmTransport,
                0x5eed_0002,
            ),
        ] {
            let (mut a, mut b) = pair(transport, tag);
            let t = Duration::from_millis(20);
            for k in 0..2u8 {
                let slot = a.send[0].wait_slot(t).unwrap();
                slot[..3].copy_from_slice(&[k, k, k]);
                a.send[0].post(3, k as u16, &desc()).unwrap();
            }
            // Two slots, two posts, no release: the third step has no credit.
            let e = a.send[0].wait_slot(t).unwrap_err();
            assert!(matches!(
                e,
                TransportError::Timeout {
                    peer: 1,
                    waiting_for: WaitFor::Credit,
                    ..
                }
            ));
            for k in 0..2u8 {
                let c = b.recv[0].wait(t).unwrap();
                assert_eq!(c.data, &[k, k, k]);
                assert_eq!(
                    c.imm,
                    Imm {
                        step: k as u16,
                        chunk: k as u16
                    }
                );
                assert_eq!(c.desc, desc());
                b.recv[0].release().unwrap();
            }
            assert!(b.recv[0].release().is_err(), "nothing held");
            a.send[0].drain(t).unwrap();
            // Closing the receiver ends the sender's wait with an error naming it.
            drop(b);
            a.send[0].wait_slot(t).unwrap();
            a.send[0].post(0, 2, &desc()).unwrap();
            a.send[0].wait_slot(t).unwrap();
            a.send[0].post(0, 3, &desc()).unwrap();
            let e = a.send[0].wait_slot(t).unwrap_err();
            assert!(
                matches!(e, TransportError::PeerAborted { peer: 1, abort } if abort.reason == AbortReason::Closed),
                "{e}"
            );
        }
    }

    #[test]
    fn data_posted_before_close_is_still_delivered() {
        let (mut a, mut b) = pair(ShmTransport::in_process, 0x5eed_0003);
        let t = Duration::from_millis(20);
        a.send[0].wait_slot(t).unwrap()[0] = 42;
        a.send[0].post(1, 0, &desc()).unwrap();
        drop(a);
        assert_eq!(b.recv[0].wait(t).unwrap().data, &[42]);
        b.recv[0].release().unwrap();
        let e = b.recv[0].wait(t).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerAborted { peer: 0, .. }),
            "{e}"
        );
    }

    /// A sender and a receiver over one anonymous ring, plus a third handle on the ring to play
    /// a hostile peer with.
    fn manual_pair() -> (ShmSend, ShmRecv, Ring) {
        let layout = Layout {
            nranks: 2,
            nchannels: 1,
            nslots: 2,
            slot_bytes: 64,
        };
        let mapping = Arc::new(Mapping {
            map: MmapRaw::from(
                MmapOptions::new()
                    .len(layout.segment_bytes())
                    .map_anon()
                    .unwrap(),
            ),
        });
        let live = Arc::new(Liveness::SameProcess);
        let send = ShmSend {
            ring: Ring::new(mapping.clone(), &layout, 0, 0),
            rank: 0,
            peer: 1,
            channel: 0,
            step: 0,
            head_seen: 0,
            slot_held: false,
            aborted: false,
            liveness: live.clone(),
            policy: WaitPolicy::OVERSUBSCRIBED,
        };
        let recv = ShmRecv {
            ring: Ring::new(mapping.clone(), &layout, 0, 0),
            rank: 1,
            peer: 0,
            channel: 0,
            step: 0,
            tail_seen: 0,
            held: None,
            aborted: false,
            liveness: live,
            policy: WaitPolicy::OVERSUBSCRIBED,
        };
        (send, recv, Ring::new(mapping, &layout, 0, 0))
    }

    #[test]
    fn forged_headers_and_counters_are_protocol_errors() {
        let t = Duration::from_millis(20);
        // A length beyond the slot.
        let (mut a, mut b, ring) = manual_pair();
        a.wait_slot(t).unwrap();
        a.post(1, 0, &desc()).unwrap();
        let mut h = ring.read_header(0);
        h.len = 65;
        ring.write_header(0, &h);
        let e = b.wait(t).unwrap_err();
        assert!(matches!(e, TransportError::Protocol { peer: 0, .. }), "{e}");
        // A step out of order.
        let (mut a, mut b, ring) = manual_pair();
        a.wait_slot(t).unwrap();
        a.post(1, 0, &desc()).unwrap();
        let mut h = ring.read_header(0);
        h.imm.step = 7;
        ring.write_header(0, &h);
        let e = b.wait(t).unwrap_err();
        assert!(matches!(e, TransportError::Protocol { peer: 0, .. }), "{e}");
        // A tail that claims more steps than slots.
        let (_a, mut b, ring) = manual_pair();
        ring.ctrl().tail.store(3, Ordering::Release);
        let e = b.wait(t).unwrap_err();
        assert!(matches!(e, TransportError::Protocol { peer: 0, .. }), "{e}");
        // A credit for a step never posted.
        let (mut a, _b, ring) = manual_pair();
        for _ in 0..2 {
            a.wait_slot(t).unwrap();
            a.post(0, 0, &desc()).unwrap();
        }
        ring.ctrl().head.store(5, Ordering::Release);
        let e = a.wait_slot(t).unwrap_err();
        assert!(matches!(e, TransportError::Protocol { peer: 1, .. }), "{e}");
        // Misuse.
        let (mut a, _b, _ring) = manual_pair();
        assert!(matches!(
            a.post(0, 0, &desc()),
            Err(TransportError::Usage { .. })
        ));
        a.wait_slot(t).unwrap();
        assert!(matches!(
            a.post(65, 0, &desc()),
            Err(TransportError::Usage { .. })
        ));
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_a_sender_thread() {
        let (mut a, mut b, _ring) = manual_pair();
        let t = std::thread::spawn(move || {
            for k in 0..100u32 {
                let slot = a.wait_slot(Duration::from_secs(10)).unwrap();
                slot[..4].copy_from_slice(&k.to_ne_bytes());
                a.post(4, k as u16, &desc()).unwrap();
            }
            a.drain(Duration::from_secs(10)).unwrap();
        });
        for k in 0..100u32 {
            let c = b.wait(Duration::from_secs(10)).unwrap();
            assert_eq!(c.data, &k.to_ne_bytes());
            b.release().unwrap();
        }
        t.join().unwrap();
    }
}
