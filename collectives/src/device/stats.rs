//! [`DevicePathStats`]: which path a communicator's device all-reduces took. A leaf module: the
//! [`Communicator`](crate::Communicator) holds the counts, the device collectives bump them.

/// Which path this communicator's device all-reduces (`all_reduce_mem`, `all_reduce_mem_in_place`)
/// took: counts of calls, and why the last staged one did not take the GPU peer-to-peer path.
/// `coll-perf --device` prints it, so a run shows which path it measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicePathStats {
    /// Calls that took the GPU peer-to-peer path (CUDA IPC between the rank processes).
    pub gpu_p2p: u64,
    /// Calls staged through host memory.
    pub staged: u64,
    /// Why the last staged call was staged (one line), if one was.
    pub last_fallback: Option<String>,
}
