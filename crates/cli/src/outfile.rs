//! The files that `export -o` and `show --trace` write: whole or not at all.
//! The text goes to a temporary file beside the target, which then replaces
//! it in one rename, so a reader never sees half a file and a failed write
//! leaves nothing behind (G11). `-` is stdout.

use std::io::Write;
use std::path::Path;

use crate::Failure;

/// Writes `text` to `path` (stdout for `-`). A path that cannot be written
/// is bad input (exit 2), named in the one line.
pub fn write(path: &Path, text: &str) -> Result<(), Failure> {
    if path == Path::new("-") {
        crate::say(text);
        return Ok(());
    }
    let cannot =
        |why: String| Failure::bad_input(format!("cannot write {}: {why}", path.display()));
    if path.is_dir() {
        return Err(cannot("it is a directory; name a file in it".to_owned()));
    }
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(cannot(format!(
            "its folder {} does not exist",
            folder.display()
        )));
    }
    let mut file = tempfile::Builder::new()
        .prefix(".settle-")
        .tempfile_in(folder)
        .map_err(|e| cannot(e.to_string()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .map_err(|e| cannot(e.to_string()))?;
    file.persist(path)
        .map_err(|e| cannot(e.error.to_string()))?;
    Ok(())
}
