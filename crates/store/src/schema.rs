//! The tables, as Diesel sees them. One schema serves both backends: every
//! integer is a `BIGINT` (`i64`), every timestamp milliseconds since the UNIX
//! epoch, every state/outcome/end reason/chunk kind/turn error kind
//! settle-core's lowercase spelling, every JSON value its text.

/// The schema version this build writes. A database that records a higher one
/// was written by a newer settle and is refused on open.
pub(crate) const SCHEMA_VERSION: i64 = 9;

/// The `settle_meta` key that holds [`SCHEMA_VERSION`].
pub(crate) const SCHEMA_VERSION_KEY: &str = "schema_version";

diesel::table! {
    settle_meta (key) {
        key -> Text,
        value -> BigInt,
    }
}

diesel::table! {
    owners (id) {
        id -> BigInt,
        host -> Text,
        pid -> BigInt,
        started_at -> BigInt,
        lease_expires_at -> BigInt,
        machine -> Nullable<Text>,
        pid_namespace -> Nullable<BigInt>,
        advertise -> Nullable<Text>,
    }
}

diesel::table! {
    sessions (id) {
        id -> BigInt,
        name -> Text,
        parent -> Nullable<BigInt>,
        tree -> BigInt,
        state -> Text,
        outcome -> Nullable<Text>,
        end_reason -> Nullable<Text>,
        closing_reason -> Nullable<Text>,
        open_turn -> Nullable<BigInt>,
        created_at -> BigInt,
        finalized_at -> Nullable<BigInt>,
        finalize_errors -> Nullable<Text>,
        version -> BigInt,
        owner -> BigInt,
        resumed_from -> Nullable<BigInt>,
        released_at -> Nullable<BigInt>,
        // `last_segment` (schema version 8, a `last_segments` id) is written
        // and read in SQL of its own: Diesel's tables stop at sixteen
        // columns unless every table is built for thirty-two, which costs
        // every build.
    }
}

diesel::table! {
    /// Sessions' last timeline segments (schema version 8), each named by
    /// the sessions whose finalize wrote it (`sessions.last_segment`).
    last_segments (id) {
        id -> BigInt,
        steps -> Text,
    }
}

diesel::table! {
    /// The holds of a session released while held (schema version 9,
    /// SPEC §12), until a process adopts it.
    released_holds (session) {
        session -> BigInt,
        pending_input -> BigInt,
        delegation -> BigInt,
    }
}

diesel::table! {
    /// Who may use a session through a gateway (SPEC §12).
    session_principals (session) {
        session -> BigInt,
        principal -> Text,
    }
}

diesel::table! {
    turns (session, no) {
        session -> BigInt,
        no -> BigInt,
        outcome -> Nullable<Text>,
        started_at -> BigInt,
        /// When it ended; null for a turn still open, and for one its
        /// session's finalize ended when the session's row says it all
        /// (the session's `outcome` and `finalized_at`, no error): the
        /// readers fill it in from there.
        ended_at -> Nullable<BigInt>,
        /// PostgreSQL: the next chunk's number, claimed by each append. On
        /// SQLite (schema version 7 on) the number is read from the turn's
        /// chunks and this stays as the turn was opened.
        next_seq -> BigInt,
        input -> Nullable<Text>,
        input_from -> Nullable<BigInt>,
        error_kind -> Nullable<Text>,
        error_message -> Nullable<Text>,
    }
}

diesel::table! {
    chunks (session, turn_no, seq) {
        session -> BigInt,
        turn_no -> BigInt,
        seq -> BigInt,
        text -> Text,
        kind -> Text,
        data -> Nullable<Text>,
    }
}

diesel::table! {
    /// Segments of a session's timeline (see `timeline.rs`).
    timeline (id) {
        id -> BigInt,
        session -> BigInt,
        steps -> Text,
    }
}

diesel::table! {
    memories (id) {
        id -> BigInt,
        session -> BigInt,
        turn_no -> BigInt,
        content -> Text,
        created_at -> BigInt,
    }
}

diesel::joinable!(sessions -> owners (owner));
diesel::joinable!(timeline -> sessions (session));
diesel::joinable!(memories -> sessions (session));
diesel::joinable!(session_principals -> sessions (session));
diesel::joinable!(released_holds -> sessions (session));

diesel::allow_tables_to_appear_in_same_query!(
    settle_meta,
    owners,
    sessions,
    turns,
    chunks,
    timeline,
    memories,
    session_principals,
    released_holds,
);
