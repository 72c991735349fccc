//! What a commit to an SQLite store survives ([`Durability`]).

/// What a commit to an SQLite store survives once it is answered. The store
/// runs SQLite in WAL mode either way; this is its `synchronous` setting.
/// PostgreSQL keeps its server's own settings (`synchronous_commit`,
/// `fsync`), which the store does not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous = NORMAL` (the default): a commit survives the process
    /// being killed (`kill -9`, a panic, an out-of-memory kill), since it is
    /// in the WAL file when it is answered; an operating-system crash or a
    /// power loss may lose the commits since the WAL was last synced (at a
    /// checkpoint), and never corrupts the database.
    #[default]
    Normal,
    /// `synchronous = FULL`: the WAL is synced to the disk at every commit,
    /// before it is answered, so a commit survives a power loss too; every
    /// commit then waits for the disk.
    Full,
}

impl Durability {
    /// The `PRAGMA synchronous` statement of this setting.
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Durability::Normal => "PRAGMA synchronous = NORMAL",
            Durability::Full => "PRAGMA synchronous = FULL",
        }
    }
}
