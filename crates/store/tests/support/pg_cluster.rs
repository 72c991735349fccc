//! A throwaway PostgreSQL cluster for tests, shared as one source file by
//! the store's tests (`crates/store/tests/common`) and the end-to-end fault
//! suite (`tests/tests/common`), each of which uses part of it.
#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A cluster this process started.
pub struct Cluster {
    /// `postgres://postgres@127.0.0.1:PORT/postgres`, trust auth.
    pub admin_url: String,
    /// The server's binaries (`initdb`, `pg_ctl`).
    pub bin: PathBuf,
    /// Its data folder.
    pub data: PathBuf,
    /// The server's options (`pg_ctl -o`): its port, its socket folder.
    pub options: String,
}

pub fn pg_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(d) = dirs.pop() {
        return Some(d);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    d.join("initdb").exists().then_some(d)
}

pub fn is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn uid_of(user: &str) -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&user))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// A command run as the cluster's owner: `postgres` when we are root.
pub fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Starts a throwaway trust-auth cluster on a free loopback port, in a
/// folder named from `prefix`, stopped and removed once this process exits.
pub fn start_cluster(prefix: &str) -> Result<Cluster, String> {
    let bin = pg_bin_dir().ok_or("no PostgreSQL server binaries (initdb, pg_ctl) were found")?;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("cannot make a folder for the cluster: {e}"))?
        .keep();
    if is_root() {
        let (uid, gid) = uid_of("postgres")
            .ok_or("running as root, and there is no `postgres` user to own a cluster")?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot hand the cluster folder to postgres: {e}"))?;
    }
    let data = dir.join("data");
    let status = as_owner(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !status.success() {
        return Err(format!("initdb failed ({status})"));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let options = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=300 -c fsync=off -c full_page_writes=off",
        dir.display()
    );
    let status = as_owner(&bin.join("pg_ctl"))
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-o", &options, "start"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
    if !status.success() {
        let log = fs::read_to_string(dir.join("log")).unwrap_or_default();
        return Err(format!("pg_ctl start failed ({status}): {log}"));
    }
    // Stop the cluster and remove it once this test binary has exited.
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         kill -QUIT $(head -n 1 '{data}/postmaster.pid') 2>/dev/null; sleep 1; rm -rf '{dir}'",
        pid = std::process::id(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the cluster's watchdog: {e}"))?;
    Ok(Cluster {
        admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        bin,
        data,
        options,
    })
}
