//! Another copy of SQLite in this process on a kernel's database file.
//!
//! The package carries its own SQLite, private to it. Python's `sqlite3`
//! module uses another (the system's library, or one built into Python),
//! and two copies of SQLite in one process do not see each other's locks
//! (SQLite's "How To Corrupt An SQLite Database File", section 2.2.1): a
//! kernel's write lands in the middle of the other connection's exclusive
//! transaction, and closing the file in one copy drops the locks the other
//! holds, for other processes as well. So `Kernel.open` refuses an SQLite
//! file that is open in this process when no kernel of this process ever
//! opened it, or began to: any handle on it then belongs to another copy.
//! Once a kernel opened the file (or began to: an open given up under a
//! timeout goes on, its handles its own), the handles on it may be the kernel's own, so nothing
//! more is checked; the docs say to read through the kernel instead.
//! Linux only (`/proc/self/fd`); elsewhere nothing is checked.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The files (device, inode) a kernel of this process opened.
static OPENED: Mutex<BTreeSet<(u64, u64)>> = Mutex::new(BTreeSet::new());

/// The files, by path, a kernel of this process began to open: an open
/// given up before it ended (`Kernel.open` under a timeout) goes on opening
/// on its own thread, so the handles on such a file may be its own, and
/// one made by that open has no identity above to be known by.
static BEGUN: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// `db` as one spelling, so that an open and the check after it agree.
fn absolute(db: &Path) -> PathBuf {
    std::path::absolute(db).unwrap_or_else(|_| db.to_owned())
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The file itself and the companions SQLite keeps beside it in WAL mode.
fn files_of(db: &Path) -> Vec<PathBuf> {
    let mut files = vec![db.to_owned()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        files.push(PathBuf::from(name));
    }
    files
}

/// Why the SQLite file `db` must not be opened: it is open in this process
/// and no kernel of this process opened it. `None` when it may be.
pub(crate) fn refusal(db: &Path) -> Option<String> {
    if BEGUN
        .lock()
        .map_or(true, |begun| begun.contains(&absolute(db)))
    {
        return None;
    }
    let db_id = identity(db)?;
    if OPENED.lock().map_or(true, |opened| opened.contains(&db_id)) {
        return None;
    }
    let wanted: HashSet<(u64, u64)> = files_of(db).iter().filter_map(|f| identity(f)).collect();
    let handles = std::fs::read_dir("/proc/self/fd").ok()?;
    let open_here = handles
        .filter_map(Result::ok)
        .filter_map(|fd| identity(&fd.path()))
        .any(|id| wanted.contains(&id));
    open_here.then(|| {
        format!(
            "the database {} is already open in this process through another copy of SQLite \
             (Python's sqlite3 module?); two copies of SQLite in one process do not see each \
             other's locks and can corrupt the file: close that connection first, and read \
             the store through the kernel (sessions(), transcript()) or from another process",
            db.display()
        )
    })
}

/// A kernel of this process opened `db`: handles on it may be its own.
pub(crate) fn opened(db: &Path) {
    if let (Some(id), Ok(mut opened)) = (identity(db), OPENED.lock()) {
        opened.insert(id);
    }
}

/// A kernel of this process begins to open `db` (checked first with
/// [`refusal`]): from now on, handles on it may be its own.
pub(crate) fn begin(db: &Path) {
    if let Ok(mut begun) = BEGUN.lock() {
        begun.insert(absolute(db));
    }
}
