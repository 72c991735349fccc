//! Child processes under the lifecycle: a shell command an agent runs, a
//! browser it drives. Run one inside a task ([`SessionHandle::spawn`]) with
//! [`run`], and its teardown follows the session's:
//!
//! - it runs in a process group of its own, so its own children go with it;
//! - when the task is cancelled, the group gets SIGTERM and the task waits
//!   for the process to exit (bounded by the settle timeout);
//! - when the task is detached at its settle deadline (the process ignored
//!   SIGTERM), the group gets SIGKILL;
//! - the process is always reaped: never a zombie.
//!
//! [`SessionHandle::spawn`]: crate::SessionHandle::spawn
//!
//! ```no_run
//! # async fn tool(session: settle_runtime::SessionHandle) -> Result<(), Box<dyn std::error::Error>> {
//! use settle_runtime::process;
//!
//! let listing = session
//!     .spawn(|ctx| async move {
//!         let mut ls = tokio::process::Command::new("ls");
//!         ls.arg("-l");
//!         process::output(&ctx, ls).await
//!     })
//!     .await?;
//! let output = listing.join().await??;
//! println!("{}", String::from_utf8_lossy(&output.stdout));
//! # Ok(()) }
//! ```

use std::io;
use std::process::{ExitStatus, Output, Stdio};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::task_context::TaskContext;

/// A child process and its group, killed and reaped however it is left.
struct Group {
    child: Child,
    pgid: Option<Pid>,
    reaped: bool,
}

impl Group {
    fn spawn(mut command: Command) -> io::Result<Group> {
        command.process_group(0).kill_on_drop(true);
        let child = command.spawn()?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        Ok(Group {
            child,
            pgid,
            reaped: false,
        })
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH (the group is gone already) is not an error here.
            let _ = killpg(pgid, signal);
        }
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await;
        self.reaped = status.is_ok();
        status
    }

    /// Runs the process to its end, giving way to the task's cancel: SIGTERM
    /// to the group, then waiting for it (the settle deadline bounds that).
    async fn run(&mut self, ctx: &TaskContext) -> io::Result<ExitStatus> {
        tokio::select! {
            status = self.wait() => status,
            () = ctx.cancelled() => {
                self.signal(Signal::SIGTERM);
                self.wait().await
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Whatever of the group is left goes: stragglers of a process that
        // exited, or the whole group of a task detached or dropped mid-way.
        self.signal(Signal::SIGKILL);
        if !self.reaped {
            let _ = self.child.start_kill();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                // Reap it, so it never lingers as a zombie.
                let pid = self.child.id();
                runtime.spawn_blocking(move || reap(pid));
            }
        }
    }
}

/// Waits for `pid` to be gone (blocking), so a killed child is reaped even
/// when its `Child` was dropped.
fn reap(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
}

/// Runs `command` as a child process of the task `ctx`, in a process group of
/// its own, and returns its exit status. On the task's cancel the group gets
/// SIGTERM; if the task is detached (the process ignored it past the settle
/// timeout), the group gets SIGKILL; the process is reaped on every path.
///
/// # Errors
/// When the process cannot be started or waited for.
pub async fn run(ctx: &TaskContext, command: Command) -> io::Result<ExitStatus> {
    Group::spawn(command)?.run(ctx).await
}

/// Like [`run`], and collects what the process wrote on stdout and stderr.
///
/// # Errors
/// When the process cannot be started or waited for.
pub async fn output(ctx: &TaskContext, mut command: Command) -> io::Result<Output> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut group = Group::spawn(command)?;
    let mut stdout = group.child.stdout.take();
    let mut stderr = group.child.stderr.take();
    // Both pipes at once: a child that fills one while we wait on the other
    // would never finish.
    let (status, stdout, stderr) = tokio::join!(
        group.run(ctx),
        read_all(stdout.as_mut()),
        read_all(stderr.as_mut())
    );
    Ok(Output {
        status: status?,
        stdout: stdout?,
        stderr: stderr?,
    })
}

async fn read_all(pipe: Option<&mut (impl tokio::io::AsyncRead + Unpin)>) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if let Some(pipe) = pipe {
        pipe.read_to_end(&mut bytes).await?;
    }
    Ok(bytes)
}
