//! The log lines of `settle` (`SETTLE_LOG`) on stderr: coloured only when
//! stderr is a terminal and `NO_COLOR` is not set, so that a log written to
//! a file or read by a program holds no escape sequences.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;

use nix::pty::{openpty, Winsize};
use settle_tests::{wait_within, Sandbox, PATIENCE};

const ESC: u8 = 0x1b;

fn scan() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/scan.toml")
}

/// `settle run --json` of the scan example, logging at debug level, with
/// stderr on a fresh pseudo-terminal; what the terminal received.
fn logged_on_a_terminal(no_color: bool) -> Vec<u8> {
    let sandbox = Sandbox::new();
    let size = Winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(&size, None).expect("open a pseudo-terminal");
    let mut cmd = sandbox.command(&["run", "--json", scan().to_str().unwrap()]);
    cmd.env("SETTLE_LOG", "debug")
        .env("TERM", "xterm-256color")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
    if no_color {
        cmd.env("NO_COLOR", "1");
    }
    let mut child = cmd.spawn().expect("start settle");
    drop(cmd);
    drop(pty.slave);
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut master = File::from(pty.master);
        let mut chunk = [0u8; 8192];
        // A pseudo-terminal's master reads EIO once every slave is closed.
        while let Ok(n) = master.read(&mut chunk) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
        bytes
    });
    let status = wait_within(&mut child, PATIENCE).expect("settle run ended");
    assert!(status.success(), "{status:?}");
    reader.join().unwrap()
}

#[test]
fn log_lines_written_to_a_file_carry_no_escape_sequences() {
    let sandbox = Sandbox::new();
    let log = sandbox.path().join("stderr.log");
    let status = sandbox
        .command(&["run", "--json", scan().to_str().unwrap()])
        .env("SETTLE_LOG", "debug")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read(&log).unwrap();
    assert!(
        String::from_utf8_lossy(&text).contains("DEBUG"),
        "nothing was logged"
    );
    assert!(!text.contains(&ESC), "{}", String::from_utf8_lossy(&text));
}

#[test]
fn log_lines_on_a_terminal_are_coloured_unless_no_color_is_set() {
    let coloured = logged_on_a_terminal(false);
    assert!(String::from_utf8_lossy(&coloured).contains("DEBUG"));
    assert!(coloured.contains(&ESC), "a terminal gets colours");
    let plain = logged_on_a_terminal(true);
    assert!(String::from_utf8_lossy(&plain).contains("DEBUG"));
    assert!(
        !plain.contains(&ESC),
        "NO_COLOR: {}",
        String::from_utf8_lossy(&plain)
    );
}

/// A standard error that cannot be written (its file on a full disk, here
/// `/dev/full`) loses the log lines, not the run: `settle run` logging at
/// debug level finishes its scenario and exits 0. It used to panic on the
/// first line it could not write (the log library reports a failed write
/// with `eprintln!`, which panics), failing turns with "failed printing to
/// stderr", exiting 101, and, once the recorder's task was hit, spinning
/// deaf to SIGTERM.
#[test]
fn a_log_that_cannot_be_written_loses_its_lines_not_the_run() {
    let sandbox = Sandbox::new();
    let full = File::options()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut cmd = sandbox.command(&["run", "--json", scan().to_str().unwrap()]);
    cmd.env("SETTLE_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::from(full));
    let mut child = cmd.spawn().expect("start settle");
    let status = wait_within(&mut child, PATIENCE).expect("settle run ended");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// One WebSocket connection, upgraded and dropped (two lines in the log of
/// a gateway logging at debug level: connected, disconnected), read to its
/// answer: the status line. Waits at most [`PATIENCE`] for it, so that a
/// gateway that stopped answering fails the test instead of hanging it.
fn connected_and_dropped(addr: &str) -> String {
    use std::io::Write;
    let mut socket = std::net::TcpStream::connect(addr).expect("connect to the gateway");
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    socket
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match socket.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("the gateway stopped answering ({e}) after its log filled"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// A child process killed when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A gateway's standard error is a pipe nobody reads any more (a log
/// shipper that hung, a pager left paused): its clients make it log (at
/// debug level, two lines a connection; a refused origin was a line each
/// before such lines were logged in runs), and a log line written straight
/// to a full pipe blocked the thread that wrote it. Once a few hundred lines
/// filled the pipe, every worker thread was blocked in a write: no client
/// was answered, `/healthz` neither, and SIGTERM ended nothing (G9's exit
/// bound). Lines that cannot be written now are dropped, counted, never
/// waited for.
#[test]
fn g9_a_log_nobody_reads_stalls_neither_the_gateway_nor_its_exit() {
    use nix::fcntl::{fcntl, FcntlArg};
    use std::io::{BufRead, BufReader, Write};

    let sandbox = Sandbox::new();
    let book = settle_tests::long_book(&sandbox);
    // The read end is the test's alone (close-on-exec): nobody reads it,
    // and the gateway's writes wait as they would on a reader that hung.
    let (unread, log) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("a pipe");
    // The smallest pipe there is: a page of lines fills it.
    let _ = fcntl(&log, FcntlArg::F_SETPIPE_SZ(4096));
    let mut cmd = sandbox.command(&["serve", "--listen", "127.0.0.1:0", "--scripted", &book]);
    cmd.env("SETTLE_LOG", "settle_gateway=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    let mut child = Reaped(cmd.spawn().expect("start settle serve"));
    drop(cmd);
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim_end()
        .rsplit("://")
        .next()
        .and_then(|rest| rest.strip_suffix("/ws"))
        .unwrap_or_else(|| panic!("not a listening line: {line:?}"))
        .to_owned();

    // Far more than the pipe holds.
    for _ in 0..1000 {
        let status = connected_and_dropped(&addr);
        assert!(status.contains(" 101 "), "{status}");
    }
    let mut health = std::net::TcpStream::connect(&addr).unwrap();
    health.set_read_timeout(Some(PATIENCE)).unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = health.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_within(&mut child.0, PATIENCE).expect("settle serve exited on SIGTERM");
    assert_eq!(status.code(), Some(143), "{status:?}");
    drop(unread);
}
