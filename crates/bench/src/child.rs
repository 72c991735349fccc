//! Rows measured in a process of their own: the allocator counts every
//! thread, and the rows before them leave threads behind (stores'
//! checkpointers, blocking pools) whose allocations and frees would be
//! counted against the sessions.

use std::process::{Command, Stdio};

use crate::Result;

/// Runs this binary again with `args` (its progress lines go to this
/// process's stderr) and returns the words it printed, for the row to parse;
/// `what` names the row in the errors.
pub fn figures(args: &[&str], what: &str) -> Result<Vec<String>> {
    let out = Command::new(std::env::current_exe()?)
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("the {what} process failed").into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.split_whitespace().map(str::to_owned).collect())
}
