//! Host identity: which ranks can share memory.
//!
//! NCCL hashes the host name and the kernel's boot id (`getHostHash`). This crate hashes the host
//! name, the boot id (`/proc/sys/kernel/random/boot_id`) and, where present, `/etc/machine-id`:
//! two containers on one machine share the boot id and usually the machine id but have their own
//! host names (and their own `/dev/shm`), so they get different ids and talk over the network, as
//! they must. `COLL_HOSTID` overrides the whole id (NCCL's `NCCL_HOSTID`), e.g. to force two
//! containers that do share `/dev/shm` onto the shared-memory path.

use core::fmt;

/// A 64-bit host identity (FNV-1a of the sources above).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostId(pub u64);

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// 64-bit FNV-1a.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// This machine's host name (`uname -n`), or `localhost` if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The host id from explicit sources (see the module docs).
pub fn host_id_from(
    override_id: Option<&str>,
    hostname: &str,
    boot_id: Option<&str>,
    machine_id: Option<&str>,
) -> HostId {
    if let Some(id) = override_id {
        return HostId(fnv1a(&[b"override", id.trim().as_bytes()]));
    }
    HostId(fnv1a(&[
        hostname.as_bytes(),
        boot_id.map(str::trim).unwrap_or("").as_bytes(),
        machine_id.map(str::trim).unwrap_or("").as_bytes(),
    ]))
}

/// This process's host id.
pub fn host_id() -> HostId {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    host_id_from(
        std::env::var("COLL_HOSTID").ok().as_deref(),
        &hostname(),
        read("/proc/sys/kernel/random/boot_id").as_deref(),
        read("/etc/machine-id").as_deref(),
    )
}

/// The state letter of process `pid` in /proc/PID/stat (proc(5): `R` running, `S` sleeping,
/// `T` stopped by a signal, `t` stopped by a tracer, `Z` zombie, ...), `None` if it is gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may itself hold ") ": the state follows the last one.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_separate_hosts_and_honour_the_override() {
        let a = host_id_from(None, "node1", Some("boot\n"), Some("m"));
        assert_eq!(a, host_id_from(None, "node1", Some("boot"), Some("m\n")));
        assert_ne!(a, host_id_from(None, "node2", Some("boot"), Some("m")));
        assert_ne!(a, host_id_from(None, "node1", Some("boot2"), Some("m")));
        let o = host_id_from(Some("rack7"), "node1", None, None);
        assert_eq!(o, host_id_from(Some("rack7"), "node2", Some("x"), None));
        assert_eq!(host_id(), host_id());
        assert!(!hostname().is_empty());
    }
}
