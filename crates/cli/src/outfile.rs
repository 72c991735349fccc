//! The files that `export -o` and `show --trace` write: whole or not at all.
//! The text goes to a temporary file beside the target, which then replaces
//! it in one rename, so a reader never sees half a file and a failed write
//! leaves nothing behind (G11). `-` is stdout.
//!
//! What is not a regular file is written into, not replaced: a FIFO, a
//! device (`/dev/null`, `/dev/stdout`), a symbolic link's target (the link
//! stays). A file it replaces keeps its permissions. The database itself,
//! its WAL and journal files, and any other SQLite database are refused: an
//! output path must not be the data it was read from.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::Failure;

/// What an SQLite database file starts with.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Writes `text` to `path` (stdout for `-`), refusing `db`'s files. A path
/// that cannot be written is bad input (exit 2), named in the one line.
pub fn write(path: &Path, text: &str, db: &str) -> Result<(), Failure> {
    if path == Path::new("-") {
        crate::say(text);
        return Ok(());
    }
    let cannot =
        |why: String| Failure::bad_input(format!("cannot write {}: {why}", path.display()));
    // A symbolic link is followed: its target is what is written.
    let target = match fs::canonicalize(path) {
        Ok(resolved) => resolved,
        Err(_) => path.to_path_buf(),
    };
    let meta = fs::metadata(&target).ok();
    if let Some(why) = refusal(&target, meta.as_ref(), db) {
        return Err(cannot(why));
    }
    match &meta {
        Some(meta) if meta.is_dir() => {
            return Err(cannot("it is a directory; name a file in it".to_owned()))
        }
        // A FIFO, a device, a socket: written into, as a shell's `>` does.
        Some(meta) if !meta.is_file() => return write_into(&target, text).map_err(cannot),
        _ => {}
    }
    let folder = match target.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !folder.is_dir() {
        return Err(cannot(format!(
            "its folder {} does not exist",
            folder.display()
        )));
    }
    let mut file = tempfile::Builder::new()
        .prefix(".settle-")
        .tempfile_in(&folder)
        .map_err(|e| cannot(e.to_string()))?;
    let mode = meta.map_or_else(new_file_permissions, |meta| meta.permissions());
    file.write_all(text.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .and_then(|()| fs::set_permissions(file.path(), mode))
        .map_err(|e| cannot(e.to_string()))?;
    file.persist(&target)
        .map_err(|e| cannot(e.error.to_string()))?;
    Ok(())
}

/// Why `target` (whose metadata is `meta`, when it exists) must not be
/// written over: it is the database `db` (or its WAL, shared-memory or
/// journal file), or another SQLite database.
fn refusal(target: &Path, meta: Option<&fs::Metadata>, db: &str) -> Option<String> {
    if let Ok(db) = fs::canonicalize(db) {
        let db = db.as_os_str().to_string_lossy().into_owned();
        let named = target.as_os_str().to_string_lossy().into_owned();
        for suffix in ["", "-wal", "-shm", "-journal"] {
            if named == format!("{db}{suffix}") {
                return Some("it is the database's own file; name another file".to_owned());
            }
        }
    }
    // Only a regular file is opened to look: opening a FIFO waits for its writer.
    if !meta.is_some_and(fs::Metadata::is_file) {
        return None;
    }
    let mut head = [0u8; 16];
    let is_database = fs::File::open(target)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && &head == SQLITE_HEADER;
    is_database.then(|| "it is an SQLite database; name another file".to_owned())
}

/// Writes `text` into what is not a regular file (a FIFO, a device).
fn write_into(target: &Path, text: &str) -> Result<(), String> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .open(target)
        .map_err(|e| e.to_string())?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| e.to_string())
}

/// The permissions of a file the command creates: read and write for its
/// owner, read for the rest (as a shell's `>` makes under the usual umask).
fn new_file_permissions() -> fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    fs::Permissions::from_mode(0o644)
}
