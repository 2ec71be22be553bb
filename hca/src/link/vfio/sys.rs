//! The raw system calls of the VFIO driver: every `ioctl`, `mmap` and MMIO access, and the sysfs
//! reads. With `sys_fake.rs` (unit tests) this is the only place the driver touches the kernel.
//!
//! Each function wraps one call behind a safe signature (except [`dma_map`], whose caller must keep
//! the memory alive) and returns [`io::Error`] with the errno kept. Nothing here decides policy.
//! The structures come from `vfio-bindings` (bindgen output of `linux/vfio.h`); the ioctl numbers
//! are `_IO(VFIO_TYPE, VFIO_BASE + n)` as `linux/vfio.h` defines them (the bindings carry
//! `VFIO_TYPE` and `VFIO_BASE` but not the `_IO` macros, which bindgen cannot translate).
//!
//! Sources: `Documentation/driver-api/vfio.rst`, `include/uapi/linux/vfio.h` (Linux 5.0+),
//! ioctl(2), mmap(2), pread(2); rust-vmm `vfio-ioctls` (`vfio_ioctls.rs`) for the same calls.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};
use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap,
    vfio_iommu_type1_info, vfio_irq_info, vfio_irq_set, vfio_region_info, VFIO_BASE,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_TYPE,
};
use volatile::VolatilePtr;

/// An open VFIO file: the container (`/dev/vfio/vfio`), a group (`/dev/vfio/<n>`) or a device.
pub(crate) type Fd = File;

/// `_IOC_NONE` in the `_IO` encoding of this architecture (`include/uapi/asm-generic/ioctl.h`;
/// powerpc, mips and sparc put a 1 in the direction bits for "none").
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const IOC_NONE: u32 = 1 << 29;
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const IOC_NONE: u32 = 0;

/// `_IO(VFIO_TYPE, VFIO_BASE + nr)`: VFIO ioctls carry no size in their number (the structures
/// start with `argsz` instead).
const fn vfio_io(nr: u32) -> u32 {
    IOC_NONE | (VFIO_TYPE << 8) | (VFIO_BASE + nr)
}

const VFIO_GET_API_VERSION: u32 = vfio_io(0);
const VFIO_CHECK_EXTENSION: u32 = vfio_io(1);
const VFIO_SET_IOMMU: u32 = vfio_io(2);
const VFIO_GROUP_GET_STATUS: u32 = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: u32 = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: u32 = vfio_io(6);
const VFIO_DEVICE_GET_INFO: u32 = vfio_io(7);
const VFIO_DEVICE_GET_REGION_INFO: u32 = vfio_io(8);
const VFIO_DEVICE_GET_IRQ_INFO: u32 = vfio_io(9);
const VFIO_DEVICE_SET_IRQS: u32 = vfio_io(10);
const VFIO_IOMMU_GET_INFO: u32 = vfio_io(12);
const VFIO_IOMMU_MAP_DMA: u32 = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: u32 = vfio_io(14);

/// `ioctl(fd, request, arg)` with the return value checked: `Err(errno)` when negative.
///
/// # Safety
/// `arg` must be what `request` expects on `fd`: a value, or a pointer to a live structure of the
/// right type and `argsz`, writable when the kernel writes it.
unsafe fn ioctl(fd: &Fd, request: u32, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the caller guarantees that `arg` matches `request`; `fd` is an open file.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The `argsz` of a VFIO structure.
fn argsz<T>() -> u32 {
    mem::size_of::<T>() as u32
}

// ---------------------------------------------------------------- sysfs

/// Whether `/sys/bus/pci/devices/<addr>` exists.
pub(crate) fn pci_device_exists(addr: &str) -> bool {
    Path::new("/sys/bus/pci/devices").join(addr).exists()
}

/// The last path component of a symlink's target; `None` when the link does not exist.
fn link_name(path: &Path) -> io::Result<Option<String>> {
    match std::fs::read_link(path) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The driver the device is bound to (`/sys/bus/pci/devices/<addr>/driver`), if any.
pub(crate) fn pci_driver(addr: &str) -> io::Result<Option<String>> {
    link_name(&Path::new("/sys/bus/pci/devices").join(addr).join("driver"))
}

/// The device's IOMMU group number (`/sys/bus/pci/devices/<addr>/iommu_group`), if it has one.
pub(crate) fn pci_iommu_group(addr: &str) -> io::Result<Option<u32>> {
    let name = link_name(
        &Path::new("/sys/bus/pci/devices")
            .join(addr)
            .join("iommu_group"),
    )?;
    Ok(name.and_then(|n| n.parse().ok()))
}

// ---------------------------------------------------------------- container and group

fn open_rw(path: &str) -> io::Result<Fd> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Opens a new container, `/dev/vfio/vfio`.
pub(crate) fn open_container() -> io::Result<Fd> {
    open_rw("/dev/vfio/vfio")
}

/// Opens group `group`, `/dev/vfio/<group>`.
pub(crate) fn open_group(group: u32) -> io::Result<Fd> {
    open_rw(&format!("/dev/vfio/{group}"))
}

/// `VFIO_GET_API_VERSION`.
pub(crate) fn get_api_version(container: &Fd) -> io::Result<i32> {
    // SAFETY: VFIO_GET_API_VERSION takes no argument.
    unsafe { ioctl(container, VFIO_GET_API_VERSION, 0) }
}

/// `VFIO_CHECK_EXTENSION`: whether the container supports IOMMU type / extension `ext`.
pub(crate) fn check_extension(container: &Fd, ext: u32) -> io::Result<bool> {
    // SAFETY: VFIO_CHECK_EXTENSION takes the extension number by value.
    unsafe { ioctl(container, VFIO_CHECK_EXTENSION, libc::c_ulong::from(ext)) }.map(|r| r > 0)
}

/// `VFIO_SET_IOMMU`: the container's IOMMU model (needs a group attached first).
pub(crate) fn set_iommu(container: &Fd, iommu_type: u32) -> io::Result<()> {
    // SAFETY: VFIO_SET_IOMMU takes the IOMMU type by value.
    unsafe { ioctl(container, VFIO_SET_IOMMU, libc::c_ulong::from(iommu_type)) }.map(|_| ())
}

/// `VFIO_IOMMU_GET_INFO` (the fixed part: flags and supported page sizes).
pub(crate) fn iommu_get_info(container: &Fd) -> io::Result<vfio_iommu_type1_info> {
    let mut info = vfio_iommu_type1_info {
        argsz: argsz::<vfio_iommu_type1_info>(),
        ..Default::default()
    };
    // SAFETY: `info` is a live, writable vfio_iommu_type1_info whose argsz is its size.
    unsafe {
        ioctl(
            container,
            VFIO_IOMMU_GET_INFO,
            &mut info as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(info)
}

/// `VFIO_GROUP_GET_STATUS`.
pub(crate) fn group_get_status(group: &Fd) -> io::Result<vfio_group_status> {
    let mut status = vfio_group_status {
        argsz: argsz::<vfio_group_status>(),
        flags: 0,
    };
    // SAFETY: `status` is a live, writable vfio_group_status whose argsz is its size.
    unsafe {
        ioctl(
            group,
            VFIO_GROUP_GET_STATUS,
            &mut status as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(status)
}

/// `VFIO_GROUP_SET_CONTAINER`: attaches the group to the container.
pub(crate) fn group_set_container(group: &Fd, container: &Fd) -> io::Result<()> {
    let fd: libc::c_int = container.as_raw_fd();
    // SAFETY: the argument is a pointer to a live int holding the container's fd.
    unsafe {
        ioctl(
            group,
            VFIO_GROUP_SET_CONTAINER,
            &fd as *const libc::c_int as libc::c_ulong,
        )
    }
    .map(|_| ())
}

/// `VFIO_GROUP_GET_DEVICE_FD` for the device named `name` (its PCI address).
pub(crate) fn group_get_device_fd(group: &Fd, name: &str) -> io::Result<Fd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in device name"))?;
    // SAFETY: the argument is a pointer to a NUL-terminated string that outlives the call.
    let fd = unsafe {
        ioctl(
            group,
            VFIO_GROUP_GET_DEVICE_FD,
            cname.as_ptr() as libc::c_ulong,
        )
    }?;
    // SAFETY: on success the ioctl returned a new file descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

// ---------------------------------------------------------------- device

/// `VFIO_DEVICE_GET_INFO`.
pub(crate) fn device_get_info(device: &Fd) -> io::Result<vfio_device_info> {
    let mut info = vfio_device_info {
        argsz: argsz::<vfio_device_info>(),
        ..Default::default()
    };
    // SAFETY: `info` is a live, writable vfio_device_info whose argsz is its size.
    unsafe {
        ioctl(
            device,
            VFIO_DEVICE_GET_INFO,
            &mut info as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(info)
}

/// `VFIO_DEVICE_GET_REGION_INFO` for region `index` (the fixed part; capabilities not read).
pub(crate) fn device_get_region_info(device: &Fd, index: u32) -> io::Result<vfio_region_info> {
    let mut info = vfio_region_info {
        argsz: argsz::<vfio_region_info>(),
        index,
        ..Default::default()
    };
    // SAFETY: `info` is a live, writable vfio_region_info whose argsz is its size.
    unsafe {
        ioctl(
            device,
            VFIO_DEVICE_GET_REGION_INFO,
            &mut info as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(info)
}

/// Reads `buf.len()` bytes of a device region at file offset `offset` (pread(2)).
pub(crate) fn region_read(device: &Fd, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    device.read_exact_at(buf, offset)
}

/// Writes `buf` to a device region at file offset `offset` (pwrite(2)).
pub(crate) fn region_write(device: &Fd, offset: u64, buf: &[u8]) -> io::Result<()> {
    device.write_all_at(buf, offset)
}

/// Maps `len` bytes of a device region (a BAR) at file offset `offset`, shared and read-write.
pub(crate) fn map_region(device: &Fd, offset: u64, len: usize) -> io::Result<Mmio> {
    let map = MmapOptions::new().offset(offset).len(len).map_raw(device)?;
    Ok(Mmio { map, len })
}

// ---------------------------------------------------------------- interrupts

/// `VFIO_DEVICE_GET_IRQ_INFO` for interrupt index `index` (2: MSI-X).
pub(crate) fn device_get_irq_info(device: &Fd, index: u32) -> io::Result<vfio_irq_info> {
    let mut info = vfio_irq_info {
        argsz: argsz::<vfio_irq_info>(),
        index,
        ..Default::default()
    };
    // SAFETY: `info` is a live, writable vfio_irq_info whose argsz is its size.
    unsafe {
        ioctl(
            device,
            VFIO_DEVICE_GET_IRQ_INFO,
            &mut info as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(info)
}

/// `VFIO_DEVICE_SET_IRQS` with `ACTION_TRIGGER`: vectors `0..fds.len()` of interrupt `index`
/// signal the eventfds `fds` (for MSI-X this enables MSI-X on the device); with no fds, all of
/// them are disabled (`DATA_NONE`, count 0).
pub(crate) fn device_set_irq_eventfds(device: &Fd, index: u32, fds: &[&Fd]) -> io::Result<()> {
    let header = size_of_irq_set();
    let argsz = header + 4 * fds.len();
    // The structure is followed by `count` int32 fds; build it in u32 words (4-byte aligned, as
    // the structure's fields are).
    let mut words = vec![0u32; argsz.div_ceil(4)];
    let flags = if fds.is_empty() {
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER
    } else {
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER
    };
    // argsz, flags, index, start, count (struct vfio_irq_set), then the data.
    words[0] = argsz as u32;
    words[1] = flags;
    words[2] = index;
    words[3] = 0;
    words[4] = fds.len() as u32;
    for (i, fd) in fds.iter().enumerate() {
        words[header / 4 + i] = fd.as_raw_fd() as u32;
    }
    // SAFETY: `words` holds a vfio_irq_set header (20 bytes, 4-aligned) followed by `count` fds,
    // `argsz` bytes in all, alive for the call.
    unsafe {
        ioctl(
            device,
            VFIO_DEVICE_SET_IRQS,
            words.as_ptr() as libc::c_ulong,
        )
    }
    .map(|_| ())
}

fn size_of_irq_set() -> usize {
    mem::size_of::<vfio_irq_set>()
}

/// A new eventfd (eventfd(2)), non-blocking, close-on-exec: what VFIO signals an interrupt on.
pub(crate) fn eventfd() -> io::Result<Fd> {
    // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Waits until the eventfd is signalled or `timeout` passes (poll(2)), then clears its counter;
/// returns whether it was signalled.
pub(crate) fn eventfd_wait(fd: &Fd, timeout: std::time::Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfd` is one live pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if r == 0 {
        return Ok(false);
    }
    let mut count = [0u8; 8];
    // A non-blocking read of the 8-byte counter resets it; EAGAIN (already read) is fine.
    let _ = std::io::Read::read(&mut &*fd, &mut count);
    Ok(true)
}

/// Waits until the eventfd `fd` or the descriptor `other` (a waker) is readable or `timeout`
/// passes (poll(2), rounded up to milliseconds), then clears `fd`'s counter if it was signalled;
/// returns whether `fd` was. `other` is left for its owner to read.
pub(crate) fn eventfd_wait_or(
    fd: &Fd,
    other: std::os::fd::BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> io::Result<bool> {
    let mut pfds = [
        libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: other.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfds` is a live array of two pollfd entries; the kernel writes only `revents`.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if pfds[0].revents & libc::POLLIN == 0 {
        return Ok(false);
    }
    let mut count = [0u8; 8];
    // A non-blocking read of the 8-byte counter resets it; EAGAIN (already read) is fine.
    let _ = std::io::Read::read(&mut &*fd, &mut count);
    Ok(true)
}

// ---------------------------------------------------------------- IOMMU

/// `VFIO_IOMMU_MAP_DMA`: makes `[vaddr, vaddr + size)` reachable by the device at I/O virtual
/// address `iova`, readable and/or writable by it. The kernel pins the pages.
///
/// # Safety
/// `[vaddr, vaddr + size)` must stay mapped in this process (and not be reused for anything the
/// device must not touch) until [`dma_unmap`] of the same range returns.
pub(crate) unsafe fn dma_map(
    container: &Fd,
    vaddr: *mut u8,
    iova: u64,
    size: u64,
    read: bool,
    write: bool,
) -> io::Result<()> {
    let mut flags = 0;
    if read {
        flags |= VFIO_DMA_MAP_FLAG_READ;
    }
    if write {
        flags |= VFIO_DMA_MAP_FLAG_WRITE;
    }
    let map = vfio_iommu_type1_dma_map {
        argsz: argsz::<vfio_iommu_type1_dma_map>(),
        flags,
        vaddr: vaddr as u64,
        iova,
        size,
    };
    // SAFETY: `map` is a live vfio_iommu_type1_dma_map whose argsz is its size; the caller keeps
    // the memory it names alive until it is unmapped.
    unsafe {
        ioctl(
            container,
            VFIO_IOMMU_MAP_DMA,
            &map as *const _ as libc::c_ulong,
        )
    }
    .map(|_| ())
}

/// mlock(2) of the pages of `[addr, addr + len)` (page-aligned): they stay in RAM (no swap-out)
/// until [`munlock`].
///
/// # Errors
/// ENOMEM / EPERM past `RLIMIT_MEMLOCK`, ENOMEM for a range not mapped in this process.
pub(crate) fn mlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: mlock(2) reads no memory through the pointer; it fails with ENOMEM for a range
    // this process has not mapped.
    if unsafe { libc::mlock(addr as *const libc::c_void, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// munlock(2) of the pages of `[addr, addr + len)`.
///
/// # Errors
/// ENOMEM for a range not mapped in this process.
pub(crate) fn munlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: as for `mlock`.
    if unsafe { libc::munlock(addr as *const libc::c_void, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `VFIO_IOMMU_UNMAP_DMA` of `[iova, iova + size)`; returns the bytes the kernel unmapped (0
/// when nothing was mapped there).
pub(crate) fn dma_unmap(container: &Fd, iova: u64, size: u64) -> io::Result<u64> {
    let mut unmap = vfio_iommu_type1_dma_unmap {
        argsz: argsz::<vfio_iommu_type1_dma_unmap>(),
        flags: 0,
        iova,
        size,
    };
    // SAFETY: `unmap` is a live, writable vfio_iommu_type1_dma_unmap whose argsz is its size.
    unsafe {
        ioctl(
            container,
            VFIO_IOMMU_UNMAP_DMA,
            &mut unmap as *mut _ as libc::c_ulong,
        )
    }?;
    Ok(unmap.size)
}

// ---------------------------------------------------------------- MMIO

/// A BAR mapped into this process: device registers, accessed only by volatile loads and stores
/// of their own width, bounds- and alignment-checked (`None` when the access is outside).
#[derive(Debug)]
pub(crate) struct Mmio {
    map: MmapRaw,
    len: usize,
}

// SAFETY: the mapping is device memory owned by this value; accesses are volatile single loads
// and stores, which any thread may make (the driver serialises them through `&mut` anyway).
unsafe impl Send for Mmio {}

impl Mmio {
    /// Length of the window in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A pointer to the `T` at `offset`, if it lies inside and is aligned.
    fn at<T>(&self, offset: usize) -> Option<NonNull<T>> {
        let size = mem::size_of::<T>();
        if offset.checked_add(size)? > self.len || offset % size != 0 {
            return None;
        }
        // The mapping starts on a page boundary, so `offset % size == 0` aligns the pointer.
        NonNull::new(self.map.as_mut_ptr().wrapping_add(offset).cast::<T>())
    }

    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let p = self.at::<T>(offset)?;
        // SAFETY: `p` is aligned and inside the live mapping (checked by `at`); device registers
        // are read with one volatile load of their width.
        Some(unsafe { VolatilePtr::new_read_only(p) }.read())
    }

    fn write<T: Copy>(&self, offset: usize, value: T) -> Option<()> {
        let p = self.at::<T>(offset)?;
        // SAFETY: as in `read`; one volatile store of the register's width.
        unsafe { VolatilePtr::new(p) }.write(value);
        Some(())
    }

    /// Reads the 8-bit register at `offset`.
    pub(crate) fn read8(&self, offset: usize) -> Option<u8> {
        self.read(offset)
    }
    /// Reads the little-endian 16-bit register at `offset`.
    pub(crate) fn read16(&self, offset: usize) -> Option<u16> {
        self.read::<u16>(offset).map(u16::from_le)
    }
    /// Reads the little-endian 32-bit register at `offset`.
    pub(crate) fn read32(&self, offset: usize) -> Option<u32> {
        self.read::<u32>(offset).map(u32::from_le)
    }
    /// Writes the 8-bit register at `offset`.
    pub(crate) fn write8(&self, offset: usize, value: u8) -> Option<()> {
        self.write(offset, value)
    }
    /// Writes the little-endian 16-bit register at `offset`.
    pub(crate) fn write16(&self, offset: usize, value: u16) -> Option<()> {
        self.write(offset, value.to_le())
    }
    /// Writes the little-endian 32-bit register at `offset`.
    pub(crate) fn write32(&self, offset: usize, value: u32) -> Option<()> {
        self.write(offset, value.to_le())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers `linux/vfio.h` gives (`_IO(';', 100 + n)` on x86-64 and aarch64).
    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn ioctl_numbers_match_linux() {
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_CHECK_EXTENSION, 0x3b65);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_GET_STATUS, 0x3b67);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 0x3b68);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_GET_INFO, 0x3b6b);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(VFIO_DEVICE_GET_IRQ_INFO, 0x3b6d);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(size_of_irq_set(), 20);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3b70);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
    }
}
