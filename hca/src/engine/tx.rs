//! Zero-copy transmit: packets described as header bytes plus payload segments that point into
//! registered memory, for links that can gather (sendmsg(2) `iovec`s, NIC descriptors).
//!
//! An HCA sends a message straight out of the memory region it was posted from: the DMA engine
//! reads the payload where the program left it (IBTA vol. 1 §10.7: the WR's local buffer is read
//! when the packet is sent, and must not change until the WR completes). The copying form,
//! [`SoftHca::poll_transmit`](super::SoftHca::poll_transmit), builds each packet into the caller's
//! buffer, copying its payload out of the MR; [`SoftHca::poll_transmit_gather`](super::SoftHca::poll_transmit_gather)
//! instead leaves the payload where it is and describes it ([`GatherTransmit`]): the headers in the
//! caller's buffer, then up to [`MAX_TX_SEGMENTS`] [`TxSegment`]s of MR memory, then a trailer with
//! the pad and the ICRC. The ICRC is computed over the bytes in place when the packet is built; a
//! link sends them right after (a program that changes a buffer of an outstanding WR gets what IBTA
//! promises then: undefined contents, here a packet the peer's ICRC check drops and RC resends).
//!
//! Only RC requests and RDMA READ responses are gathered: an RC WQE completes when acknowledged,
//! after the link sent its bytes, while a UC or UD WQE completes as soon as its last packet is
//! built, and the program may then reuse the buffer before the link reads it. Only memory the CPU
//! can address ([`gpu_p2p::Memory::host_ptr`]) is gathered; other memory (GPU device memory),
//! inline data, and payloads spread over more than [`MAX_TX_SEGMENTS`] pieces are copied into the
//! buffer as before. [`Counters::tx_gathered_pkts`](super::Counters::tx_gathered_pkts)
//! and [`Counters::tx_copied_pkts`](super::Counters::tx_copied_pkts) say which way each payload went.

use alloc::sync::Arc;

use gpu_p2p::{HostPtr, Memory};
use roce::packet::icrc_of_udp_payload_gather;
use roce::{icrc, udp};

use super::net::{ip_repr, BuildError, Route};
use super::Transmit;

/// Most payload segments of one gathered packet. A payload in more pieces (a packet that spans
/// more SGEs) is copied instead.
pub const MAX_TX_SEGMENTS: usize = 4;

/// Bytes after the payload: pad (0..=3, IBTA vol. 1 §9.2 PadCnt) and ICRC (4).
const MAX_TRAILER: usize = 3 + icrc::ICRC_LEN;

/// A run of payload bytes in registered host memory, kept alive by its own reference to the
/// memory (a concurrent `dereg_mr` cannot unmap it while a link still sends from it).
#[derive(Debug, Clone)]
pub struct TxSegment {
    memory: Arc<dyn Memory>,
    base: HostPtr,
    offset: usize,
    len: usize,
}

impl TxSegment {
    /// `len` bytes of `memory` from byte `offset`; `None` when the memory is not CPU-addressable
    /// ([`Memory::host_ptr`] is `None`) or the range exceeds it.
    pub(crate) fn new(memory: &Arc<dyn Memory>, offset: usize, len: usize) -> Option<TxSegment> {
        gpu_p2p::check_range(offset, len, memory.len()).ok()?;
        let base = memory.host_ptr()?;
        Some(TxSegment {
            memory: Arc::clone(memory),
            base,
            offset,
            len,
        })
    }

    /// The memory the bytes are in.
    pub fn memory(&self) -> &Arc<dyn Memory> {
        &self.memory
    }

    /// Offset of the first byte in [`TxSegment::memory`], bytes.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never, for segments the engine emits).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, in place: for a gather list (`IoSlice`) or a checksum. They may change while
    /// borrowed (the program or a peer writes the memory); see [`gpu_p2p::HostPtr`].
    pub fn bytes(&self) -> &[u8] {
        super::sys::host_bytes(&*self.memory, self.base, self.offset, self.len)
    }
}

/// A packet built by [`SoftHca::poll_transmit_gather`](super::SoftHca::poll_transmit_gather): its
/// UDP payload is, in this order, the first [`GatherTransmit::head_len`] bytes of the caller's
/// buffer, the bytes of each of [`GatherTransmit::segments`], and [`GatherTransmit::trailer`];
/// [`Transmit::len`] is their total. The IP and UDP headers are as for
/// [`Transmit`].
#[derive(Debug, Clone)]
pub struct GatherTransmit {
    /// Addresses, marks and the total UDP payload length.
    pub transmit: Transmit,
    head_len: usize,
    segments: [Option<TxSegment>; MAX_TX_SEGMENTS],
    trailer: [u8; MAX_TRAILER],
    trailer_len: u8,
    /// The IPv4 identification the ICRC is computed for ([`IPV4_IDENT`](super::IPV4_IDENT) when
    /// built, then what [`GatherTransmit::reseal_ipv4`] last set).
    ident: u16,
}

impl GatherTransmit {
    /// Bytes at the start of the caller's buffer that begin the UDP payload: the transport
    /// headers, or the whole packet when its payload was copied.
    pub fn head_len(&self) -> usize {
        self.head_len
    }

    /// The payload segments in MR memory, in wire order (none when the payload was copied).
    pub fn segments(&self) -> impl Iterator<Item = &TxSegment> + '_ {
        self.segments.iter().flatten()
    }

    /// Number of [`GatherTransmit::segments`].
    pub fn segment_count(&self) -> usize {
        self.segments.iter().flatten().count()
    }

    /// Pad bytes and ICRC after the segments (empty when the payload was copied: they are then
    /// in the buffer).
    pub fn trailer(&self) -> &[u8] {
        &self.trailer[..usize::from(self.trailer_len)]
    }

    /// Updates the ICRC for IPv4 identification `ident` instead of the one it was computed for
    /// (the [`IPV4_IDENT`](super::IPV4_IDENT) it was built for, or the last `ident` given): a link
    /// whose kernel numbers the segments of a UDP GSO train 0, 1, 2, ... (the ICRC covers the
    /// identification, IBTA vol. 1 Annex A17.3.3) calls it for the packets that leave as later
    /// segments. `head` is the caller's buffer the packet was built in. Does nothing for IPv6
    /// packets or when `head` is shorter than [`GatherTransmit::head_len`].
    ///
    /// No pass over the packet: the CRC is linear, so the new ICRC is the old one XOR the
    /// contribution of the identification's change, which depends only on the packet's length
    /// ([`roce::icrc::reseal_ipv4_ident`], one multiplication modulo the CRC polynomial). Before
    /// issue 21 this recomputed the ICRC over the payload: a second CRC pass over every byte that
    /// left as a train's later segment, as many instructions as the receiver's ICRC check
    /// (callgrind, README "Figures", issue 21). The ICRC stays the one computed over the payload
    /// when the packet was built.
    pub fn reseal_ipv4(&mut self, head: &mut [u8], ident: u16) {
        let t = self.transmit;
        if !t.src_ip.is_ipv4() || ident == self.ident {
            return;
        }
        let Some(head) = head.get_mut(..self.head_len) else {
            return;
        };
        // The ICRC field: the last 4 bytes of the packet, in the trailer or (payload copied) in
        // `head`.
        let field = if self.trailer_len == 0 {
            head.len()
                .checked_sub(icrc::ICRC_LEN)
                .and_then(|at| head.get_mut(at..))
        } else {
            let end = usize::from(self.trailer_len);
            self.trailer.get_mut(end - icrc::ICRC_LEN..end)
        };
        let Some(field) = field else {
            return;
        };
        let Ok(wire) = <[u8; icrc::ICRC_LEN]>::try_from(&*field) else {
            return;
        };
        // `ip_repr` builds the 20-byte IPv4 header without options, as the kernel sends it.
        let total_len = roce::ipv4::HEADER_LEN + udp::HEADER_LEN + t.len;
        let Some(crc) =
            icrc::reseal_ipv4_ident(total_len, self.ident, ident, icrc::from_wire(wire))
        else {
            return;
        };
        field.copy_from_slice(&icrc::to_wire(crc));
        self.ident = ident;
    }
}

/// The ICRC of headers + segments + pad.
fn gather_icrc(
    ip: &roce::packet::IpRepr,
    udp: &udp::Repr,
    headers: &[u8],
    segments: &[Option<TxSegment>; MAX_TX_SEGMENTS],
    pad: &[u8],
) -> Option<u32> {
    let mut rest: [&[u8]; MAX_TX_SEGMENTS + 1] = [&[]; MAX_TX_SEGMENTS + 1];
    let mut n = 0;
    for s in segments.iter().flatten() {
        rest[n] = s.bytes();
        n += 1;
    }
    rest[n] = pad;
    icrc_of_udp_payload_gather(ip, udp, headers, &rest[..=n]).ok()
}

/// Where the engine builds one packet: the caller's buffer, and in gather mode the segments and
/// trailer of the packet last built.
pub(crate) struct TxOut<'a> {
    pub(crate) buf: &'a mut [u8],
    /// The caller can gather: payloads in host memory become segments.
    pub(crate) gather: bool,
    segments: [Option<TxSegment>; MAX_TX_SEGMENTS],
    trailer: [u8; MAX_TRAILER],
    trailer_len: u8,
    head_len: usize,
}

impl<'a> TxOut<'a> {
    pub(crate) fn new(buf: &'a mut [u8], gather: bool) -> TxOut<'a> {
        TxOut {
            buf,
            gather,
            segments: Default::default(),
            trailer: [0; MAX_TRAILER],
            trailer_len: 0,
            head_len: 0,
        }
    }

    /// Forgets the segments of an earlier attempt.
    pub(crate) fn reset(&mut self) {
        self.segments = Default::default();
        self.trailer_len = 0;
        self.head_len = 0;
    }

    /// Adds a segment; false when the packet already has [`MAX_TX_SEGMENTS`] or the memory
    /// cannot be gathered (the caller then copies the whole payload).
    pub(crate) fn push_segment(
        &mut self,
        memory: &Arc<dyn Memory>,
        offset: usize,
        len: usize,
    ) -> bool {
        let Some(slot) = self.segments.iter_mut().find(|s| s.is_none()) else {
            return false;
        };
        match TxSegment::new(memory, offset, len) {
            Some(seg) => {
                *slot = Some(seg);
                true
            }
            None => false,
        }
    }

    /// A packet whose bytes are all in the buffer (`len` of them) was built.
    pub(crate) fn built_in_buffer(&mut self, len: usize) {
        self.segments = Default::default();
        self.trailer_len = 0;
        self.head_len = len;
    }

    /// Seals a packet whose headers (`header_len` bytes) are in the buffer and whose
    /// `payload_len` payload bytes are the segments: pad and ICRC go to the trailer. Returns the
    /// UDP payload length.
    pub(crate) fn seal_gathered(
        &mut self,
        header_len: usize,
        payload_len: usize,
        route: &Route,
    ) -> Result<usize, BuildError> {
        let pad = usize::from(roce::mtu::pad_cnt(payload_len));
        let total = header_len + payload_len + pad + icrc::ICRC_LEN;
        let headers = self
            .buf
            .get(..header_len)
            .ok_or(BuildError::BufferTooSmall)?;
        let ip = ip_repr(
            route.src_ip,
            route.dst_ip,
            route.hop_limit,
            route.dscp,
            route.ecn,
            super::IPV4_IDENT,
        )
        .ok_or(BuildError::Headers)?;
        let udp = udp::Repr {
            src_port: route.src_port,
            dst_port: udp::ROCEV2_PORT,
            payload_len: total,
        };
        self.trailer = [0; MAX_TRAILER];
        let crc = gather_icrc(&ip, &udp, headers, &self.segments, &self.trailer[..pad])
            .ok_or(BuildError::Headers)?;
        self.trailer[pad..pad + icrc::ICRC_LEN].copy_from_slice(&icrc::to_wire(crc));
        self.trailer_len = (pad + icrc::ICRC_LEN) as u8;
        self.head_len = header_len;
        Ok(total)
    }

    /// The description of the packet last built, for `transmit`.
    pub(crate) fn take(&mut self, transmit: Transmit) -> GatherTransmit {
        GatherTransmit {
            transmit,
            head_len: self.head_len,
            segments: core::mem::take(&mut self.segments),
            trailer: self.trailer,
            trailer_len: self.trailer_len,
            ident: super::IPV4_IDENT,
        }
    }
}
