//! The raw OS calls of the local rank spawner ([`super::spawn`]), all in one place.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the process `cmd` starts die (SIGKILL) when the thread that starts it exits, however
/// that thread's process ends (Ctrl-C to it alone, SIGKILL, a panic): `prctl(PR_SET_PDEATHSIG)`
/// in the child between fork and exec (prctl(2), "PR_SET_PDEATHSIG"). The race of a parent that
/// dies before the child has set it is closed by re-checking `getppid()` afterwards: when it no
/// longer is the parent's pid (the child was re-parented), the child exits at once (status 129)
/// instead of running orphaned.
///
/// The signal is tied to the *thread* that forks (prctl(2)): call this on a thread that lives as
/// long as the children should (the spawner's main thread).
pub(crate) fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    let hook = move || -> io::Result<()> {
        // SAFETY: between fork and exec only async-signal-safe calls are allowed; prctl,
        // getppid and _exit are (signal-safety(7)). No memory is allocated or shared state
        // touched; the arguments are plain integers.
        unsafe {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(129);
            }
        }
        Ok(())
    };
    // SAFETY: the hook above runs in the forked child before exec and only makes
    // async-signal-safe calls (see there), as `CommandExt::pre_exec` requires.
    unsafe {
        cmd.pre_exec(hook);
    }
}
