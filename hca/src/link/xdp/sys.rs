//! System calls of the AF_XDP link, the only `unsafe` code of [`super`]: the AF_XDP socket
//! (socket(2), setsockopt(2) / getsockopt(2) with `SOL_XDP`, bind(2) to an interface queue), the
//! UMEM and the four rings mmap(2)ed from it, the producer / consumer protocol of those rings
//! (the kernel's Documentation/networking/af_xdp.rst: the producer writes descriptors, then
//! stores its index with release ordering; the consumer loads that index with acquire ordering,
//! reads, then stores its own index with release ordering), the wake-ups of
//! `XDP_USE_NEED_WAKEUP` (sendto(2) for TX, recvfrom(2) for the fill ring) and poll(2).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// A memory mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&self` /
// `&mut self` of its owners (and the kernel, by the ring protocol).
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access only reads or uses atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(len: usize, flags: libc::c_int, fd: libc::c_int, offset: u64) -> io::Result<Mapping> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping at an address the kernel picks; nothing aliases it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are a mapping this value made and nothing references it any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One of the four rings: its mapping, the producer / consumer / flags words and the
/// descriptor array (`size` entries of `D`), with this side's cached indexes.
#[derive(Debug)]
struct Ring<D> {
    map: Mapping,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
    _desc: std::marker::PhantomData<D>,
}

impl<D: Copy> Ring<D> {
    fn new(fd: &OwnedFd, off: &libc::xdp_ring_offset, size: u32, pgoff: u64) -> io::Result<Self> {
        let desc = usize::try_from(off.desc).map_err(io::Error::other)?;
        let len = desc + size as usize * std::mem::size_of::<D>();
        let map = Mapping::map(
            len,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            pgoff,
        )?;
        let word = |o: u64| -> io::Result<usize> {
            let o = usize::try_from(o).map_err(io::Error::other)?;
            if o + 4 > len || o % 4 != 0 {
                return Err(io::Error::other("ring offset outside its mapping"));
            }
            Ok(o)
        };
        let mut ring = Ring {
            producer: word(off.producer)?,
            consumer: word(off.consumer)?,
            flags: word(off.flags)?,
            desc,
            map,
            size,
            cached_prod: 0,
            cached_cons: 0,
            _desc: std::marker::PhantomData,
        };
        ring.cached_prod = ring.word(ring.producer).load(Ordering::Acquire);
        ring.cached_cons = ring.word(ring.consumer).load(Ordering::Acquire);
        Ok(ring)
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` was checked to be a 4-aligned offset inside the live mapping (page
        // aligned), which the kernel shares with this process as an u32 it accesses atomically.
        unsafe { &*self.map.ptr.as_ptr().add(at).cast::<AtomicU32>() }
    }

    fn slot(&self, index: u32) -> *mut D {
        let i = (index & (self.size - 1)) as usize;
        // SAFETY: i < size, and the mapping holds `size` descriptors from `desc`.
        unsafe { self.map.ptr.as_ptr().add(self.desc).cast::<D>().add(i) }
    }

    /// Producer side: free slots.
    fn free(&mut self) -> u32 {
        self.cached_cons = self.word(self.consumer).load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Producer side: writes `d` at the next slot (the caller checked [`Ring::free`]).
    fn push(&mut self, d: D) {
        // SAFETY: the slot is inside the ring and not owned by the kernel (free() > 0: the
        // consumer is past it); D is plain data.
        unsafe { self.slot(self.cached_prod).write_volatile(d) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
    }

    /// Producer side: hands the pushed slots to the kernel.
    fn publish(&self) {
        self.word(self.producer)
            .store(self.cached_prod, Ordering::Release);
    }

    /// Consumer side: entries the kernel produced that this side has not released.
    fn available(&mut self) -> u32 {
        self.cached_prod = self.word(self.producer).load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Consumer side: entry `i` of those [`Ring::available`] counted.
    fn peek(&self, i: u32) -> D {
        // SAFETY: the slot is inside the ring and owned by this side until released (the
        // acquire load of the producer index ordered the kernel's write before this read).
        unsafe { self.slot(self.cached_cons.wrapping_add(i)).read_volatile() }
    }

    /// Consumer side: gives `n` entries back to the kernel.
    fn release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.word(self.consumer)
            .store(self.cached_cons, Ordering::Release);
    }

    fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The socket's bind mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BindMode {
    /// The driver DMAs straight into the UMEM (`XDP_ZEROCOPY`).
    ZeroCopy,
    /// The kernel copies frames between its buffers and the UMEM (`XDP_COPY`).
    Copy,
}

/// Counters the kernel keeps for the socket (`XDP_STATISTICS`, if_xdp.h).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KernelStats {
    pub(crate) rx_dropped: u64,
    pub(crate) rx_invalid_descs: u64,
    pub(crate) tx_invalid_descs: u64,
    pub(crate) rx_ring_full: u64,
    pub(crate) rx_fill_ring_empty_descs: u64,
    pub(crate) tx_ring_empty_descs: u64,
}

/// The UMEM: one anonymous mapping registered with the socket (`XDP_UMEM_REG`), in chunks of
/// `chunk` bytes. Shared (`Arc`) by the socket and the MR memory handed out of it, so it is
/// unmapped only when the last of them is gone.
#[derive(Debug)]
pub(crate) struct Umem {
    map: Mapping,
    chunk: usize,
}

impl Umem {
    /// The address of byte 0.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.map.ptr
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// Bytes of one chunk.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// The UMEM address (offset) of `len` bytes at CPU address `ptr`, when they lie inside it.
    pub(crate) fn addr_of(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let off = (ptr as usize).checked_sub(self.map.ptr.as_ptr() as usize)?;
        (off.checked_add(len)? <= self.map.len).then_some(off as u64)
    }
}

/// Retries of a bind(2) that found the queue busy.
const BUSY_RETRIES: u32 = 150;
/// Wait between those retries (so at most 3 s in all).
const BUSY_RETRY_WAIT: Duration = Duration::from_millis(20);

/// An AF_XDP socket bound to one queue of one interface, with its UMEM and rings.
#[derive(Debug)]
pub(crate) struct Xsk {
    // Rings and UMEM are unmapped before the socket closes (field order).
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    umem: Arc<Umem>,
    frame_size: usize,
    mode: BindMode,
    /// Bound with `XDP_USE_SG`: a packet may span several descriptors (`XDP_PKT_CONTD`).
    multi_buffer: bool,
    fd: OwnedFd,
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: v is a live T of size_of::<T>() bytes the kernel only reads.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
}

impl Xsk {
    /// socket(AF_XDP), a UMEM of `frames` frames of `frame_size` bytes, rings of `ring_size`
    /// entries (a power of two), bound to `queue` of interface `ifindex` with
    /// `XDP_USE_NEED_WAKEUP`, zero-copy when the driver has it (and `zero_copy`), else copy, and
    /// multi-buffer (`XDP_USE_SG`, Linux >= 6.6) where the kernel and driver take it.
    /// `what` names the failed step.
    pub(crate) fn open(
        ifindex: u32,
        queue: u32,
        frames: usize,
        frame_size: usize,
        ring_size: u32,
        zero_copy: bool,
    ) -> Result<Xsk, (&'static str, io::Error)> {
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(("socket(AF_XDP)", last_error()));
        }
        // SAFETY: raw is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = frames * frame_size;
        let umem = Arc::new(Umem {
            map: Mapping::map(
                len,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
            .map_err(|e| ("mmap of the UMEM", e))?,
            chunk: frame_size,
        });
        let reg = libc::xdp_umem_reg {
            addr: umem.base().as_ptr() as u64,
            len: len as u64,
            chunk_size: frame_size as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(&fd, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
            .map_err(|e| ("XDP_UMEM_REG", e))?;
        for (name, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            setsockopt(&fd, libc::SOL_XDP, name, &ring_size).map_err(|e| (what, e))?;
        }
        // SAFETY: an all-zero xdp_mmap_offsets is a valid value (plain integers).
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off is a live buffer of optlen bytes the kernel writes into.
        check(unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        })
        .map_err(|e| ("XDP_MMAP_OFFSETS", e))?;
        if optlen as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            return Err((
                "XDP_MMAP_OFFSETS",
                io::Error::other("kernel without ring flags (Linux < 5.4)"),
            ));
        }
        let fill = Ring::new(&fd, &off.fr, ring_size, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(|e| ("mmap of the fill ring", e))?;
        let comp = Ring::new(
            &fd,
            &off.cr,
            ring_size,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )
        .map_err(|e| ("mmap of the completion ring", e))?;
        let rx = Ring::new(&fd, &off.rx, ring_size, libc::XDP_PGOFF_RX_RING as u64)
            .map_err(|e| ("mmap of the RX ring", e))?;
        let tx = Ring::new(&fd, &off.tx, ring_size, libc::XDP_PGOFF_TX_RING as u64)
            .map_err(|e| ("mmap of the TX ring", e))?;
        let bind = |flags: u16| {
            let sa = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: flags | libc::XDP_USE_NEED_WAKEUP,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: sa is a live sockaddr_xdp of the length passed.
            check(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            })
        };
        // A socket closed just before (the previous run on this queue) leaves the queue busy
        // until the kernel's deferred teardown of its buffer pool ran: EBUSY is retried for up to
        // BUSY_RETRIES x BUSY_RETRY_WAIT, then reported.
        // Binds are tried from the most capable down: zero-copy (if asked) before copy,
        // multi-buffer before single-buffer (EINVAL before Linux 6.6, EOPNOTSUPP for a
        // zero-copy driver without it).
        let mut attempts = Vec::with_capacity(4);
        if zero_copy {
            attempts.push((libc::XDP_ZEROCOPY, true));
            attempts.push((libc::XDP_ZEROCOPY, false));
        }
        attempts.push((libc::XDP_COPY, true));
        attempts.push((libc::XDP_COPY, false));
        let mut tries = 0;
        let (mode, multi_buffer) = 'bound: loop {
            let mut busy = false;
            let mut last = None;
            for &(copy_flag, sg) in &attempts {
                let flags = copy_flag | if sg { libc::XDP_USE_SG } else { 0 };
                match bind(flags) {
                    Ok(()) => {
                        let mode = if copy_flag == libc::XDP_ZEROCOPY {
                            BindMode::ZeroCopy
                        } else {
                            BindMode::Copy
                        };
                        break 'bound (mode, sg);
                    }
                    Err(e) => {
                        busy |= e.raw_os_error() == Some(libc::EBUSY);
                        last = Some(e);
                    }
                }
            }
            if busy && tries < BUSY_RETRIES {
                tries += 1;
                std::thread::sleep(BUSY_RETRY_WAIT);
                continue;
            }
            return Err((
                "bind",
                last.unwrap_or_else(|| io::Error::other("no bind mode")),
            ));
        };
        Ok(Xsk {
            fill,
            comp,
            rx,
            tx,
            umem,
            frame_size,
            mode,
            multi_buffer,
            fd,
        })
    }

    /// Whether the socket was bound with `XDP_USE_SG` (a TX packet may be a chain of
    /// descriptors, each but the last with `XDP_PKT_CONTD`).
    pub(crate) fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// The UMEM, shared.
    pub(crate) fn umem(&self) -> &Arc<Umem> {
        &self.umem
    }

    /// How the socket was bound.
    pub(crate) fn mode(&self) -> BindMode {
        self.mode
    }

    /// Frame `addr` (a UMEM offset) for `len` bytes; `None` outside the UMEM or across a frame.
    pub(crate) fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (start, end) = self.bounds(addr, len)?;
        // SAFETY: [start, end) is inside the UMEM mapping; the frame is owned by user space (it
        // came from the RX ring and is not on the fill ring), so the kernel does not write it.
        Some(unsafe {
            std::slice::from_raw_parts(self.umem.base().as_ptr().add(start), end - start)
        })
    }

    /// `len` bytes from UMEM address `addr`, writable, across chunks; `None` outside the UMEM.
    /// For a transmit slot of several chunks, owned by user space (free list).
    pub(crate) fn region_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len)?;
        if end > self.umem.len() {
            return None;
        }
        // SAFETY: inside the mapping; the slot's chunks are owned by user space (not on the fill
        // or TX ring), and `&mut self` makes this the only reference.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.base().as_ptr().add(start), len) })
    }

    fn bounds(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len)?;
        let frame_end = (start / self.frame_size + 1) * self.frame_size;
        (end <= self.umem.len() && end <= frame_end).then_some((start, end))
    }

    /// Free slots of the fill ring.
    pub(crate) fn fill_free(&mut self) -> u32 {
        self.fill.free()
    }

    /// Puts frames on the fill ring (at most [`Xsk::fill_free`]) and publishes them.
    pub(crate) fn fill(&mut self, addrs: impl Iterator<Item = u64>) {
        for a in addrs {
            self.fill.push(a);
        }
        self.fill.publish();
    }

    /// Received frames waiting on the RX ring.
    pub(crate) fn rx_available(&mut self) -> u32 {
        self.rx.available()
    }

    /// Received frame `i` of those [`Xsk::rx_available`] counted: (UMEM address, length,
    /// whether the packet continues in the next descriptor: `XDP_PKT_CONTD`).
    pub(crate) fn rx_peek(&self, i: u32) -> (u64, u32, bool) {
        let d = self.rx.peek(i);
        (d.addr, d.len, d.options & libc::XDP_PKT_CONTD != 0)
    }

    /// Releases `n` RX entries (their frames now belong to the caller).
    pub(crate) fn rx_release(&mut self, n: u32) {
        self.rx.release(n);
    }

    /// Free slots of the TX ring.
    pub(crate) fn tx_free(&mut self) -> u32 {
        self.tx.free()
    }

    /// Descriptors on the TX ring the kernel has not taken yet.
    pub(crate) fn tx_pending(&mut self) -> u32 {
        self.tx.size - self.tx.free()
    }

    /// Queues a descriptor for sending (the caller checked [`Xsk::tx_free`]); `more`: the packet
    /// continues in the next one (`XDP_PKT_CONTD`, multi-buffer sockets only).
    /// [`Xsk::tx_publish`] hands them over.
    pub(crate) fn tx_push(&mut self, addr: u64, len: u32, more: bool) {
        self.tx.push(libc::xdp_desc {
            addr,
            len,
            options: if more { libc::XDP_PKT_CONTD } else { 0 },
        });
    }

    /// Publishes the pushed TX entries.
    pub(crate) fn tx_publish(&self) {
        self.tx.publish();
    }

    /// Completed TX frames: their count, read with [`Xsk::comp_peek`], given back with
    /// [`Xsk::comp_release`].
    pub(crate) fn comp_available(&mut self) -> u32 {
        self.comp.available()
    }

    /// Completed frame `i`.
    pub(crate) fn comp_peek(&self, i: u32) -> u64 {
        self.comp.peek(i)
    }

    /// Releases `n` completion entries.
    pub(crate) fn comp_release(&mut self, n: u32) {
        self.comp.release(n);
    }

    /// Whether the kernel asks for a sendto(2) to process the TX ring.
    pub(crate) fn tx_needs_wakeup(&self) -> bool {
        self.tx.needs_wakeup()
    }

    /// Whether the kernel asks for a wake-up to process the fill ring.
    pub(crate) fn fill_needs_wakeup(&self) -> bool {
        self.fill.needs_wakeup()
    }

    /// sendto(2) with no data: the kernel sends what the TX ring holds. `EAGAIN`, `EBUSY` and
    /// `ENOBUFS` are transient (the ring is retried at the next flush) and give `Ok(false)`.
    pub(crate) fn kick_tx(&self) -> io::Result<bool> {
        // SAFETY: no buffer is passed.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if rc >= 0 {
            return Ok(true);
        }
        let e = last_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(false),
            _ => Err(e),
        }
    }

    /// recvfrom(2) with no buffer: the driver refills from the fill ring (and, with busy
    /// polling, polls the queue). Transient errors are ignored.
    pub(crate) fn kick_rx(&self) -> io::Result<()> {
        // SAFETY: no buffer is passed.
        let rc = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc >= 0 {
            return Ok(());
        }
        let e = last_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(()),
            _ => Err(e),
        }
    }

    /// `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL` (`usecs`) and `SO_BUSY_POLL_BUDGET` (`budget`)
    /// (socket(7), Linux >= 5.11).
    pub(crate) fn busy_poll(&self, usecs: u32, budget: u32) -> io::Result<()> {
        let one: libc::c_int = 1;
        setsockopt(&self.fd, libc::SOL_SOCKET, libc::SO_PREFER_BUSY_POLL, &one)?;
        setsockopt(
            &self.fd,
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            &(usecs as libc::c_int),
        )?;
        setsockopt(
            &self.fd,
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL_BUDGET,
            &(budget as libc::c_int),
        )
    }

    /// The kernel's counters of the socket (`XDP_STATISTICS`).
    pub(crate) fn stats(&self) -> io::Result<KernelStats> {
        // SAFETY: all-zero is a valid xdp_statistics (plain integers).
        let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: s is a live buffer of len bytes the kernel writes into.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut s as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        })?;
        Ok(KernelStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }

    /// A second descriptor of the socket, for a poller.
    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// if_nametoindex(3): the index of interface `name`; `None` when there is none.
pub(crate) fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: c is a NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// poll(2) on `xsk` (readable, and writable if `writable`) and `waker` (readable) for at most
/// `timeout`.
pub(crate) fn wait(
    xsk: BorrowedFd<'_>,
    writable: bool,
    waker: BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<()> {
    let mut fds = [
        libc::pollfd {
            fd: xsk.as_raw_fd(),
            events: libc::POLLIN | if writable { libc::POLLOUT } else { 0 },
            revents: 0,
        },
        libc::pollfd {
            fd: waker.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: fds is a live array of 2 pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = last_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// getifaddrs(3): the IPv4 addresses of interface `name`, in the kernel's order.
pub(crate) fn ipv4_addresses(name: &str) -> io::Result<Vec<std::net::Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a live out-pointer; the list it receives is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } < 0 {
        return Err(last_error());
    }
    let mut found = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs(3) returned, not freed until below.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-null ifa_addr points at a socket address that starts with its family.
        let family = (!ifa.ifa_addr.is_null()).then(|| unsafe { (*ifa.ifa_addr).sa_family });
        if family == Some(libc::AF_INET as libc::sa_family_t) && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_name is a NUL-terminated string alive as long as the list.
            let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            if n.to_bytes() == name.as_bytes() {
                // SAFETY: an AF_INET address of getifaddrs(3) is a whole `struct sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                found.push(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs(3), is freed once, and nothing borrowed from it is left.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// setns(2) of the calling thread into the network namespace `fd` refers to.
pub(crate) fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain setns(2) on a live descriptor; it affects only the calling thread.
    check(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) })
}
