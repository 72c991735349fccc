//! What the store asks the operating system: is a process alive, may this
//! process write to a path, and where does this process run (host name,
//! machine identity, PID namespace). The first two are plain libc calls on
//! valid arguments; this is the crate's only `unsafe`.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether the process `pid` on this host is gone: `kill(pid, 0)` fails with
/// `ESRCH`, or it is a zombie waiting to be reaped. `None` when the answer is
/// not knowable (a pid that could name a process group).
pub(crate) fn process_is_gone(pid: i64) -> Option<bool> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
    // SAFETY: signal 0 only checks that `pid` (> 0, so a single process, never
    // a group) exists and may be signalled; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        // EPERM means the process exists under another user.
        return Some(io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH));
    }
    Some(is_zombie(pid))
}

/// A crashed process whose parent has not reaped it still answers `kill`; its
/// `/proc` state says it is dead.
fn is_zombie(pid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may hold spaces.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// Whether this process may write to `path` (`access(path, W_OK)`): false for
/// permissions and for read-only file systems, without writing anything.
pub(crate) fn writable(path: &Path) -> Result<(), io::Error> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::access(c.as_ptr(), libc::W_OK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This host's name, as recorded on owners and compared by recovery.
pub(crate) fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// This machine's identity: `/etc/machine-id` (stable across boots), else the
/// boot id (`/proc/sys/kernel/random/boot_id`, new at every boot). `None` when
/// neither can be read.
pub(crate) fn machine_id() -> Option<String> {
    ["/etc/machine-id", "/proc/sys/kernel/random/boot_id"]
        .iter()
        .find_map(|p| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
}

/// This process's PID namespace: the inode of `/proc/self/ns/pid`. Two
/// processes see the same pids only in the same namespace (two containers on
/// one machine do not).
pub(crate) fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}
