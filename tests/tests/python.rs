//! The `settle` Python package (crates/python), tested from Python: builds
//! and installs it with pip into the interpreter `SETTLE_TEST_PYTHON` names
//! (a virtual environment's `python`, with maturin, pytest and
//! pytest-asyncio; `openai` for seed 001's tests), then runs its pytest
//! suite, `crates/python/tests`, against this workspace's `settle` binary.
//!
//! Without `SETTLE_TEST_PYTHON` it is skipped with a loud message, and it
//! fails under `CI=true`, as the PostgreSQL tests do. `.ci/run` makes the
//! environment and sets it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod common;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The interpreter to test with, once it has what the tests need.
fn python() -> Option<PathBuf> {
    let Some(python) = std::env::var_os("SETTLE_TEST_PYTHON").filter(|p| !p.is_empty()) else {
        common::skip(
            "the Python package's tests",
            "SETTLE_TEST_PYTHON is not set. Make a virtual environment with \
             `python3 -m venv .venv && .venv/bin/pip install maturin pytest pytest-asyncio openai mypy websockets` \
             and set SETTLE_TEST_PYTHON=$PWD/.venv/bin/python.",
        );
        return None;
    };
    let python = PathBuf::from(python);
    let has = Command::new(&python)
        .args(["-c", "import maturin, pytest, pytest_asyncio"])
        .status();
    if !has.is_ok_and(|s| s.success()) {
        common::skip(
            "the Python package's tests",
            &format!(
                "{} cannot import maturin, pytest and pytest_asyncio; install them into it with pip",
                python.display()
            ),
        );
        return None;
    }
    Some(python)
}

#[test]
fn g1_to_g11_hold_for_the_python_package() {
    let Some(python) = python() else {
        return;
    };
    let root = workspace();
    let package = root.join("crates").join("python");

    // `pip install ./crates/python`, as the README says, in the debug
    // profile of this build (maturin's PEP 517 backend takes its arguments
    // from MATURIN_PEP517_ARGS) and without build isolation, so that the
    // maturin of the environment builds it and nothing is downloaded.
    // The backend runs the `maturin` beside the interpreter.
    let bin = python.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("a PATH");
    let started = Instant::now();
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-build-isolation",
            "--no-deps",
            "--force-reinstall",
        ])
        .arg(&package)
        .env("MATURIN_PEP517_ARGS", "--profile dev")
        .env("PATH", &path)
        .current_dir(&root)
        .status()
        .expect("run pip");
    assert!(installed.success(), "pip install ./crates/python failed");
    eprintln!("pip install ./crates/python: {:.1?}", started.elapsed());

    let settle = settle_tests::settle_bin();
    let started = Instant::now();
    let tested = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .env("SETTLE_BIN", settle)
        .env("PATH", &path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&package)
        .status()
        .expect("run pytest");
    eprintln!("pytest crates/python/tests: {:.1?}", started.elapsed());
    assert!(
        tested.success(),
        "the Python package's tests failed (their output is above)"
    );
}
