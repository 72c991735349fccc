//! [`sqlite_threading`]: how the SQLite linked into this program was built,
//! read from SQLite itself (`PRAGMA compile_options`), so an embedder can see
//! whether it has the build the benchmarks measured.

use diesel::connection::SimpleConnection;
use diesel::sql_types::Text;
use diesel::{Connection, QueryableByName, RunQueryDsl, SqliteConnection};

/// The threading mode SQLite was compiled with (`SQLITE_THREADSAFE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqliteThreading {
    /// `THREADSAFE=0`: no mutexes at all; unsafe with several threads.
    SingleThread,
    /// `THREADSAFE=2`: no mutex on a connection's calls, safe as long as no
    /// connection is used by two threads at once, which the store
    /// guarantees. The build the benchmarks measured.
    MultiThread,
    /// `THREADSAFE=1`, SQLite's own default: a mutex taken on every call
    /// into a connection (about 12% of the store writer's time in a
    /// 10,000-agent teardown).
    Serialized,
}

#[derive(QueryableByName)]
struct CompileOption {
    #[diesel(sql_type = Text)]
    compile_options: String,
}

/// How the linked SQLite was built, or why that could not be read.
///
/// The bundled SQLite is compiled by `libsqlite3-sys`, which takes its
/// flags from the `LIBSQLITE3_FLAGS` environment variable of the build; a
/// library cannot set that for the crates it depends on, so this
/// workspace's `.cargo/config.toml` sets it and a program that embeds the
/// store sets it in its own:
///
/// ```toml
/// # .cargo/config.toml of the embedding program
/// [env]
/// LIBSQLITE3_FLAGS = "-USQLITE_THREADSAFE -DSQLITE_THREADSAFE=2"
/// ```
///
/// (then `cargo clean -p libsqlite3-sys` once, so SQLite is rebuilt).
/// Without it the store works the same, a little slower; opening a store
/// logs which build it found.
///
/// # Errors
/// When an in-memory SQLite connection cannot be opened or queried.
pub fn sqlite_threading() -> Result<SqliteThreading, String> {
    let mut conn = SqliteConnection::establish(":memory:").map_err(|e| e.to_string())?;
    conn.batch_execute("SELECT 1").map_err(|e| e.to_string())?;
    let options: Vec<CompileOption> = diesel::sql_query("PRAGMA compile_options")
        .load(&mut conn)
        .map_err(|e| e.to_string())?;
    let mode = options
        .iter()
        .find_map(|o| o.compile_options.strip_prefix("THREADSAFE="));
    Ok(match mode {
        Some("0") => SqliteThreading::SingleThread,
        Some("2") => SqliteThreading::MultiThread,
        _ => SqliteThreading::Serialized,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_workspace_builds_sqlite_multi_threaded() {
        // `.cargo/config.toml` sets LIBSQLITE3_FLAGS; the store's tests run
        // on the build the benchmarks measured.
        assert_eq!(sqlite_threading(), Ok(SqliteThreading::MultiThread));
    }
}
