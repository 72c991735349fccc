//! `settle run` in an 80×24 terminal: a pseudo-terminal of that size, its
//! output read back through a terminal emulator (vt100). Between two redraws
//! of the live view, every line on the screen is a whole line of the view (a
//! header, a session, or the line that counts the sessions that do not fit),
//! never the tail of a line that wrapped; the view never takes more lines
//! than the terminal has; the final table fits the width. With stdout a
//! pipe, the view is drawn on stderr and the log goes to the pipe.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Read;
use std::num::NonZeroU16;
use std::os::fd::OwnedFd;
use std::process::{ExitStatus, Stdio};
use std::thread::JoinHandle;

use nix::pty::{openpty, Winsize};
use settle_tests::{wait_within, Sandbox, PATIENCE};

const ROWS: u16 = 24;
const COLS: u16 = 80;

/// What one `settle` process printed: the bytes its terminal received, and
/// its stdout when that was a pipe.
struct Printed {
    status: ExitStatus,
    terminal: Vec<u8>,
    stdout: Option<String>,
}

fn read_all(mut from: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 8192];
        // A pseudo-terminal's master reads EIO once every slave is closed.
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
        bytes
    })
}

/// Runs `settle ARGS` with stderr (and stdout, unless `pipe_stdout`) on a
/// fresh 80×24 pseudo-terminal.
fn in_terminal(sandbox: &Sandbox, args: &[&str], pipe_stdout: bool) -> Printed {
    let size = Winsize {
        ws_row: ROWS,
        ws_col: COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(&size, None).expect("open a pseudo-terminal");
    let slave = |pty: &OwnedFd| Stdio::from(pty.try_clone().expect("dup the terminal"));
    let mut cmd = sandbox.command(args);
    cmd.env("TERM", "xterm-256color").stderr(slave(&pty.slave));
    if pipe_stdout {
        cmd.stdout(Stdio::piped());
    } else {
        cmd.stdout(slave(&pty.slave));
    }
    let mut child = cmd.spawn().expect("start settle");
    // Only the child holds the terminal now: its exit ends the reads.
    drop(cmd);
    drop(pty.slave);
    let terminal = read_all(File::from(pty.master));
    let stdout = child.stdout.take().map(read_all);
    let status = wait_within(&mut child, PATIENCE).expect("settle run ended");
    Printed {
        status,
        terminal: terminal.join().unwrap(),
        stdout: stdout.map(|s| String::from_utf8(s.join().unwrap()).unwrap()),
    }
}

/// Where each redraw of the view begins: a cursor-up sequence (`ESC [ n A`).
fn redraws(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len())
        .filter(|&i| {
            bytes[i..].starts_with(b"\x1b[") && {
                let digits = bytes[i + 2..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                digits > 0 && bytes.get(i + 2 + digits) == Some(&b'A')
            }
        })
        .collect()
}

/// Whether `line` is one whole line of the view or of the final table.
fn whole_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    let id_then_gap = trimmed
        .split_once("  ")
        .is_some_and(|(id, _)| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
    line.is_empty()
        || line.starts_with("ID  ")
        || id_then_gap
        || (line.starts_with("… ") && line.contains(" more sessions: "))
}

/// The screen after each complete frame: `(lines, whether it is the last)`.
fn screens(bytes: &[u8]) -> Vec<(Vec<String>, bool)> {
    let rows = NonZeroU16::new(ROWS).unwrap();
    let cols = NonZeroU16::new(COLS).unwrap();
    let mut parser = vt100::Parser::new(rows, cols, 0);
    let mut points = redraws(bytes);
    points.push(bytes.len());
    let mut seen = Vec::new();
    let mut from = 0;
    for (i, &to) in points.iter().enumerate() {
        parser.process(&bytes[from..to]);
        from = to;
        let lines: Vec<String> = parser
            .screen()
            .rows(0, COLS)
            .map(|l| l.trim_end().to_owned())
            .collect();
        seen.push((lines, i + 1 == points.len()));
    }
    seen
}

/// Checks every screen; returns how many frames counted hidden sessions.
fn check_screens(printed: &Printed) -> usize {
    let screens = screens(&printed.terminal);
    assert!(screens.len() > 2, "the view was drawn more than once");
    let mut counted = 0;
    for (n, (lines, last)) in screens.iter().enumerate() {
        let shown = lines.iter().filter(|l| !l.is_empty()).count();
        let text = lines.join("\n");
        for line in lines {
            assert!(
                whole_line(line),
                "screen {n}: {line:?} is not a whole line of the view:\n{text}"
            );
        }
        if !last {
            assert!(
                shown < usize::from(ROWS),
                "screen {n}: the view took {shown} lines of {ROWS}:\n{text}"
            );
        }
        if lines.iter().any(|l| l.starts_with("… ")) {
            counted += 1;
        }
    }
    counted
}

/// A root that streams for about a second over forty workers mid-turn (more
/// than fit in 24 lines), one with a name longer than the terminal is wide.
fn crowd(sandbox: &Sandbox) -> String {
    let mut text = String::from(
        "name = \"crowd\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\n\
         chunks = [\"1\", \"2\", \"3\", \"4\", \"5\", \"6\", \"7\", \"8\", \"9\", \"10\"]\n\
         chunk_delay_ms = 100\n",
    );
    for i in 0..40 {
        let name = if i == 7 {
            "a-worker-whose-name-is-longer-than-any-terminal-is-wide-at-eighty-or-so-columns"
                .to_owned()
        } else {
            format!("worker{i}")
        };
        text.push_str(&format!(
            "[[agent]]\nname = \"{name}\"\nparent = \"root\"\nspawn_after_ms = {}\n\
             [[agent.turn]]\nchunks = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\", \"j\", \"k\", \"l\", \"m\", \"n\", \"o\"]\n\
             chunk_delay_ms = 150\n",
            5 * i
        ));
    }
    sandbox
        .write("crowd.toml", &text)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_live_view_fits_an_80_by_24_terminal() {
    let sandbox = Sandbox::new();
    let scenario = crowd(&sandbox);
    let printed = in_terminal(&sandbox, &["run", &scenario], false);
    assert_eq!(printed.status.code(), Some(0));
    let counted = check_screens(&printed);
    assert!(
        counted > 0,
        "41 sessions never needed the line that counts the rest"
    );
    // The final table follows, on stdout (the same terminal), each line
    // within the width: the long name was cut to fit.
    let text = String::from_utf8_lossy(&printed.terminal);
    let table = &text[text.rfind("ID  NAME").expect("the final table")..];
    let lines: Vec<&str> = table
        .split('\n')
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 42, "a header and 41 sessions:\n{table}");
    for line in &lines {
        assert!(
            line.chars().count() <= usize::from(COLS) && whole_line(line),
            "{line:?}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("a-worker-") && l.contains('…')),
        "{table}"
    );
}

#[test]
fn with_stdout_a_pipe_the_view_is_drawn_on_stderr_and_the_log_piped() {
    let sandbox = Sandbox::new();
    let scenario = crowd(&sandbox);
    let printed = in_terminal(&sandbox, &["run", &scenario], true);
    assert_eq!(printed.status.code(), Some(0));
    check_screens(&printed);
    // The last frame stays on the terminal: every session finalized.
    let (last, _) = screens(&printed.terminal).pop().unwrap();
    assert!(last[0].starts_with("ID  SESSION"), "{}", last.join("\n"));
    let live_rows: Vec<&String> = last[1..]
        .iter()
        .filter(|l| !l.is_empty() && !l.starts_with('…'))
        .collect();
    assert!(!live_rows.is_empty());
    assert!(
        live_rows.iter().all(|l| l.contains("finalized")),
        "{}",
        last.join("\n")
    );
    // The log and the summary went to the pipe, unshortened.
    let stdout = printed.stdout.unwrap();
    assert!(stdout.contains(" persisted turn 1 chunk 0: "), "{stdout}");
    assert!(stdout.contains("END REASON"), "{stdout}");
    assert!(
        stdout.contains(
            "a-worker-whose-name-is-longer-than-any-terminal-is-wide-at-eighty-or-so-columns"
        ),
        "{stdout}"
    );
}
