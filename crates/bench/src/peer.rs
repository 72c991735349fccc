//! The baseline of the `teardown durable` row: the Python asyncio teardown of
//! SPEC §9 (`peers/asyncio_teardown.py`, vendored into this crate unchanged),
//! run as a subprocess at the same size and shape as ours.
//!
//! It runs through `peers/peer_options.py`, which sets what the peer leaves
//! to chance so that both sides run the same: its SQLite `synchronous`
//! setting is the store's ([`SYNCHRONOUS`]; Python's default is `FULL`, an
//! fsync per commit, which the store does not pay), and a tree of fan-out
//! `k < n` is cancelled by tree (the root's task only; each task cancels its
//! children and waits for them), as ours is, where the peer on its own
//! cancels every task in one loop whatever the shape.
//!
//! The scripts are compiled into the binary and written to a temporary
//! folder at start, so the bench runs from a clean clone and from any
//! directory. The peer times its own teardown (from the first cancel to the
//! commit of every finalized row) and prints it as JSON; one subprocess per
//! round, so its rounds interleave with ours like every other row's.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::Result;

/// The reference peer, byte for byte as `../shared/peers/asyncio_teardown.py`
/// but for one header line.
const SCRIPT: &str = include_str!("../peers/asyncio_teardown.py");

/// The bench's options around the peer (`synchronous`, cancel by tree).
const OPTIONS: &str = include_str!("../peers/peer_options.py");

/// The store's SQLite `synchronous` setting, which the peer runs too.
pub const SYNCHRONOUS: &str = "NORMAL";

/// The interpreter the peer runs under.
const PYTHON: &str = "python3";

/// A runnable copy of the peer.
#[derive(Debug)]
pub struct Peer {
    script: PathBuf,
    _dir: tempfile::TempDir,
}

/// One line of the peer's `--json` output.
#[derive(Debug, serde::Deserialize)]
struct Report {
    n: usize,
    fanout: usize,
    median_ms: f64,
}

impl Peer {
    /// The peer, ready to run; `Ok(None)` when `python3` cannot be started.
    pub fn find() -> Result<Option<Peer>> {
        let found = Command::new(PYTHON)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            return Ok(None);
        }
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("asyncio_teardown.py"), SCRIPT)?;
        let script = dir.path().join("peer_options.py");
        std::fs::write(&script, OPTIONS)?;
        Ok(Some(Peer { script, _dir: dir }))
    }

    /// One teardown of `n` tasks in a tree of `fanout` children per node
    /// (`n` or more: flat, cancelled in one loop; fewer: cancelled by tree),
    /// as the peer timed it.
    pub fn round(&self, n: usize, fanout: usize) -> Result<Duration> {
        let out = Command::new(PYTHON)
            .arg(&self.script)
            .args(["--synchronous", SYNCHRONOUS])
            .args((fanout < n).then_some("--tree"))
            .arg(n.to_string())
            .args(["--fanout", &fanout.to_string(), "--runs", "1", "--json"])
            .output()
            .map_err(|e| format!("running the asyncio peer: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "the asyncio peer failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or("the asyncio peer printed no JSON line")?;
        let report: Report = serde_json::from_str(line)
            .map_err(|e| format!("reading the asyncio peer's line {line:?}: {e}"))?;
        if report.n != n || report.fanout != fanout || !report.median_ms.is_finite() {
            return Err(format!(
                "the asyncio peer answered for {} agents at fan-out {} ({} ms), asked {n} at {fanout}",
                report.n, report.fanout, report.median_ms
            )
            .into());
        }
        Ok(Duration::from_secs_f64(report.median_ms.max(0.0) / 1e3))
    }
}
