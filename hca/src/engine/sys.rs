//! The engine's only `unsafe` code: a view of registered host memory in place, for zero-copy
//! transmit (module `tx`). Everything else reaches MR memory through [`gpu_p2p::Memory`]'s copies.
#![allow(unsafe_code)]

use gpu_p2p::{HostPtr, Memory};

/// The bytes `[offset, offset + len)` of `memory`, whose CPU address is `base`.
///
/// Panics never; returns an empty slice if the range is not inside `memory` (callers check it
/// when they build a segment).
pub(super) fn host_bytes(memory: &dyn Memory, base: HostPtr, offset: usize, len: usize) -> &[u8] {
    if gpu_p2p::check_range(offset, len, memory.len()).is_err() || len == 0 {
        return &[];
    }
    // SAFETY: `base` came from `memory.host_ptr()`, so by `HostPtr`'s contract it addresses
    // `memory.len()` CPU-readable bytes that stay in place while `memory` lives; the returned
    // slice borrows `memory`, and `[offset, offset + len)` lies inside it (checked above). The
    // bytes may be written meanwhile by the program or by a peer's RDMA WRITE through
    // `Memory::write` on another thread: the reader (the ICRC, the kernel through an iovec) then
    // sees some mix of old and new bytes, the same outcome a NIC's DMA read has, and the
    // transport recovers (the peer drops the packet on its ICRC; RC resends it). This is the
    // access model of `gpu_p2p` (see its crate docs), as `HostMemory::read` copies racing bytes.
    unsafe { core::slice::from_raw_parts(base.as_ptr().as_ptr().add(offset), len) }
}
