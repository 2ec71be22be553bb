//! The C ABI: every exported `ibv_*` function and the `context->ops` entries, and nothing else;
//! the only module of the crate with `unsafe` code.
//!
//! Each object a program gets is a `Box` of a `#[repr(C)]` struct whose first field is the
//! rdma-core structure (`struct ibv_pd`, `struct ibv_cq`, ...), so the pointer handed out is the
//! pointer to the box and the verbs find their own fields (the software HCA's handle) by casting
//! it back. A context is an [`AbiContext`]: `struct verbs_context` (which ends with `struct
//! ibv_context`, the pointer handed out) followed by the Rust state. Objects are freed by their
//! destroy verb only; a program that uses an object after destroying it breaks the verbs
//! contract exactly as with rdma-core.
//!
//! Versions: the `export!` macro puts each function in its rdma-core version node with a
//! `.symver` directive (the nodes are defined by `libibverbs.map`).
// The constants keep verbs.h's names, as bindgen writes them.
#![allow(non_upper_case_globals)]

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use core::mem::{offset_of, size_of, zeroed};
use core::ptr::{self, null_mut};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use gpu_p2p::{HostPtr, Memory, MemoryError, MemoryKind};
use hca::ibverbs::ffi::*;
use hca::ibverbs::translate;
use hca::open::{open, OpenOptions};
use hca::verbs::Verbs;
use hca::{
    AccessFlags, AhHandle, CqHandle, DeviceAttr, EventElement, PdHandle, QpAttrMask, QpInitAttr,
    QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, SrqAttrMask, SrqHandle, UdDest,
    WcOpcode, WorkCompletion,
};

use crate::config::{device_specs, DeviceConfig};

// ibv_create_qp_ex / ibv_create_cq_ex: an implementation file of this module.
pub(crate) mod extended;

/// Most SGEs one WR may carry (rxe's `max_sge` is 32; the device reports its own limit).
pub(crate) const MAX_SGE: usize = 32;

/// `IB_UVERBS_ACCESS_OPTIONAL_RANGE` (bits 20..=29, `IBV_ACCESS_RELAXED_ORDERING` first): access
/// flags a provider may ignore (`<infiniband/ib_user_ioctl_verbs.h>`; ibv_reg_mr(3) "optional
/// access flags"); the software HCA ignores them, as a kernel that does not know them does.
const ACCESS_OPTIONAL_RANGE: c_uint = (((1 << 29) << 1) - 1) & !((1 << 20) - 1);

/// `IBV_DEVICE_SYS_IMAGE_GUID` (verbs.h `enum ibv_device_cap_flags`).
const DEVICE_SYS_IMAGE_GUID: c_uint = 1 << 11;
/// `IBV_DEVICE_RC_RNR_NAK_GEN` (verbs.h `enum ibv_device_cap_flags`).
const DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;

/// `IBV_ACCESS_MW_BIND`: lets memory windows bind to the MR; accepted and ignored, as a device
/// without memory windows does (none can be allocated: `ibv_alloc_mw` fails with `EOPNOTSUPP`).
const ACCESS_MW_BIND: c_uint = 1 << 4;

/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

// ---------------------------------------------------------------------------------------------
// Memory registered by a program: its own pages, by address.

/// A range of the program's memory registered with ibv_reg_mr(3). The verbs contract makes the
/// program keep it allocated until ibv_dereg_mr(3), as with any HCA.
#[derive(Debug)]
pub(crate) struct AppMemory {
    pub(crate) base: usize,
    pub(crate) len: usize,
}

impl AppMemory {
    fn at(&self, offset: usize, len: usize) -> Result<*mut u8, MemoryError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok((self.base + offset) as *mut u8),
            _ => Err(MemoryError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    fn word(&self, offset: usize) -> Result<&core::sync::atomic::AtomicU64, MemoryError> {
        let p = self.at(offset, 8)?;
        if (p as usize) % 8 != 0 {
            return Err(MemoryError::Misaligned { offset });
        }
        // SAFETY: aligned, inside the registered range, which the program keeps allocated while
        // registered (ibv_reg_mr(3)); the HCA's atomics on it are atomic against each other.
        Ok(unsafe { core::sync::atomic::AtomicU64::from_ptr(p.cast()) })
    }
}

impl Memory for AppMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        let p = self.at(offset, dst.len())?;
        // SAFETY: inside the registered range (checked), allocated while registered.
        unsafe { ptr::copy(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        let p = self.at(offset, src.len())?;
        // SAFETY: as for `read`.
        unsafe { ptr::copy(src.as_ptr(), p, src.len()) };
        Ok(())
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        let w = self.word(offset)?;
        Ok(
            match w.compare_exchange(
                compare,
                swap,
                core::sync::atomic::Ordering::SeqCst,
                core::sync::atomic::Ordering::SeqCst,
            ) {
                Ok(v) | Err(v) => v,
            },
        )
    }
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        Ok(self
            .word(offset)?
            .fetch_add(add, core::sync::atomic::Ordering::SeqCst))
    }
    fn host_ptr(&self) -> Option<HostPtr> {
        let p = ptr::NonNull::new(self.base as *mut u8)?;
        // SAFETY: the program keeps the range allocated while it is registered (the `Memory`
        // lives exactly that long: ibv_dereg_mr drops it).
        Some(unsafe { HostPtr::new(p) })
    }
}

// ---------------------------------------------------------------------------------------------
// Devices.

/// One listed device: `struct ibv_device` first.
#[repr(C)]
struct AbiDevice {
    dev: ibv_device,
    config: DeviceConfig,
    guid: u64,
}

/// The device list, made once per process (interfaces do not change under a running program
/// here; rdma-core re-reads sysfs, phase 2 may too).
fn devices() -> &'static [AbiDevice] {
    // Never moved once made: the `struct ibv_device` pointers handed out point into it.
    static DEVICES: OnceLock<Vec<AbiDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        device_specs(interfaces)
            .into_iter()
            .enumerate()
            .map(|(i, config)| {
                let mut dev = ibv_device {
                    node_type: ibv_node_type_IBV_NODE_CA,
                    transport_type: ibv_transport_type_IBV_TRANSPORT_IB,
                    ..ibv_device::default()
                };
                copy_str(&mut dev.name, &config.name);
                copy_str(&mut dev.dev_name, &format!("uverbs{i}"));
                copy_str(
                    &mut dev.dev_path,
                    &format!("/sys/class/infiniband_verbs/uverbs{i}"),
                );
                copy_str(
                    &mut dev.ibdev_path,
                    &format!("/sys/class/infiniband/{}", config.name),
                );
                let guid = guid_of(config.spec.udp_ip());
                AbiDevice { dev, config, guid }
            })
            .collect()
    })
}

/// A GUID from the address (rxe derives it from the MAC as an EUI-64): `02:00:00:ff:fe` then
/// the address's last three bytes, host order.
fn guid_of(ip: Option<IpAddr>) -> u64 {
    let b = match ip {
        Some(IpAddr::V4(a)) => a.octets().to_vec(),
        Some(IpAddr::V6(a)) => a.octets().to_vec(),
        None => vec![0; 3],
    };
    let n = b.len();
    u64::from_be_bytes([0x02, 0, 0, 0xff, 0xfe, b[n - 3], b[n - 2], b[n - 1]])
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let max = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

/// The up interfaces and their addresses, as getifaddrs(3) lists them.
fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = null_mut();
    // SAFETY: getifaddrs writes a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let mut p = list;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs made.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as c_uint == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::from(u32::from_be(sa.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::from(sa.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        if let Some(ip) = ip {
            out.push((name, ip));
        }
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

// ---------------------------------------------------------------------------------------------
// Contexts and objects.

/// A completion channel's or the async queue's state: a queue and an eventfd in semaphore mode
/// that counts its entries (readable exactly while the queue is not empty).
#[derive(Debug)]
struct EventQueue<T> {
    fd: OwnedFd,
    queue: Mutex<VecDeque<T>>,
}

impl<T> EventQueue<T> {
    fn new() -> std::io::Result<EventQueue<T>> {
        // SAFETY: eventfd(2) returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(EventQueue {
            // SAFETY: a descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            queue: Mutex::new(VecDeque::new()),
        })
    }

    fn push(&self, v: T) {
        lock(&self.queue).push_back(v);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one` to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Blocks (unless the descriptor was made non-blocking) until an entry is queued, and takes
    /// it; the errno of read(2) otherwise.
    fn pop(&self) -> Result<T, c_int> {
        loop {
            let mut n: u64 = 0;
            // SAFETY: reads 8 bytes into `n`.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
            if r == 8 {
                if let Some(v) = lock(&self.queue).pop_front() {
                    return Ok(v);
                }
                continue;
            }
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e != libc::EINTR {
                return Err(e);
            }
        }
    }
}

/// `struct ibv_comp_channel` and its queue of CQs (their `struct ibv_cq` addresses).
#[repr(C)]
struct AbiChannel {
    ch: ibv_comp_channel,
    events: Arc<EventQueue<usize>>,
}

/// A CQ's `struct ibv_cq` address and its completion channel's queue.
type ChannelOf = (usize, Arc<EventQueue<usize>>);

/// The Rust side of a context.
pub(crate) struct Inner {
    pub(crate) verbs: Arc<dyn Verbs>,
    /// The HCA this context is on, shared with the process's other contexts on it.
    shared: Arc<Shared>,
    /// `context->cmd_fd`: rdma-core's is the kernel uverbs device; here `/dev/null`, so that a
    /// program may dup(2) or close-on-exec it as it would the real one (ibv_import_device on it
    /// then fails with `EOPNOTSUPP`).
    cmd_fd: OwnedFd,
    /// The CQs with a completion channel: handle -> (`struct ibv_cq` address, channel).
    cqs: Mutex<HashMap<CqHandle, ChannelOf>>,
    /// Async events, as `struct ibv_async_event`s (element addresses resolved when queued).
    async_events: EventQueue<ibv_async_event>,
    /// QPN -> `struct ibv_qp` address, SRQ handle -> `struct ibv_srq` address (async events).
    qps: Mutex<HashMap<u32, usize>>,
    srqs: Mutex<HashMap<SrqHandle, usize>>,
    cq_addrs: Mutex<HashMap<CqHandle, usize>>,
}

// SAFETY: the addresses stored are of objects only their owner's verbs free; `ibv_async_event`
// holds raw pointers only as values handed back to the program.
unsafe impl Send for Inner {}
// SAFETY: as for Send: every field is behind a Mutex or immutable.
unsafe impl Sync for Inner {}

impl Inner {
    /// Queues `ev` on this context's async queue if the element is one of its objects (or the
    /// port / device, which every context hears); whether it was queued.
    fn route_async(&self, ev: &hca::AsyncEvent) -> bool {
        let mut raw = ibv_async_event {
            event_type: ev.event_type as u32,
            ..ibv_async_event::default()
        };
        let found = match ev.element {
            EventElement::Cq(h) => lock(&self.cq_addrs).get(&h).map(|&a| {
                raw.element.cq = a as *mut ibv_cq;
            }),
            EventElement::Qp(qpn) => lock(&self.qps).get(&qpn).map(|&a| {
                raw.element.qp = a as *mut ibv_qp;
            }),
            EventElement::Srq(h) => lock(&self.srqs).get(&h).map(|&a| {
                raw.element.srq = a as *mut ibv_srq;
            }),
            EventElement::Port(p) => {
                raw.element.port_num = c_int::from(p);
                Some(())
            }
            EventElement::Device => Some(()),
        };
        if found.is_some() {
            self.async_events.push(raw);
        }
        found.is_some()
    }
}

/// One opened software HCA and the contexts of this process on it: ibv_open_device on a device
/// already open in the process opens another context on the same HCA (as a kernel device
/// serves many contexts), since the HCA's UDP port can be bound once.
pub(crate) struct Shared {
    verbs: Arc<dyn Verbs>,
    contexts: Mutex<Vec<Weak<Inner>>>,
    /// The process that opened it: a child of fork(2) inherits the map but not the HCA's
    /// progress thread, so it opens devices of its own.
    pid: u32,
}

impl Shared {
    /// Routes what the device queued (its event hook): a CQ event to the channel of the context
    /// owning the CQ, an async event to the context owning its element (port and device events
    /// to every context).
    fn dispatch(&self) {
        let live: Vec<Arc<Inner>> = lock(&self.contexts)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        while let Some(cq) = self.verbs.poll_cq_event() {
            for i in &live {
                let target = lock(&i.cqs).get(&cq).cloned();
                if let Some((addr, channel)) = target {
                    channel.push(addr);
                    break;
                }
            }
        }
        while let Some(ev) = self.verbs.poll_event() {
            let broadcast = matches!(ev.element, EventElement::Port(_) | EventElement::Device);
            for i in &live {
                if i.route_async(&ev) && !broadcast {
                    break;
                }
            }
        }
    }
}

/// The HCAs open in this process, by device index (a `Weak`: the last context's close drops it).
fn open_devices() -> &'static Mutex<HashMap<usize, Weak<Shared>>> {
    static OPEN: OnceLock<Mutex<HashMap<usize, Weak<Shared>>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Registers [`flush_at_exit`] with atexit(3), once per process (a child of fork(2) inherits
/// the registration).
fn register_exit_flush() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: atexit(3) with a function of this library that takes no arguments; glibc's
        // atexit registers it for this library's DSO, so dlclose(3) runs it too, before the code
        // goes away.
        if unsafe { libc::atexit(flush_at_exit) } != 0 {
            eprintln!("libibverbs (software HCA): atexit failed: held ACKs may be lost at exit");
        }
    });
}

/// At exit(3): every device this process opened sends the ACKs (and READ responses) its
/// polling rounds held for a reply (`Verbs::flush_held`, `hca::soft::ACK_HOLD`): a program
/// may exit right after its last completion without destroying its QPs, and the peer would
/// otherwise retransmit until `IBV_WC_RETRY_EXC_ERR`. `try_lock`: a thread that exits while
/// it holds the device map (inside `ibv_open_device`) skips the flush instead of deadlocking.
extern "C" fn flush_at_exit() {
    let Ok(open_now) = open_devices().try_lock() else {
        return;
    };
    let live: Vec<Arc<Shared>> = open_now
        .values()
        .filter_map(Weak::upgrade)
        .filter(|s| s.pid == std::process::id())
        .collect();
    drop(open_now);
    for s in &live {
        s.verbs.flush_held();
    }
}

/// A context: `struct verbs_context` (ending with the `struct ibv_context` handed out) first.
#[repr(C)]
struct AbiContext {
    vctx: verbs_context,
    inner: Arc<Inner>,
}

/// The offset of `struct ibv_context` in an [`AbiContext`].
const CONTEXT_OFFSET: usize = offset_of!(AbiContext, vctx) + offset_of!(verbs_context, context);

/// The context of a `struct ibv_context` this library made.
///
/// # Safety
/// `ctx` was returned by [`ibv_open_device`] and not closed.
pub(crate) unsafe fn inner<'a>(ctx: *mut ibv_context) -> &'a Inner {
    // SAFETY: the caller's promise; `ibv_context` sits at CONTEXT_OFFSET of an AbiContext.
    unsafe { &(*ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<AbiContext>()).inner }
}

#[repr(C)]
pub(crate) struct AbiPd {
    pub(crate) pd: ibv_pd,
    pub(crate) handle: PdHandle,
}
#[repr(C)]
struct AbiMr {
    mr: ibv_mr,
    /// The mapping of a dma-buf MR, unmapped when the MR is freed.
    _mapping: Option<Mapping>,
}
/// A CQ: `struct ibv_cq_ex` first, whose leading fields are `struct ibv_cq`'s (verbs.h keeps
/// them in step, so `ibv_cq_ex_to_cq` is a cast), then the handle and the completion that
/// `start_poll` / `next_poll` took (the `read_*` callbacks read it).
#[repr(C)]
pub(crate) struct AbiCq {
    pub(crate) cqx: ibv_cq_ex,
    pub(crate) handle: CqHandle,
    pub(crate) current: UnsafeCell<WorkCompletion>,
}
/// A QP: `struct ibv_qp_ex` first, which starts with `struct ibv_qp` (`qp_base`), then its type
/// and, for a QP made by ibv_create_qp_ex with send-ops flags, the work-request builder.
#[repr(C)]
pub(crate) struct AbiQp {
    pub(crate) qpx: ibv_qp_ex,
    pub(crate) qp_type: QpType,
    pub(crate) builder: Option<Box<UnsafeCell<extended::Builder>>>,
    /// The buffer `IBV_SEND_INLINE` data is copied to ([`InlineBounce`]), made on first use.
    inline: Mutex<Option<InlineBounce>>,
}

/// Most inline bytes one WR carries: the software HCA's `max_inline_data` (32 SGEs x 16).
const MAX_INLINE: usize = 512;

/// Where an `IBV_SEND_INLINE` WR's bytes go before the engine takes them: ibv_post_send(3) reads
/// inline data from the SGEs' addresses at post time and does not check their lkeys (the memory
/// need not be registered, as rdma-core's `rdma_client` relies on), while the engine gathers
/// through an MR; so the bytes are copied into this buffer, registered on the QP's PD, and the
/// WR is posted with one SGE on it (the engine copies inline data before `post_send` returns, so
/// the buffer is free again at once). Deregistered when the QP is freed.
struct InlineBounce {
    mem: Box<[u8; MAX_INLINE]>,
    lkey: u32,
    verbs: Arc<dyn Verbs>,
}

impl Drop for InlineBounce {
    fn drop(&mut self) {
        let _ = self.verbs.dereg_mr(self.lkey);
    }
}

impl InlineBounce {
    fn new(verbs: &Arc<dyn Verbs>, pd: PdHandle) -> Result<InlineBounce, c_int> {
        let mut mem = Box::new([0u8; MAX_INLINE]);
        let memory = Arc::new(AppMemory {
            base: mem.as_mut_ptr() as usize,
            len: MAX_INLINE,
        });
        let mr = verbs
            .reg_mr(
                pd,
                memory,
                0,
                MAX_INLINE,
                mem.as_ptr() as u64,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(|e| errno_of(&e))?;
        Ok(InlineBounce {
            mem,
            lkey: mr.lkey(),
            verbs: verbs.clone(),
        })
    }

    /// Copies the bytes `list` names into the buffer: the one SGE that replaces them, or
    /// `EINVAL` past [`MAX_INLINE`] bytes.
    ///
    /// # Safety
    /// Each SGE's `addr` is readable for its `length` (the program's promise for inline data).
    unsafe fn gather(&mut self, list: &[Sge]) -> Result<Sge, c_int> {
        let mut at = 0usize;
        for s in list {
            let len = s.length as usize;
            let end = at
                .checked_add(len)
                .filter(|&e| e <= MAX_INLINE)
                .ok_or(libc::EINVAL)?;
            // SAFETY: the caller's promise; the destination range is inside the buffer.
            unsafe {
                ptr::copy(
                    s.addr as usize as *const u8,
                    self.mem.as_mut_ptr().add(at),
                    len,
                )
            };
            at = end;
        }
        Ok(Sge {
            addr: self.mem.as_ptr() as u64,
            length: at as u32,
            lkey: self.lkey,
        })
    }
}
#[repr(C)]
struct AbiSrq {
    srq: ibv_srq,
    handle: SrqHandle,
}
#[repr(C)]
pub(crate) struct AbiAh {
    pub(crate) ah: ibv_ah,
    pub(crate) handle: AhHandle,
}

/// The errno of a refused verb (`EIO` for a device failure that carries none).
pub(crate) fn errno_of(e: &hca::verbs::api::DeviceError) -> c_int {
    e.errno().unwrap_or(libc::EIO)
}

/// What an object-creating verb hands the program: `make(value)` boxed, as the C struct it starts
/// with (`repr(C)`, first field), or null with `errno` set when the verb was refused.
pub(crate) fn boxed_or_null<T, A, C>(
    made: Result<T, hca::verbs::api::DeviceError>,
    make: impl FnOnce(T) -> A,
) -> *mut C {
    match made {
        Ok(value) => Box::into_raw(Box::new(make(value))).cast(),
        Err(e) => {
            set_errno(errno_of(&e));
            null_mut()
        }
    }
}

/// What an object-destroying verb returns: 0 after freeing `obj` once the device destroyed what it
/// stands for, or the refusal's errno with `obj` left alone.
///
/// # Safety
/// `obj` is from `Box::into_raw` (as [`boxed_or_null`] makes it) and is not used after a 0 return.
pub(crate) unsafe fn free_if_destroyed<A>(
    destroyed: Result<(), hca::verbs::api::DeviceError>,
    obj: *mut A,
) -> c_int {
    match destroyed {
        Ok(()) => {
            // SAFETY: the caller's promise: freed once, here.
            drop(unsafe { Box::from_raw(obj) });
            0
        }
        Err(e) => errno_of(&e),
    }
}

// ---------------------------------------------------------------------------------------------
// Device list.

/// ibv_get_device_list(3).
#[no_mangle]
pub extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    let devs = devices();
    let mut list: Vec<*mut ibv_device> = devs
        .iter()
        .map(|d| ptr::from_ref(&d.dev).cast_mut())
        .collect();
    list.push(null_mut());
    if !num_devices.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num_devices = (list.len() - 1) as c_int };
    }
    Box::into_raw(list.into_boxed_slice()).cast()
}
symver!(ibv_get_device_list, "IBVERBS_1.1");

/// ibv_free_device_list(3).
///
/// # Safety
/// `list` came from [`ibv_get_device_list`].
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is null-terminated (ibv_get_device_list).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 pointers ibv_get_device_list made.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}
symver!(ibv_free_device_list, "IBVERBS_1.1");

/// ibv_get_device_name(3).
///
/// # Safety
/// `device` is from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { (*device).name.as_ptr() }
}
symver!(ibv_get_device_name, "IBVERBS_1.1");

/// ibv_get_device_guid(3): big-endian, as rdma-core returns it.
///
/// # Safety
/// `device` is from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    // SAFETY: the caller's promise: an AbiDevice.
    unsafe { (*device.cast::<AbiDevice>()).guid.to_be() }
}
symver!(ibv_get_device_guid, "IBVERBS_1.1");

/// ibv_get_device_index(3).
///
/// # Safety
/// `device` is from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    devices()
        .iter()
        .position(|d| ptr::eq(&d.dev, device))
        .map_or(-1, |i| i as c_int)
}
symver!(ibv_get_device_index, "IBVERBS_1.9");

// ---------------------------------------------------------------------------------------------
// Open / close.

/// ibv_open_device(3): opens the software HCA on the device's address.
///
/// # Safety
/// `device` is from the device list.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    // SAFETY: the caller's promise: an AbiDevice.
    let dev = unsafe { &*device.cast::<AbiDevice>() };
    let index = devices()
        .iter()
        .position(|d| ptr::eq(d, dev))
        .unwrap_or(usize::MAX);
    let mut open_now = lock(open_devices());
    let reusable = open_now
        .get(&index)
        .and_then(Weak::upgrade)
        .filter(|s| s.pid == std::process::id());
    let shared = match reusable {
        Some(s) => s,
        None => {
            let verbs = match open(
                &dev.config.spec,
                &OpenOptions {
                    udp_share: Some(crate::config::share()),
                    // A busy-polling program drives the engine from ibv_poll_cq, as the Rust
                    // latency tools do; the thread serves programs that never poll or block
                    // (SOFT_HCA_PROGRESS chooses another mode).
                    progress: crate::config::progress(),
                    ..OpenOptions::default()
                },
            ) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("libibverbs (software HCA): {}: {e}", dev.config.name);
                    set_errno(e.errno().unwrap_or(libc::ENODEV));
                    return null_mut();
                }
            };
            let shared = Arc::new(Shared {
                verbs: verbs.clone(),
                contexts: Mutex::new(Vec::new()),
                pid: std::process::id(),
            });
            let weak: Weak<Shared> = Arc::downgrade(&shared);
            if let Err(e) = verbs.set_event_hook(Box::new(move || {
                if let Some(s) = weak.upgrade() {
                    s.dispatch();
                }
            })) {
                eprintln!("libibverbs (software HCA): {}: {e}", dev.config.name);
            }
            open_now.insert(index, Arc::downgrade(&shared));
            register_exit_flush();
            shared
        }
    };
    drop(open_now);
    let verbs = shared.verbs.clone();
    let async_events = match EventQueue::new() {
        Ok(q) => q,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            return null_mut();
        }
    };
    // SAFETY: open(2) of a constant path; a new descriptor or -1.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        set_errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE),
        );
        return null_mut();
    }
    let inner = Arc::new(Inner {
        verbs: verbs.clone(),
        shared: shared.clone(),
        // SAFETY: the descriptor just opened, owned here.
        cmd_fd: unsafe { OwnedFd::from_raw_fd(null) },
        cqs: Mutex::new(HashMap::new()),
        async_events,
        qps: Mutex::new(HashMap::new()),
        srqs: Mutex::new(HashMap::new()),
        cq_addrs: Mutex::new(HashMap::new()),
    });
    {
        let mut contexts = lock(&shared.contexts);
        contexts.retain(|w| w.strong_count() > 0);
        contexts.push(Arc::downgrade(&inner));
    }
    let async_fd = inner.async_events.fd.as_raw_fd();
    let mut vctx = verbs_context {
        query_port: Some(vctx_query_port),
        create_qp_ex: Some(extended::vctx_create_qp_ex),
        query_device_ex: Some(vctx_query_device_ex),
        create_cq_ex: Some(extended::vctx_create_cq_ex),
        sz: size_of::<verbs_context>(),
        ..verbs_context::default()
    };
    vctx.context.device = device;
    vctx.context.cmd_fd = inner.cmd_fd.as_raw_fd();
    vctx.context.async_fd = async_fd;
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = usize::MAX as *mut c_void;
    vctx.context.ops.poll_cq = Some(op_poll_cq);
    vctx.context.ops.req_notify_cq = Some(op_req_notify_cq);
    vctx.context.ops.post_send = Some(op_post_send);
    vctx.context.ops.post_recv = Some(op_post_recv);
    vctx.context.ops.post_srq_recv = Some(op_post_srq_recv);
    // SAFETY: a fresh mutex in the context, as libibverbs initialises it.
    unsafe { libc::pthread_mutex_init(ptr::from_mut(&mut vctx.context.mutex).cast(), ptr::null()) };
    let b = Box::into_raw(Box::new(AbiContext { vctx, inner }));
    // SAFETY: just allocated.
    unsafe { ptr::from_mut(&mut (*b).vctx.context) }
}
symver!(ibv_open_device, "IBVERBS_1.1");

/// ibv_close_device(3): frees the context; the last context of the process on its device closes
/// the software HCA (its QPs flush).
///
/// # Safety
/// `context` is open; the program destroyed (or abandons) its objects.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    // SAFETY: the caller's promise.
    let b = unsafe {
        Box::from_raw(
            context
                .cast::<u8>()
                .sub(CONTEXT_OFFSET)
                .cast::<AbiContext>(),
        )
    };
    let shared = b.inner.shared.clone();
    drop(b);
    let mut open_now = lock(open_devices());
    // The last context on the HCA closes it (its QPs flush); the map's entry is a Weak.
    if Arc::strong_count(&shared) == 1 {
        if std::env::var_os(crate::config::SOFT_HCA_STATS).is_some() {
            crate::config::dump_stats(&*shared.verbs);
        }
        shared.verbs.close();
        open_now.retain(|_, w| !ptr::eq(w.as_ptr(), Arc::as_ptr(&shared)));
    }
    0
}
symver!(ibv_close_device, "IBVERBS_1.1");

// ---------------------------------------------------------------------------------------------
// Queries.

fn device_attr(a: &DeviceAttr, guid: u64) -> ibv_device_attr {
    let mut out = ibv_device_attr::default();
    let fw = format!(
        "{}.{}.{}",
        a.fw_ver >> 32,
        (a.fw_ver >> 16) & 0xffff,
        a.fw_ver & 0xffff
    );
    copy_str(&mut out.fw_ver, &fw);
    let c = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    out.node_guid = guid.to_be();
    out.sys_image_guid = guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = a.page_size_cap;
    // rxe's RXE_VENDOR_ID (rxe_param.h) where the HCA names no vendor.
    out.vendor_id = if a.vendor_id == 0 {
        0x00ff_ffff
    } else {
        a.vendor_id
    };
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    out.max_qp = c(a.max_qp);
    out.max_qp_wr = c(a.max_qp_wr);
    // What the software HCA does of rxe's RXE_DEVICE_CAP_FLAGS (rxe_param.h): a system image
    // GUID and RNR NAKs on RC; not memory windows, path migration or SRQ resizing.
    out.device_cap_flags = DEVICE_SYS_IMAGE_GUID | DEVICE_RC_RNR_NAK_GEN;
    out.max_sge = c(a.max_sge);
    out.max_sge_rd = c(a.max_sge_rd);
    out.max_cq = c(a.max_cq);
    out.max_cqe = c(a.max_cqe);
    out.max_mr = c(a.max_mr);
    out.max_pd = c(a.max_pd);
    out.max_qp_rd_atom = c(a.max_qp_rd_atom);
    out.max_res_rd_atom = c(a.max_res_rd_atom);
    out.max_qp_init_rd_atom = c(a.max_qp_init_rd_atom);
    out.atomic_cap = a.atomic_cap as u32;
    out.max_ah = c(a.max_ah);
    out.max_srq = c(a.max_srq);
    out.max_srq_wr = c(a.max_srq_wr);
    out.max_srq_sge = c(a.max_srq_sge);
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
    out
}

/// ibv_query_device(3).
///
/// # Safety
/// `context` is open; `attr` points to a `struct ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the caller's promise.
    let (i, dev) = unsafe { (inner(context), &*(*context).device.cast::<AbiDevice>()) };
    // SAFETY: the caller's out parameter.
    unsafe { *attr = device_attr(&i.verbs.query_device(), dev.guid) };
    0
}
symver!(ibv_query_device, "IBVERBS_1.1");

/// `verbs_context->query_device_ex`, which verbs.h's inline ibv_query_device_ex(3) calls: the
/// attributes of ibv_query_device(3) in `orig_attr`, `device_cap_flags_ex` repeating
/// `device_cap_flags` and `phys_port_cnt_ex` 1 (as rxe's kernel driver reports them); the
/// extensions the software HCA lacks (ODP, TSO, RSS, packet pacing, tag matching, device memory,
/// PCI atomics, completion timestamps) are zero. Copies at most `attr_size` bytes (a program
/// built against a shorter `struct ibv_device_attr_ex`); `EINVAL` when `input` has a
/// `comp_mask` bit set or `attr_size` is below `struct ibv_device_attr`.
///
/// # Safety
/// `context` is open; `attr` points to `attr_size` bytes; `input` is null or valid.
unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller's input, if any.
    if unsafe { input.as_ref() }.is_some_and(|x| x.comp_mask != 0)
        || attr_size < size_of::<ibv_device_attr>()
    {
        return libc::EINVAL;
    }
    // SAFETY: the caller's promise.
    let (i, dev) = unsafe { (inner(context), &*(*context).device.cast::<AbiDevice>()) };
    let orig = device_attr(&i.verbs.query_device(), dev.guid);
    let ex = ibv_device_attr_ex {
        orig_attr: orig,
        device_cap_flags_ex: u64::from(orig.device_cap_flags),
        phys_port_cnt_ex: u32::from(orig.phys_port_cnt),
        ..ibv_device_attr_ex::default()
    };
    let n = attr_size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: `n` bytes fit both the local and the caller's structure.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&ex).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

fn port_attr(v: &dyn Verbs) -> ibv_port_attr {
    let p = v.query_port();
    ibv_port_attr {
        state: p.state as u32,
        max_mtu: u32::from(p.max_mtu.code()),
        active_mtu: u32::from(p.active_mtu.code()),
        gid_tbl_len: c_int::try_from(p.gid_tbl_len).unwrap_or(c_int::MAX),
        port_cap_flags: 0x0401_0000, // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS, as rxe
        max_msg_sz: u32::try_from(p.max_msg_sz).unwrap_or(u32::MAX),
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,  // 1X
        active_speed: 32, // 10 Gb/s (FDR10 code), a plausible Ethernet speed
        phys_state: p.phys_state,
        link_layer: LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// `verbs_context->query_port`, which verbs.h's inline ibv_query_port calls: copies at most
/// `len` bytes (a program built against an older, shorter `struct ibv_port_attr`).
/// Port 1's attributes, the whole current `struct ibv_port_attr`.
///
/// # Safety
/// `context` is open.
pub(crate) unsafe fn query_port_full(context: *mut ibv_context, out: &mut ibv_port_attr) -> c_int {
    // SAFETY: the caller's context; `out` is a whole structure.
    unsafe { vctx_query_port(context, 1, out, size_of::<ibv_port_attr>()) }
}

unsafe extern "C" fn vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if port_num != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's context.
    let a = port_attr(&*unsafe { inner(context) }.verbs);
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's buffer of `len` bytes.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&a).cast::<u8>(), port_attr_out.cast(), n) };
    0
}

/// ibv_query_port(3), the exported symbol: the old (compat) `struct ibv_port_attr`, which ends
/// before `flags`.
///
/// # Safety
/// `context` is open; `attr` points to at least the compat structure.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded with the compat size.
    unsafe { vctx_query_port(context, port_num, attr, offset_of!(ibv_port_attr, flags)) }
}
symver!(ibv_query_port, "IBVERBS_1.1");

/// ibv_query_gid(3).
///
/// # Safety
/// `context` is open; `gid` points to a `union ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if port_num != 1 || index < 0 {
        return -1;
    }
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    let bytes = match i.verbs.query_gid(index as u32) {
        Ok(e) => *e.gid.as_bytes(),
        // An index inside the table whose entry is empty reads as zero (rdma-core reads sysfs).
        Err(_) if (index as u32) < i.verbs.query_port().gid_tbl_len => [0; 16],
        Err(_) => return -1,
    };
    // SAFETY: the caller's out parameter.
    unsafe { (*gid).raw = bytes };
    0
}
symver!(ibv_query_gid, "IBVERBS_1.1");

/// `_ibv_query_gid_ex` (ibv_query_gid_ex(3) is an inline wrapper of it).
///
/// # Safety
/// `context` is open; `entry` points to `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if flags != 0 || port_num != 1 || entry_size < size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    match i.verbs.query_gid(gid_index) {
        Ok(e) => {
            let mut out = ibv_gid_entry {
                gid_index,
                port_num,
                gid_type: match e.gid_type {
                    hca::GidType::RoceV1 => ibv_gid_type_IBV_GID_TYPE_ROCE_V1,
                    hca::GidType::RoceV2 => ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
                    hca::GidType::Ib => ibv_gid_type_IBV_GID_TYPE_IB,
                },
                ndev_ifindex: 0,
                ..ibv_gid_entry::default()
            };
            out.gid.raw = *e.gid.as_bytes();
            // SAFETY: the caller's out parameter.
            unsafe { *entry = out };
            0
        }
        // rdma-core: ENODATA for an empty entry inside the table.
        Err(_) if gid_index < i.verbs.query_port().gid_tbl_len => libc::ENODATA,
        Err(_) => libc::EINVAL,
    }
}
symver!(_ibv_query_gid_ex, "IBVERBS_1.11");

/// `ibv_query_gid_type` (private to rdma-core, used by ibv_devinfo): `IBV_GID_TYPE_SYSFS_*`
/// (0 IB / RoCE v1, 1 RoCE v2).
///
/// # Safety
/// `context` is open; `type_` points to an `enum ibv_gid_type_sysfs`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    type_: *mut c_uint,
) -> c_int {
    if port_num != 1 {
        return -1;
    }
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    let t = match i.verbs.query_gid(index) {
        Ok(e) if e.gid_type == hca::GidType::RoceV2 => 1,
        Ok(_) => 0,
        Err(_) if index < i.verbs.query_port().gid_tbl_len => 0,
        Err(_) => return -1,
    };
    // SAFETY: the caller's out parameter.
    unsafe { *type_ = t };
    0
}
symver!(ibv_query_gid_type, "IBVERBS_PRIVATE_34");

/// ibv_query_pkey(3): the one default P_Key, 0xffff (big-endian, as rdma-core returns it).
///
/// # Safety
/// `pkey` points to a `__be16`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    _context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if port_num != 1 || index != 0 {
        return -1;
    }
    // SAFETY: the caller's out parameter.
    unsafe { *pkey = 0xffff };
    0
}
symver!(ibv_query_pkey, "IBVERBS_1.1");

/// `ibv_read_sysfs_file` (rdma-core's helper, used by ibv_devinfo): reads `dir/file` into `buf`
/// without its trailing newline; the length, or -1. The devices here have no sysfs directory.
///
/// # Safety
/// `dir` and `file` are C strings; `buf` has `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    // SAFETY: the caller's C strings.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
    let Ok(data) = std::fs::read(path) else {
        return -1;
    };
    if size == 0 {
        return -1;
    }
    let mut n = data.len().min(size - 1);
    if n > 0 && data[n - 1] == b'\n' {
        n -= 1;
    }
    // SAFETY: `n + 1 <= size` bytes of the caller's buffer.
    unsafe {
        ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    n as c_int
}
symver!(ibv_read_sysfs_file, "IBVERBS_1.0");

/// ibv_fork_init(3): nothing to do (the software HCA pins no pages).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}
symver!(ibv_fork_init, "IBVERBS_1.1");

// ---------------------------------------------------------------------------------------------
// PD, MR.

/// ibv_alloc_pd(3).
///
/// # Safety
/// `context` is open.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: the caller's context.
    boxed_or_null(unsafe { inner(context) }.verbs.alloc_pd(), |handle| AbiPd {
        pd: ibv_pd {
            context,
            handle: handle.index(),
        },
        handle,
    })
}
symver!(ibv_alloc_pd, "IBVERBS_1.1");

/// ibv_dealloc_pd(3).
///
/// # Safety
/// `pd` is from ibv_alloc_pd.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: the caller's promise: an AbiPd.
    let p = unsafe { &*pd.cast::<AbiPd>() };
    // SAFETY: its context is open.
    let destroyed = unsafe { inner(p.pd.context) }.verbs.dealloc_pd(p.handle);
    // SAFETY: an AbiPd from ibv_alloc_pd.
    unsafe { free_if_destroyed(destroyed, pd.cast::<AbiPd>()) }
}
symver!(ibv_dealloc_pd, "IBVERBS_1.1");

/// ibv_reg_mr_iova2(3): the optional access flags (`IBV_ACCESS_RELAXED_ORDERING`, ...) are ignored.
///
/// # Safety
/// `pd` is from ibv_alloc_pd; `addr .. addr + length` stays allocated until ibv_dereg_mr.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg_mr(pd, addr, length, iova, access, None) }
}
symver!(ibv_reg_mr_iova2, "IBVERBS_1.8");

/// Registers `addr .. addr + length` of the program's memory (or of `mapping`, which the MR
/// then owns and unmaps when it is deregistered).
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
    mapping: Option<Mapping>,
) -> *mut ibv_mr {
    // SAFETY: the caller's promise: an AbiPd of an open context.
    let p = unsafe { &*pd.cast::<AbiPd>() };
    // SAFETY: as above.
    let i = unsafe { inner(p.pd.context) };
    let memory = Arc::new(AppMemory {
        base: addr as usize,
        len: length,
    });
    let registered = i.verbs.reg_mr(
        p.handle,
        memory,
        0,
        length,
        iova,
        AccessFlags::from_bits_retain(access & !(ACCESS_OPTIONAL_RANGE | ACCESS_MW_BIND)),
    );
    boxed_or_null(registered, |mr| AbiMr {
        mr: ibv_mr {
            context: p.pd.context,
            pd,
            addr,
            length,
            handle: mr.lkey(),
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        },
        _mapping: mapping,
    })
}

/// A dma-buf's pages mapped into the process; munmap(2) when dropped.
struct Mapping {
    base: *mut c_void,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: a mapping made by ibv_reg_dmabuf_mr, unmapped once, here.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// `DMA_BUF_MAGIC` (`<linux/magic.h>`): the `f_type` fstatfs(2) reports for a dma-buf.
const DMA_BUF_MAGIC: i64 = 0x444d_4142;

/// Whether `fd` is a dma-buf (its file system is the kernel's dma-buf one).
// `f_type` is `__fsword_t`: i64 on x86-64, narrower elsewhere.
#[allow(clippy::useless_conversion)]
fn is_dmabuf(fd: c_int) -> bool {
    if fd < 0 {
        return false;
    }
    // SAFETY: fstatfs(2) fills the zeroed struct or fails.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstatfs(fd, &mut st) };
    rc == 0 && i64::from(st.f_type) == DMA_BUF_MAGIC
}

/// ibv_reg_mr(3): the MR's I/O virtual address is `addr`.
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}
symver!(ibv_reg_mr, "IBVERBS_1.1");

/// ibv_reg_mr_iova(3).
///
/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}
symver!(ibv_reg_mr_iova, "IBVERBS_1.7");

/// ibv_reg_dmabuf_mr(3): registers `length` bytes at `offset` of the dma-buf `fd` (at I/O
/// virtual address `iova`) by mapping them into the process with mmap(2), which a dma-buf whose
/// exporter supports CPU access allows (udmabuf, for one); the mapping lives until
/// ibv_dereg_mr. `mr->addr` is `offset`, as rdma-core sets it. Null with `errno`:
/// `EOPNOTSUPP` when `fd` is not a dma-buf (fstatfs(2) type `DMA_BUF_MAGIC`) or cannot be
/// mapped: what NCCL's probe with `fd` -1 takes for "no dma-buf support", as on rxe;
/// `EINVAL` for a zero or overflowing length; else as ibv_reg_mr(3).
///
/// # Safety
/// `pd` is from ibv_alloc_pd.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    if !is_dmabuf(fd) {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    // SAFETY: sysconf(3) has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = offset & !(page - 1);
    let delta = (offset - start) as usize;
    let (Some(len), Ok(off)) = (length.checked_add(delta), libc::off_t::try_from(start)) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    if length == 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: a new shared mapping of the caller's dma-buf, or MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            off,
        )
    };
    if base == libc::MAP_FAILED {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    let mapping = Mapping { base, len };
    // SAFETY: the mapping covers `delta .. delta + length` and lives as long as the MR.
    let mr = unsafe {
        reg_mr(
            pd,
            base.cast::<u8>().add(delta).cast(),
            length,
            iova,
            access as c_uint,
            Some(mapping),
        )
    };
    if !mr.is_null() {
        // SAFETY: just made.
        unsafe { (*mr).addr = offset as usize as *mut c_void };
    }
    mr
}
symver!(ibv_reg_dmabuf_mr, "IBVERBS_1.12");

/// ibv_dereg_mr(3).
///
/// # Safety
/// `mr` is from ibv_reg_mr.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: the caller's promise.
    let m = unsafe { &*mr };
    // SAFETY: its context is open.
    let destroyed = unsafe { inner(m.context) }.verbs.dereg_mr(m.lkey);
    // SAFETY: an AbiMr from ibv_reg_mr.
    unsafe { free_if_destroyed(destroyed, mr.cast::<AbiMr>()) }
}
symver!(ibv_dereg_mr, "IBVERBS_1.1");

// ---------------------------------------------------------------------------------------------
// Completion channels, CQs.

/// ibv_create_comp_channel(3): `fd` is an eventfd, readable while CQ events are queued.
///
/// # Safety
/// `context` is open.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    match EventQueue::new() {
        Ok(q) => {
            let events = Arc::new(q);
            let fd = events.fd.as_raw_fd();
            Box::into_raw(Box::new(AbiChannel {
                ch: ibv_comp_channel {
                    context,
                    fd,
                    refcnt: 0,
                },
                events,
            }))
            .cast()
        }
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            null_mut()
        }
    }
}
symver!(ibv_create_comp_channel, "IBVERBS_1.0");

/// ibv_destroy_comp_channel(3): `EBUSY` while a CQ uses it.
///
/// # Safety
/// `channel` is from ibv_create_comp_channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: the caller's promise.
    if unsafe { (*channel).refcnt } != 0 {
        return libc::EBUSY;
    }
    // SAFETY: freed once, here.
    drop(unsafe { Box::from_raw(channel.cast::<AbiChannel>()) });
    0
}
symver!(ibv_destroy_comp_channel, "IBVERBS_1.0");

/// ibv_create_cq(3).
///
/// # Safety
/// `context` is open; `channel` is null or from ibv_create_comp_channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    // rxe's checks (rxe_cq_chk_attr): 1 ..= max_cqe entries; the one completion vector, 0.
    let Ok(n) = u32::try_from(cqe) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    // SAFETY: the caller's context.
    let vectors = unsafe { (*context).num_comp_vectors };
    if n == 0 || n > i.verbs.query_device().max_cqe || comp_vector < 0 || comp_vector >= vectors {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let handle = match i.verbs.create_cq(n) {
        Ok(h) => h,
        Err(e) => {
            set_errno(errno_of(&e));
            return null_mut();
        }
    };
    let mut cq = ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle: handle.index(),
        cqe,
        ..ibv_cq_ex::default()
    };
    // SAFETY: fresh mutex and condition variable, as libibverbs initialises them.
    unsafe {
        libc::pthread_mutex_init(ptr::from_mut(&mut cq.mutex).cast(), ptr::null());
        libc::pthread_cond_init(ptr::from_mut(&mut cq.cond).cast(), ptr::null());
    }
    let b = Box::into_raw(Box::new(AbiCq {
        cqx: cq,
        handle,
        current: UnsafeCell::new(WorkCompletion::success(0, WcOpcode::Send, 0, 0)),
    }));
    lock(&i.cq_addrs).insert(handle, b as usize);
    if !channel.is_null() {
        // SAFETY: the caller's channel, an AbiChannel.
        let ch = unsafe { &mut *channel.cast::<AbiChannel>() };
        ch.ch.refcnt += 1;
        lock(&i.cqs).insert(handle, (b as usize, ch.events.clone()));
    }
    b.cast()
}
symver!(ibv_create_cq, "IBVERBS_1.1");

/// ibv_destroy_cq(3).
///
/// # Safety
/// `cq` is from ibv_create_cq.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller's promise.
    let c = unsafe { &*cq.cast::<AbiCq>() };
    // SAFETY: its context is open.
    let i = unsafe { inner(c.cqx.context) };
    if let Err(e) = i.verbs.destroy_cq(c.handle) {
        return errno_of(&e);
    }
    lock(&i.cqs).remove(&c.handle);
    lock(&i.cq_addrs).remove(&c.handle);
    if !c.cqx.channel.is_null() {
        // SAFETY: the channel outlives its CQs (ibv_destroy_comp_channel refuses otherwise).
        unsafe { (*c.cqx.channel).refcnt -= 1 };
    }
    // SAFETY: freed once, here.
    drop(unsafe { Box::from_raw(cq.cast::<AbiCq>()) });
    0
}
symver!(ibv_destroy_cq, "IBVERBS_1.1");

/// ibv_get_cq_event(3): blocks on the channel's descriptor (unless the program made it
/// non-blocking: then -1 with `errno` `EAGAIN`).
///
/// # Safety
/// `channel` is from ibv_create_comp_channel; the out pointers are valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's channel.
    let ch = unsafe { &*channel.cast::<AbiChannel>() };
    match ch.events.pop() {
        Ok(addr) => {
            let c = addr as *mut ibv_cq;
            // SAFETY: the caller's out parameters; the CQ is alive (it has unacked events).
            unsafe {
                *cq = c;
                *cq_context = (*c).cq_context;
            }
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}
symver!(ibv_get_cq_event, "IBVERBS_1.1");

/// ibv_ack_cq_events(3).
///
/// # Safety
/// `cq` is from ibv_create_cq.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    // SAFETY: the caller's CQ.
    unsafe { (*cq).comp_events_completed += nevents };
}
symver!(ibv_ack_cq_events, "IBVERBS_1.1");

unsafe extern "C" fn op_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller's CQ, an AbiCq of an open context.
    let (c, i) = unsafe {
        let c = &*cq.cast::<AbiCq>();
        (c, inner(c.cqx.context))
    };
    match i.verbs.req_notify_cq(c.handle, solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

pub(crate) fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
        ..ibv_wc::default()
    };
    if let Some(imm) = w.imm_data {
        wc.__bindgen_anon_1.imm_data = imm.to_be();
    } else if let Some(rkey) = w.invalidated_rkey {
        wc.__bindgen_anon_1.invalidated_rkey = rkey;
    }
    wc
}

unsafe extern "C" fn op_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's CQ, an AbiCq of an open context.
    let (c, i) = unsafe {
        let c = &*cq.cast::<AbiCq>();
        (c, inner(c.cqx.context))
    };
    let want = usize::try_from(num_entries).unwrap_or(0);
    let mut buf = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 16];
    let mut done = 0;
    while done < want {
        let n = (want - done).min(buf.len());
        let got = match i.verbs.poll_cq(c.handle, &mut buf[..n]) {
            Ok(g) => g,
            Err(_) if done == 0 => return -1,
            Err(_) => break,
        };
        for (k, w) in buf[..got].iter().enumerate() {
            // SAFETY: the caller's array of `num_entries` completions.
            unsafe { *wc.add(done + k) = wc_to_c(w) };
        }
        done += got;
        if got < n {
            break;
        }
    }
    done as c_int
}

// ---------------------------------------------------------------------------------------------
// SRQ.

/// ibv_create_srq(3); the granted `max_wr` / `max_sge` are written back.
///
/// # Safety
/// `pd` is from ibv_alloc_pd; `init` points to a `struct ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: the caller's promise.
    let (p, a) = unsafe { (&*pd.cast::<AbiPd>(), &mut *init) };
    // SAFETY: its context is open.
    let i = unsafe { inner(p.pd.context) };
    let attr = SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    match i.verbs.create_srq(p.handle, &attr) {
        Ok(handle) => {
            let mut srq = ibv_srq {
                context: p.pd.context,
                srq_context: a.srq_context,
                pd,
                handle: handle.index(),
                ..ibv_srq::default()
            };
            // SAFETY: fresh mutex and condition variable.
            unsafe {
                libc::pthread_mutex_init(ptr::from_mut(&mut srq.mutex).cast(), ptr::null());
                libc::pthread_cond_init(ptr::from_mut(&mut srq.cond).cast(), ptr::null());
            }
            let b = Box::into_raw(Box::new(AbiSrq { srq, handle }));
            lock(&i.srqs).insert(handle, b as usize);
            b.cast()
        }
        Err(e) => {
            set_errno(errno_of(&e));
            null_mut()
        }
    }
}
symver!(ibv_create_srq, "IBVERBS_1.1");

/// ibv_modify_srq(3).
///
/// # Safety
/// `srq` is from ibv_create_srq; `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's promise.
    let (s, a) = unsafe { (&*srq.cast::<AbiSrq>(), &*attr) };
    // SAFETY: its context is open.
    let i = unsafe { inner(s.srq.context) };
    let attr = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    match i
        .verbs
        .modify_srq(s.handle, &attr, SrqAttrMask::from_bits_retain(mask as u32))
    {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
symver!(ibv_modify_srq, "IBVERBS_1.1");

/// ibv_destroy_srq(3).
///
/// # Safety
/// `srq` is from ibv_create_srq.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: the caller's promise.
    let s = unsafe { &*srq.cast::<AbiSrq>() };
    // SAFETY: its context is open.
    let i = unsafe { inner(s.srq.context) };
    match i.verbs.destroy_srq(s.handle) {
        Ok(()) => {
            lock(&i.srqs).remove(&s.handle);
            // SAFETY: freed once, here.
            drop(unsafe { Box::from_raw(srq.cast::<AbiSrq>()) });
            0
        }
        Err(e) => errno_of(&e),
    }
}
symver!(ibv_destroy_srq, "IBVERBS_1.1");

/// Copies a C SGE list into `out`; `EINVAL` beyond [`MAX_SGE`].
///
/// # Safety
/// `list` has `n` entries.
pub(crate) unsafe fn sges(
    list: *const ibv_sge,
    n: c_int,
    out: &mut [Sge; MAX_SGE],
) -> Result<usize, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n > MAX_SGE {
        return Err(libc::EINVAL);
    }
    for (k, o) in out.iter_mut().enumerate().take(n) {
        // SAFETY: the caller's list of n entries.
        let s = unsafe { &*list.add(k) };
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(n)
}

pub(crate) const NO_SGE: Sge = Sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

unsafe extern "C" fn op_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's SRQ, an AbiSrq of an open context.
    let (s, i) = unsafe {
        let s = &*srq.cast::<AbiSrq>();
        (s, inner(s.srq.context))
    };
    let mut buf = [NO_SGE; MAX_SGE];
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: a WR of the caller's list.
        let r = unsafe { &*w };
        // SAFETY: its SGE list.
        let rc = match unsafe { sges(r.sg_list, r.num_sge, &mut buf) } {
            Ok(n) => i
                .verbs
                .post_srq_recv(
                    s.handle,
                    &RecvWr {
                        wr_id: r.wr_id,
                        sg_list: &buf[..n],
                    },
                )
                .map_err(|e| errno_of(&e)),
            Err(e) => Err(e),
        };
        if let Err(e) = rc {
            // SAFETY: the caller's out parameter.
            unsafe { *bad_wr = w };
            return e;
        }
        w = r.next;
    }
    0
}

// ---------------------------------------------------------------------------------------------
// QP.

/// ibv_create_qp(3); the granted capabilities are written back into `init->cap`.
///
/// # Safety
/// `pd` is from ibv_alloc_pd; `init` names CQs (and an SRQ) of the same context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the caller's promise.
    unsafe { create_qp(pd, init) }
}
symver!(ibv_create_qp, "IBVERBS_1.1");

/// ibv_create_qp(3)'s work, shared with ibv_create_qp_ex: an [`AbiQp`] without a builder.
///
/// # Safety
/// As [`ibv_create_qp`].
pub(crate) unsafe fn create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if pd.is_null() || init.is_null() {
        // rdma-core's would fault; a program that passes a missing PD gets EINVAL instead.
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's promise (both checked non-null).
    let (p, a) = unsafe { (&*pd.cast::<AbiPd>(), &mut *init) };
    // SAFETY: its context is open.
    let i = unsafe { inner(p.pd.context) };
    let qp_type = match a.qp_type {
        ibv_qp_type_IBV_QPT_RC => QpType::Rc,
        ibv_qp_type_IBV_QPT_UC => QpType::Uc,
        ibv_qp_type_IBV_QPT_UD => QpType::Ud,
        _ => {
            set_errno(libc::EOPNOTSUPP);
            return null_mut();
        }
    };
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's CQs and SRQ.
    let (send_cq, recv_cq, srq) = unsafe {
        (
            (*a.send_cq.cast::<AbiCq>()).handle,
            (*a.recv_cq.cast::<AbiCq>()).handle,
            (!a.srq.is_null()).then(|| (*a.srq.cast::<AbiSrq>()).handle),
        )
    };
    let attr = QpInitAttr {
        qp_type,
        send_cq,
        recv_cq,
        srq,
        cap: translate::qp_cap_from(&a.cap),
        sq_sig_all: a.sq_sig_all != 0,
    };
    let qpn = match i.verbs.create_qp(p.handle, &attr) {
        Ok(q) => q,
        Err(e) => {
            set_errno(errno_of(&e));
            return null_mut();
        }
    };
    let cap = i.verbs.query_qp(qpn).map_or(attr.cap, |(_, init)| init.cap);
    a.cap = translate::qp_cap(&cap);
    let mut qp = ibv_qp {
        context: p.pd.context,
        qp_context: a.qp_context,
        pd,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        handle: qpn,
        qp_num: qpn,
        state: ibv_qp_state_IBV_QPS_RESET,
        qp_type: a.qp_type,
        ..ibv_qp::default()
    };
    // SAFETY: fresh mutex and condition variable.
    unsafe {
        libc::pthread_mutex_init(ptr::from_mut(&mut qp.mutex).cast(), ptr::null());
        libc::pthread_cond_init(ptr::from_mut(&mut qp.cond).cast(), ptr::null());
    }
    let b = Box::into_raw(Box::new(AbiQp {
        qpx: ibv_qp_ex {
            qp_base: qp,
            ..ibv_qp_ex::default()
        },
        qp_type,
        builder: None,
        inline: Mutex::new(None),
    }));
    lock(&i.qps).insert(qpn, b as usize);
    b.cast()
}

/// ibv_modify_qp(3). PSNs are masked to 24 bits, as rxe and mlx5 do; the AV's flow label to its
/// 20 bits (see [`ibv_create_ah`]).
///
/// # Safety
/// `qp` is from ibv_create_qp; `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's promise.
    let (q, a) = unsafe { (&mut *qp.cast::<AbiQp>(), &*attr) };
    // SAFETY: its context is open.
    let i = unsafe { inner(q.qpx.qp_base.context) };
    let mut rust = translate::qp_attr_from(a);
    rust.sq_psn &= 0x00ff_ffff;
    rust.rq_psn &= 0x00ff_ffff;
    rust.ah_attr.flow_label &= FLOW_LABEL_MASK;
    let mask = QpAttrMask::from_bits_retain(mask as u32);
    match i.verbs.modify_qp(q.qpx.qp_base.qp_num, &rust, mask) {
        Ok(_) => {
            if mask.contains(QpAttrMask::STATE) {
                q.qpx.qp_base.state = a.qp_state;
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}
symver!(ibv_modify_qp, "IBVERBS_1.1");

/// ibv_query_qp(3).
///
/// # Safety
/// `qp` is from ibv_create_qp; `attr` and `init` are valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's promise.
    let q = unsafe { &mut *qp.cast::<AbiQp>() };
    // SAFETY: its context is open.
    let i = unsafe { inner(q.qpx.qp_base.context) };
    match i.verbs.query_qp(q.qpx.qp_base.qp_num) {
        Ok((a, ini)) => {
            let raw = translate::qp_attr(&a);
            q.qpx.qp_base.state = raw.qp_state;
            // SAFETY: the caller's out parameters.
            unsafe {
                *attr = raw;
                *init = ibv_qp_init_attr {
                    qp_context: q.qpx.qp_base.qp_context,
                    send_cq: q.qpx.qp_base.send_cq,
                    recv_cq: q.qpx.qp_base.recv_cq,
                    srq: q.qpx.qp_base.srq,
                    cap: translate::qp_cap(&ini.cap),
                    qp_type: q.qpx.qp_base.qp_type,
                    sq_sig_all: c_int::from(ini.sq_sig_all),
                };
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}
symver!(ibv_query_qp, "IBVERBS_1.1");

/// ibv_destroy_qp(3).
///
/// # Safety
/// `qp` is from ibv_create_qp.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the caller's promise.
    let q = unsafe { &*qp.cast::<AbiQp>() };
    // SAFETY: its context is open.
    let i = unsafe { inner(q.qpx.qp_base.context) };
    match i.verbs.destroy_qp(q.qpx.qp_base.qp_num) {
        Ok(()) => {
            lock(&i.qps).remove(&q.qpx.qp_base.qp_num);
            extended::drop_builder(q);
            // SAFETY: freed once, here.
            drop(unsafe { Box::from_raw(qp.cast::<AbiQp>()) });
            0
        }
        Err(e) => errno_of(&e),
    }
}
symver!(ibv_destroy_qp, "IBVERBS_1.1");

/// ibv_qp_to_qp_ex(3): the `struct ibv_qp_ex` of a QP made by ibv_create_qp_ex (the same
/// address: `qp_base` is its first field); null for one made by ibv_create_qp, as rdma-core.
///
/// # Safety
/// `qp` is from ibv_create_qp or ibv_create_qp_ex.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: the caller's QP, an AbiQp.
    match unsafe { qp.cast::<AbiQp>().as_ref() } {
        Some(q) if q.builder.is_some() => qp.cast(),
        _ => null_mut(),
    }
}
symver!(ibv_qp_to_qp_ex, "IBVERBS_1.6");

/// One C send WR as the Rust verbs take it.
///
/// # Safety
/// `r` is a valid WR (its AH, for UD, from ibv_create_ah).
pub(crate) unsafe fn send_op(r: &ibv_send_wr, qp_type: QpType) -> Result<SendOp, c_int> {
    // SAFETY: plain-data unions read as the opcode says.
    unsafe {
        let imm = u32::from_be(r.__bindgen_anon_1.imm_data);
        let rdma = r.wr.rdma;
        let atomic = r.wr.atomic;
        Ok(match r.opcode {
            ibv_wr_opcode_IBV_WR_SEND | ibv_wr_opcode_IBV_WR_SEND_WITH_IMM
                if qp_type == QpType::Ud =>
            {
                let ud = r.wr.ud;
                if ud.ah.is_null() {
                    return Err(libc::EINVAL);
                }
                SendOp::UdSend {
                    dest: UdDest {
                        ah: (*ud.ah.cast::<AbiAh>()).handle,
                        remote_qpn: ud.remote_qpn,
                        remote_qkey: ud.remote_qkey,
                    },
                    imm_data: (r.opcode == ibv_wr_opcode_IBV_WR_SEND_WITH_IMM).then_some(imm),
                }
            }
            ibv_wr_opcode_IBV_WR_SEND => SendOp::Send,
            ibv_wr_opcode_IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm_data: imm },
            ibv_wr_opcode_IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
                invalidate_rkey: r.__bindgen_anon_1.invalidate_rkey,
            },
            ibv_wr_opcode_IBV_WR_LOCAL_INV => SendOp::LocalInv {
                invalidate_rkey: r.__bindgen_anon_1.invalidate_rkey,
            },
            ibv_wr_opcode_IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            },
            ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
                imm_data: imm,
            },
            ibv_wr_opcode_IBV_WR_RDMA_READ => SendOp::RdmaRead {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            },
            ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpAndSwp {
                remote_addr: atomic.remote_addr,
                rkey: atomic.rkey,
                compare: atomic.compare_add,
                swap: atomic.swap,
            },
            ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAndAdd {
                remote_addr: atomic.remote_addr,
                rkey: atomic.rkey,
                add: atomic.compare_add,
            },
            _ => return Err(libc::EINVAL),
        })
    }
}

unsafe extern "C" fn op_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's QP, an AbiQp of an open context.
    let (q, i) = unsafe {
        let q = &*qp.cast::<AbiQp>();
        (q, inner(q.qpx.qp_base.context))
    };
    let mut buf = [NO_SGE; MAX_SGE];
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: a WR of the caller's list.
        let r = unsafe { &*w };
        // SAFETY: its SGE list and union fields.
        let rc = unsafe { sges(r.sg_list, r.num_sge, &mut buf) }.and_then(|n| {
            // SAFETY: as above.
            let op = unsafe { send_op(r, q.qp_type) }?;
            let post = |sg_list: &[Sge]| {
                i.verbs
                    .post_send(
                        q.qpx.qp_base.qp_num,
                        &SendWr {
                            wr_id: r.wr_id,
                            sg_list,
                            op,
                            send_flags: SendFlags::from_bits_retain(r.send_flags),
                        },
                    )
                    .map_err(|e| errno_of(&e))
            };
            if r.send_flags & ibv_send_flags_IBV_SEND_INLINE == 0 || n == 0 {
                return post(&buf[..n]);
            }
            // Inline data need not lie in an MR: post it from the QP's bounce buffer.
            let mut bounce = lock(&q.inline);
            if bounce.is_none() {
                // SAFETY: the QP's PD is an AbiPd of its context.
                let pd = unsafe { (*q.qpx.qp_base.pd.cast::<AbiPd>()).handle };
                *bounce = Some(InlineBounce::new(&i.verbs, pd)?);
            }
            let b = bounce.as_mut().ok_or(libc::EINVAL)?;
            // SAFETY: inline SGEs are readable at post time (ibv_post_send(3)).
            let sge = unsafe { b.gather(&buf[..n]) }?;
            post(&[sge])
        });
        if let Err(e) = rc {
            // SAFETY: the caller's out parameter.
            unsafe { *bad_wr = w };
            return e;
        }
        w = r.next;
    }
    0
}

unsafe extern "C" fn op_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's QP, an AbiQp of an open context.
    let (q, i) = unsafe {
        let q = &*qp.cast::<AbiQp>();
        (q, inner(q.qpx.qp_base.context))
    };
    let mut buf = [NO_SGE; MAX_SGE];
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: a WR of the caller's list.
        let r = unsafe { &*w };
        // SAFETY: its SGE list.
        let rc = unsafe { sges(r.sg_list, r.num_sge, &mut buf) }.and_then(|n| {
            i.verbs
                .post_recv(
                    q.qpx.qp_base.qp_num,
                    &RecvWr {
                        wr_id: r.wr_id,
                        sg_list: &buf[..n],
                    },
                )
                .map_err(|e| errno_of(&e))
        });
        if let Err(e) = rc {
            // SAFETY: the caller's out parameter.
            unsafe { *bad_wr = w };
            return e;
        }
        w = r.next;
    }
    0
}

// ---------------------------------------------------------------------------------------------
// AH.

/// The IPv6 flow label's 20 bits (RFC 8200 section 6; IBTA vol. 1 8.3.1 `FlowLabel`).
const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// ibv_create_ah(3): RoCE needs a GRH (`is_global`), else `EINVAL` as rxe. The GRH's flow label is
/// masked to its 20 bits: the kernel's uverbs and rxe take any `u32` there without a check, and
/// UCX (`uct_ib_iface_fill_ah_attr_from_gid_lid`, 1.13) passes `~0` on RoCE, whose low 20 bits
/// mlx5 turns into the UDP source port.
///
/// # Safety
/// `pd` is from ibv_alloc_pd; `attr` is valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: the caller's promise.
    let (p, a) = unsafe { (&*pd.cast::<AbiPd>(), &*attr) };
    // SAFETY: its context is open.
    let i = unsafe { inner(p.pd.context) };
    if a.is_global == 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let mut av = translate::ah_attr_from(a);
    av.flow_label &= FLOW_LABEL_MASK;
    boxed_or_null(i.verbs.create_ah(p.handle, &av), |handle| AbiAh {
        ah: ibv_ah {
            context: p.pd.context,
            pd,
            handle: handle.index(),
        },
        handle,
    })
}
symver!(ibv_create_ah, "IBVERBS_1.1");

/// ibv_destroy_ah(3).
///
/// # Safety
/// `ah` is from ibv_create_ah.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: the caller's promise.
    let h = unsafe { &*ah.cast::<AbiAh>() };
    // SAFETY: its context is open.
    let destroyed = unsafe { inner(h.ah.context) }.verbs.destroy_ah(h.handle);
    // SAFETY: an AbiAh from ibv_create_ah.
    unsafe { free_if_destroyed(destroyed, ah.cast::<AbiAh>()) }
}
symver!(ibv_destroy_ah, "IBVERBS_1.1");

// ---------------------------------------------------------------------------------------------
// Async events.

/// ibv_get_async_event(3): blocks on `context->async_fd` (unless non-blocking: -1, `EAGAIN`).
///
/// # Safety
/// `context` is open; `event` is valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    i.shared.dispatch();
    match i.async_events.pop() {
        Ok(ev) => {
            // SAFETY: the caller's out parameter.
            unsafe { *event = ev };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}
symver!(ibv_get_async_event, "IBVERBS_1.1");

/// ibv_ack_async_event(3).
#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}
symver!(ibv_ack_async_event, "IBVERBS_1.1");

// ---------------------------------------------------------------------------------------------
// Verbs the software HCA lacks: they fail as a provider without them fails.

/// ibv_attach_mcast(3): multicast is not supported (`EOPNOTSUPP`).
#[no_mangle]
pub extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_attach_mcast, "IBVERBS_1.1");

/// ibv_detach_mcast(3): `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_detach_mcast, "IBVERBS_1.1");

/// The index of the RoCEv2 GID `gid` in port 1's GID table of `context`'s device.
///
/// # Safety
/// `context` is open.
pub(crate) unsafe fn roce_v2_gid_index(context: *mut ibv_context, gid: &[u8; 16]) -> Option<u8> {
    // SAFETY: the caller's context.
    let i = unsafe { inner(context) };
    let len = i.verbs.query_port().gid_tbl_len.min(256);
    (0..len)
        .find(|&n| {
            i.verbs.query_gid(n).is_ok_and(|e| {
                e.gid_type == hca::verbs::gid::GidType::RoceV2 && e.gid.as_bytes() == gid
            })
        })
        .map(|n| n as u8)
}

/// The source and destination GIDs of the 40-byte GRH area a UD receive starts with: on
/// RoCEv2 either an IPv6 header, or 20 unused bytes and an IPv4 header (rdma-core `verbs.c`
/// `get_grh_header_version`: version 4, IHL 5, a valid header checksum), whose addresses are
/// IPv4-mapped (IBTA Annex A17.4.1). `None` for neither.
pub(crate) fn grh_gids(grh: &[u8; 40]) -> Option<([u8; 16], [u8; 16])> {
    let v4 = &grh[20..];
    let sum = v4
        .chunks(2)
        .fold(0u32, |a, c| a + u32::from(u16::from_be_bytes([c[0], c[1]])));
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    let mapped = |b: &[u8]| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(b);
        g
    };
    if v4[0] == 0x45 && sum == 0xffff {
        return Some((mapped(&v4[12..16]), mapped(&v4[16..20])));
    }
    if grh[0] >> 4 == 6 {
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&grh[8..24]);
        d.copy_from_slice(&grh[24..40]);
        return Some((s, d));
    }
    None
}

/// ibv_init_ah_from_wc(3): the address handle attributes that answer the sender of a UD
/// receive: `dgid` the packet's source GID, `sgid_index` the local GID it was sent to, hop
/// limit 0xFF, the traffic class and flow label of an IPv6 header (rdma-core `verbs.c`
/// `ibv_init_ah_from_wc` for RoCE, where every receive carries the GRH area). 0, or -1 with
/// errno `EINVAL` (port other than 1, a GRH area that is neither IPv4 nor IPv6, a destination
/// that is not a local RoCEv2 GID).
///
/// # Safety
/// `context` is open; `wc` readable; `grh` 40 readable bytes; `ah_attr` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    if context.is_null() || wc.is_null() || grh.is_null() || ah_attr.is_null() || port_num != 1 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's 40 bytes.
    let area = unsafe { &*grh.cast::<[u8; 40]>() };
    let Some((src, dst)) = grh_gids(area) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: the caller's context.
    let Some(sgid_index) = (unsafe { roce_v2_gid_index(context, &dst) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: the caller's structures; all-zero is a valid ibv_ah_attr.
    unsafe {
        let a = &mut *ah_attr;
        *a = zeroed();
        a.dlid = (*wc).slid;
        a.sl = (*wc).sl;
        a.src_path_bits = (*wc).dlid_path_bits;
        a.port_num = port_num;
        a.is_global = 1;
        a.grh.dgid.raw = src;
        a.grh.sgid_index = sgid_index;
        a.grh.hop_limit = 0xff;
        if area[0] >> 4 == 6 {
            let w = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
            a.grh.traffic_class = (w >> 20) as u8;
            a.grh.flow_label = w & 0xf_ffff;
        }
    }
    0
}
symver!(ibv_init_ah_from_wc, "IBVERBS_1.1");

/// ibv_create_ah_from_wc(3): [`ibv_init_ah_from_wc`] then [`ibv_create_ah`]; null with errno.
///
/// # Safety
/// `pd` is a live PD; as [`ibv_init_ah_from_wc`] for the rest.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut attr: ibv_ah_attr = unsafe { zeroed() };
    // SAFETY: the caller's promise.
    if unsafe { ibv_init_ah_from_wc((*pd).context, port_num, wc, grh, &mut attr) } != 0 {
        return null_mut();
    }
    // SAFETY: a live PD and the attributes just made.
    unsafe { ibv_create_ah(pd, &mut attr) }
}
symver!(ibv_create_ah_from_wc, "IBVERBS_1.1");

/// ibv_resize_cq(3): `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_resize_cq(_cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_resize_cq, "IBVERBS_1.1");

/// ibv_query_ece(3): `EOPNOTSUPP` (as rxe).
#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_query_ece, "IBVERBS_1.10");

/// ibv_set_ece(3): `EOPNOTSUPP` (as rxe).
#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}
symver!(ibv_set_ece, "IBVERBS_1.10");

// ---------------------------------------------------------------------------------------------
// Strings (rdma-core's texts).

fn table_str(table: &'static [&'static CStr], i: c_int, other: &'static CStr) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .unwrap_or(&other)
        .as_ptr()
}

/// ibv_wc_status_str(3).
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    table_str(T, status, c"unknown")
}
symver!(ibv_wc_status_str, "IBVERBS_1.1");

/// ibv_port_state_str(3).
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"PORT_NOP",
        c"PORT_DOWN",
        c"PORT_INIT",
        c"PORT_ARMED",
        c"PORT_ACTIVE",
        c"PORT_ACTIVE_DEFER",
    ];
    table_str(T, state, c"invalid state")
}
symver!(ibv_port_state_str, "IBVERBS_1.1");

/// ibv_node_type_str(3).
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"unknown",
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    table_str(T, node_type, c"unknown")
}
symver!(ibv_node_type_str, "IBVERBS_1.1");

/// ibv_event_type_str(3).
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    table_str(T, event, c"unknown")
}
symver!(ibv_event_type_str, "IBVERBS_1.1");

#[cfg(test)]
mod grh_test {
    use super::grh_gids;

    #[test]
    fn ipv4_header_in_the_last_20_bytes() {
        let mut g = [0u8; 40];
        let h = &mut g[20..];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&[10, 0, 0, 1]);
        h[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let sum = h
            .chunks(2)
            .fold(0u32, |a, c| a + u32::from(u16::from_be_bytes([c[0], c[1]])));
        let sum = (sum & 0xffff) + (sum >> 16);
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        let (s, d) = grh_gids(&g).unwrap();
        assert_eq!(s[10..], [0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(d[10..], [0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(s[..10], [0; 10]);
        // A wrong checksum is not an IPv4 header (nor, with version 0, an IPv6 one).
        g[30] ^= 1;
        assert_eq!(grh_gids(&g), None);
    }

    #[test]
    fn ipv6_header() {
        let mut g = [0u8; 40];
        g[0] = 0x60;
        g[8..24].copy_from_slice(&[0xfd; 16]);
        g[24..40].copy_from_slice(&[0xfe; 16]);
        assert_eq!(grh_gids(&g), Some(([0xfd; 16], [0xfe; 16])));
        assert_eq!(grh_gids(&[0; 40]), None);
    }
}
