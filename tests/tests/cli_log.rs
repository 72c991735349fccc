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
