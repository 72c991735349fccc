//! Where `export -o` and `show --trace` write: what is not a regular file
//! is written into, not replaced (a FIFO's reader gets the text, a symbolic
//! link stays a link to the file it names); a file replaced keeps its
//! permissions; and a store whose parents loop (changed by hand) gives one
//! line and exit 3, not a trace that grows without end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use settle_tests::{assert_success, by_name, id_of, Sandbox};

const SCENARIO: &str =
    "name = \"s\"\n[[agent]]\nname = \"root\"\n[[agent.turn]]\nchunks = [\"hello\"]\nchunk_delay_ms = 300\n\
    [[agent]]\nname = \"kid\"\nparent = \"root\"\n[[agent.turn]]\nchunks = [\"hi\"]\n";

fn sandbox() -> Sandbox {
    let sandbox = Sandbox::new();
    let scenario = sandbox.write("s.toml", SCENARIO);
    let out = sandbox.run(&["run", scenario.to_str().unwrap(), "--json"]);
    assert_success(&out, "settle run");
    sandbox
}

#[test]
fn g11_export_into_a_fifo_writes_to_its_reader_and_leaves_the_fifo() {
    let sandbox = sandbox();
    let fifo = sandbox.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            fs::File::open(fifo)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        })
    };
    let out = sandbox.run(&["export", "1", "-o", fifo.to_str().unwrap()]);
    assert_success(&out, "settle export -o pipe");
    // Checked first: a reader left waiting on a replaced FIFO never returns.
    assert!(
        fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO was replaced"
    );
    let text = reader.join().unwrap();
    assert!(text.contains("hello"), "the reader got {text:?}");
}

#[test]
fn g11_a_symlink_stays_a_link_and_a_replaced_file_keeps_its_permissions() {
    let sandbox = sandbox();
    let real = sandbox.write("real.md", "old");
    fs::set_permissions(&real, fs::Permissions::from_mode(0o640)).unwrap();
    let link = sandbox.path().join("link.md");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = sandbox.run(&["export", "1", "-o", link.to_str().unwrap()]);
    assert_success(&out, "settle export -o link");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::read_to_string(&real).unwrap().contains("hello"));
    let mode = fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the file's permissions changed");
    // A new file is readable by others, as a shell's `>` makes it.
    let out = sandbox.run(&["show", "1", "--trace", "t.json"]);
    assert_success(&out, "settle show --trace");
    let mode = fs::metadata(sandbox.path().join("t.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

#[test]
fn g11_a_store_whose_parents_loop_gives_one_line_and_exit_3() {
    let sandbox = sandbox();
    let db = sandbox.db();
    let sessions = sandbox.sessions();
    let (root, kid) = (
        id_of(by_name(&sessions, "root")),
        id_of(by_name(&sessions, "kid")),
    );
    // root under kid, which is under root: a loop no settle writes.
    common::execute(
        db.to_str().unwrap(),
        &format!("UPDATE sessions SET parent = {kid} WHERE id = {root}"),
    );
    let out = sandbox.run(&["show", &root.to_string(), "--trace", "t.json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("settle: ") && err.contains("loop"), "{err}");
    assert!(!sandbox.path().join("t.json").exists());
}
