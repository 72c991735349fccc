//! Recovery (G8): finalize the sessions that a crashed process left live.
//!
//! A session is taken over when it is not finalized and its owner's lease has
//! expired, or its owner ran on this host and its process is gone. Each such
//! session goes through the finalize latch ([`latch`](crate::latch): so two
//! recoverers, or a recoverer and a batch's finalize, finalize it once), with
//! end reason `recovered`; its open turn becomes `interrupted`; no memory is
//! committed; the transcript is left as it was. Running it again finds nothing.
//!
//! [`candidates`] is the same search without the writes, for
//! `settle recover --dry-run`.

use std::collections::BTreeMap;

/// Maps keyed by database ids: foldhash on recovery's path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
use std::time::SystemTime;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use settle_core::{EndReason, Outcome, SessionId, State};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::latch::{spend, Ending, Spent};
use crate::lease::{store_now, HostIdentity, OwnerColumns, OwnerId, OwnerRow, OWNER_COLUMNS};
use crate::rows::{group_head, grouped, insert_rows, pieces, InList};
use crate::schema::{owners, sessions};
use crate::time::{opt_word, session_id, sid, to_millis, turn_no, word};
use crate::timeline::{segment_text, Segment, Step};

/// Where and when recovery runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverOptions {
    /// Where the recoverer runs: owners in the same place (same machine
    /// identity and PID namespace) are checked for a live process.
    pub here: HostIdentity,
    /// The recoverer's time, recorded as the recovered sessions' finalize
    /// time. Leases are judged by the store's clock, never by this.
    pub now: SystemTime,
}

impl RecoverOptions {
    /// Recover from this process's place, now.
    pub fn now_on_this_host() -> Self {
        RecoverOptions {
            here: HostIdentity::this_process(),
            now: SystemTime::now(),
        }
    }
}

/// Why an owner's sessions were taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OwnerGone {
    /// Its lease expired.
    LeaseExpired,
    /// It ran in the recoverer's place (machine and PID namespace) and its
    /// process no longer exists.
    ProcessGone,
}

/// What one recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sessions this call finalized with end reason `recovered`, children
    /// before parents.
    pub recovered: Vec<SessionId>,
    /// Turns that were open and are now `interrupted`.
    pub interrupted_turns: Vec<(SessionId, u32)>,
    /// Owners found gone, and why.
    pub owners_gone: Vec<(OwnerId, OwnerGone)>,
    /// Sessions another process took while this one looked at them: it
    /// finalized them, or a live peer released them for adoption (SPEC §12).
    pub finalized_elsewhere: Vec<SessionId>,
}

/// A session that recovery would take over, with its owner and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryCandidate {
    /// The session.
    pub session: SessionId,
    /// Its name.
    pub name: String,
    /// Its state now (anything but finalized).
    pub state: State,
    /// The turn still open, which recovery would mark `interrupted`.
    pub open_turn: Option<u32>,
    /// The process that owns it.
    pub owner: OwnerRow,
    /// Why its owner counts as gone.
    pub reason: OwnerGone,
}

type LiveColumns = (i64, String, String, Option<i64>, OwnerColumns);

/// Every session left live by a gone owner, newest first (children before
/// their parents), read in one snapshot. Writes nothing.
pub(crate) fn candidates(
    mut db: Db<'_>,
    opts: &RecoverOptions,
) -> Result<Vec<RecoveryCandidate>, StoreError> {
    let now = store_now(db.reborrow())?;
    let (live, tree): (Vec<LiveColumns>, Vec<(i64, Option<i64>)>) = read_tx!(db, |c| {
        let live = sessions::table
            .inner_join(owners::table)
            .filter(sessions::state.ne(State::Finalized.as_str()))
            // A released session was left for adoption, not by a crash.
            .filter(sessions::released_at.is_null())
            .order(sessions::id.desc())
            .select((
                sessions::id,
                sessions::name,
                sessions::state,
                sessions::open_turn,
                OWNER_COLUMNS,
            ))
            .load(c)?;
        // Every session not finalized, and its parent: what recovery must
        // not finalize a parent over (G1).
        let tree = sessions::table
            .filter(sessions::state.ne(State::Finalized.as_str()))
            .select((sessions::id, sessions::parent))
            .load(c)?;
        Ok::<_, diesel::result::Error>((live, tree))
    })
    .context("looking for sessions left live")?;

    let mut verdicts: BTreeMap<i64, Option<OwnerGone>> = BTreeMap::new();
    let mut found = Vec::new();
    for (id, name, state, open_turn, owner) in live {
        let owner = OwnerRow::from_columns(owner)?;
        let verdict = *verdicts
            .entry(owner.id.raw()?)
            .or_insert_with(|| verdict(&owner, now, &opts.here));
        let Some(reason) = verdict else { continue };
        found.push(RecoveryCandidate {
            session: session_id(id)?,
            name,
            state: word("sessions.state", &state)?,
            open_turn: open_turn.map(turn_no).transpose()?,
            owner,
            reason,
        });
    }
    let tree = tree
        .into_iter()
        .map(|(id, parent)| Ok((session_id(id)?, parent.map(session_id).transpose()?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(sparing_parents_of_the_left(found, &tree))
}

/// `found` without every candidate that has a descendant recovery leaves
/// live (another owner's, one with no owner row, a released one): G1, a
/// parent is finalized only after its children, holds in recovery too.
/// `live` maps every session not finalized to its parent.
pub(crate) fn sparing_parents_of_the_left(
    found: Vec<RecoveryCandidate>,
    live: &HashMap<SessionId, Option<SessionId>>,
) -> Vec<RecoveryCandidate> {
    let taken: HashSet<SessionId> = found.iter().map(|c| c.session).collect();
    let mut spared = HashSet::default();
    // Each ancestor is walked once, whichever left session reaches it first.
    let mut walked = HashSet::default();
    for (&id, &parent) in live {
        if taken.contains(&id) {
            continue;
        }
        let mut up = parent;
        while let Some(ancestor) = up.filter(|a| walked.insert(*a)) {
            if taken.contains(&ancestor) {
                spared.insert(ancestor);
            }
            up = live.get(&ancestor).copied().flatten();
        }
    }
    if !spared.is_empty() {
        tracing::warn!(
            spared = spared.len(),
            "recovery leaves sessions whose children stay live (another owner's, or with no owner): a parent is not finalized over a live child (G1)"
        );
    }
    found
        .into_iter()
        .filter(|c| !spared.contains(&c.session))
        .collect()
}

/// A piece that gave up on a row lock another database session holds, said
/// as that: which is what the one reading it can act on.
fn said_of_a_held_lock(error: StoreError) -> StoreError {
    match error {
        StoreError::Database { source, .. } if source.to_string().contains("lock timeout") => {
            StoreError::Database {
                context: "recovering sessions: a row another database session holds locked \
                          (a transaction left open, a SELECT ... FOR UPDATE) did not come free \
                          within 2 s, and nothing of the sessions still to recover was written; \
                          run the recovery again once that lock is gone",
                source,
            }
        }
        other => other,
    }
}

/// Whether `owner` is gone at `now` (milliseconds, the store's clock), seen
/// from `here`: its lease expired, or it shares processes with `here` (same
/// machine identity and PID namespace, never a host name alone) and its
/// process is gone.
pub(crate) fn verdict(owner: &OwnerRow, now: i64, here: &HostIdentity) -> Option<OwnerGone> {
    if to_millis(owner.lease_expires_at) <= now {
        Some(OwnerGone::LeaseExpired)
    } else if owner.identity.shares_processes_with(here)
        && crate::sys::process_is_gone(i64::from(owner.pid)) == Some(true)
    {
        Some(OwnerGone::ProcessGone)
    } else {
        None
    }
}

/// How many sessions one transaction of recovery finalizes.
const RECOVER_PER_TRANSACTION: usize = 256;

/// The timeline cause of a session recovery finalizes.
fn recovered_cause(candidate: &RecoveryCandidate) -> String {
    let owner = &candidate.owner;
    match candidate.reason {
        OwnerGone::LeaseExpired => format!("recovered: the lease of owner {} expired", owner.id),
        OwnerGone::ProcessGone => format!(
            "recovered: owner {} (process {} on {}) is gone",
            owner.id, owner.pid, owner.host
        ),
    }
}

/// A session of a piece as read: id, state, version, outcome, open turn,
/// owner, when it was released (if it was).
type PieceColumns = (
    i64,
    String,
    i64,
    Option<String>,
    Option<i64>,
    i64,
    Option<i64>,
);

/// A session of a piece as read, by id: state, version, outcome, open turn,
/// owner, whether it was released for adoption.
type PieceRow = (State, i64, Option<Outcome>, Option<i64>, i64, bool);

/// A session of a piece that is still its gone owner's and live.
struct Target {
    /// Its place in the piece.
    at: usize,
    id: i64,
    from: State,
    open_turn: Option<i64>,
}

/// What a set of recovered sessions is written to, and the version each of
/// them must still have.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct RecoveredSet {
    version: i64,
    outcome: Option<&'static str>,
    at: i64,
}

group_head!(RecoveredSet, |set, out| {
    out.push_sql("UPDATE sessions SET state = 'finalized', end_reason = ");
    out.push_bind_param::<Text, _>(EndReason::Recovered.as_str())?;
    out.push_sql(", outcome = ");
    out.push_bind_param::<Nullable<Text>, _>(&set.outcome)?;
    out.push_sql(", finalized_at = ");
    out.push_bind_param::<BigInt, _>(&set.at)?;
    out.push_sql(
        ", open_turn = NULL, version = version + 1 \
         WHERE state <> 'finalized' AND version = ",
    );
    out.push_bind_param::<BigInt, _>(&set.version)?;
    out.push_sql(" AND id IN (");
    Ok(())
});

/// The open turns of recovered sessions, ended `interrupted`.
#[derive(Clone, Copy)]
struct Interrupted {
    at: i64,
}

group_head!(Interrupted, |set, out| {
    out.push_sql("UPDATE turns SET outcome = ");
    out.push_bind_param::<Text, _>(Outcome::Interrupted.as_str())?;
    out.push_sql(", ended_at = ");
    out.push_bind_param::<BigInt, _>(&set.at)?;
    out.push_sql(" WHERE ended_at IS NULL AND session IN (");
    Ok(())
});

/// Recover the sessions of `piece` inside the caller's transaction, as
/// sets: each session's latch is still a compare-and-set of its own row on
/// the version read (G2), and a session whose row changed meanwhile (another
/// recoverer, on PostgreSQL) goes through [`spend`], which reads it again.
/// One entry per candidate: `None` when it was finalized elsewhere.
fn recover_piece(
    mut db: Db<'_>,
    piece: &[RecoveryCandidate],
    now: i64,
) -> Result<Vec<Option<Spent>>, StoreError> {
    let ids = piece
        .iter()
        .map(|c| sid(c.session))
        .collect::<Result<Vec<i64>, StoreError>>()?;
    let rows: Vec<PieceColumns> = on_db!(db.reborrow(), |c| sessions::table
        .filter(sessions::id.eq_any(&ids))
        .select((
            sessions::id,
            sessions::state,
            sessions::version,
            sessions::outcome,
            sessions::open_turn,
            sessions::owner,
            sessions::released_at,
        ))
        .load(c))
    .context("reading the sessions to recover")?;
    let mut read: HashMap<i64, PieceRow> =
        HashMap::with_capacity_and_hasher(rows.len(), Default::default());
    for (id, state, version, outcome, open_turn, owner, released_at) in rows {
        let state = word("sessions.state", &state)?;
        let outcome = opt_word("sessions.outcome", outcome.as_deref())?;
        let released = released_at.is_some();
        read.insert(id, (state, version, outcome, open_turn, owner, released));
    }
    let mut spent: Vec<Option<Spent>> = piece.iter().map(|_| None).collect();
    let mut targets: Vec<Target> = Vec::with_capacity(piece.len());
    let mut sets: Vec<(RecoveredSet, i64)> = Vec::with_capacity(piece.len());
    for (at, (candidate, &id)) in piece.iter().zip(&ids).enumerate() {
        let Some(&(from, version, outcome, open_turn, owner, released)) = read.get(&id) else {
            return Err(StoreError::UnknownSession(candidate.session));
        };
        // Finalized, taken by another owner, or released for adoption by a
        // live peer since the candidates were read: not recovery's (the
        // update below is conditional on the version read here, so a
        // release committed after this read makes it miss).
        if from == State::Finalized || owner != candidate.owner.id.raw()? || released {
            continue;
        }
        // The open turn is cut: the session ends as it did (G7).
        let outcome = if open_turn.is_some() {
            Some(Outcome::Interrupted)
        } else {
            outcome
        };
        let set = RecoveredSet {
            version,
            outcome: outcome.map(Outcome::as_str),
            at: now,
        };
        sets.push((set, id));
        targets.push(Target {
            at,
            id,
            from,
            open_turn,
        });
    }
    let mut won: HashSet<i64> =
        HashSet::with_capacity_and_hasher(targets.len(), Default::default());
    for (set, keys) in grouped(sets.into_iter()) {
        for part in pieces(&keys) {
            let statement = InList {
                group: &set,
                keys: part,
                tail: " RETURNING id",
            };
            let returned: Vec<i64> = on_db!(db.reborrow(), |c| statement.load(c))
                .context("spending the finalize latch")?;
            won.extend(returned);
        }
    }
    let won_ids: Vec<i64> = targets
        .iter()
        .map(|t| t.id)
        .filter(|id| won.contains(id))
        .collect();
    let mut cut: HashSet<i64> = HashSet::default();
    for part in pieces(&won_ids) {
        let statement = InList {
            group: &Interrupted { at: now },
            keys: part,
            tail: " RETURNING session",
        };
        let returned: Vec<i64> =
            on_db!(db.reborrow(), |c| statement.load(c)).context("interrupting the open turns")?;
        cut.extend(returned);
    }
    let mut encoded: Vec<u8> = Vec::with_capacity(won_ids.len() * 96);
    let mut ranges: Vec<(i64, std::ops::Range<usize>)> = Vec::with_capacity(won_ids.len());
    for target in &targets {
        let candidate = &piece[target.at];
        if !won.contains(&target.id) {
            // Its row changed since it was read: read it again, on its own.
            let cause = recovered_cause(candidate);
            let ending = Ending {
                reason: EndReason::Recovered,
                outcome: None,
                at: now,
                owner: candidate.owner.id.raw()?,
                // A peer may have released it meanwhile: not recovery's.
                released: false,
                cause: &cause,
            };
            spent[target.at] = spend(db.reborrow(), candidate.session, &ending)?;
            continue;
        }
        let start = encoded.len();
        let cause = recovered_cause(candidate);
        crate::timeline::encode(
            &mut encoded,
            [Step {
                at: now,
                from: Some(target.from),
                to: State::Finalized,
                cause: &cause,
            }],
        )?;
        ranges.push((target.id, start..encoded.len()));
        let interrupted = match (target.open_turn, cut.contains(&target.id)) {
            (Some(no), true) => Some(turn_no(no)?),
            _ => None,
        };
        spent[target.at] = Some(Spent { interrupted });
    }
    let segments = ranges
        .into_iter()
        .map(|(session, range)| {
            Ok(Segment {
                session,
                steps: segment_text(&encoded[range])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    for part in pieces(&segments) {
        on_db!(db.reborrow(), |c| insert_rows!(c, part))
            .context("recording the recovered timelines")?;
    }
    Ok(spent)
}

/// Recover every session left live by a gone owner, a piece of sessions per
/// transaction, written as sets (each session's latch still its own, G2).
pub(crate) fn recover(mut db: Db<'_>, opts: &RecoverOptions) -> Result<RecoveryReport, StoreError> {
    let now = to_millis(opts.now);
    let found = candidates(db.reborrow(), opts)?;
    let mut report = RecoveryReport::default();
    for candidate in &found {
        let gone = (candidate.owner.id, candidate.reason);
        if !report.owners_gone.contains(&gone) {
            report.owners_gone.push(gone);
        }
    }
    report.owners_gone.sort();
    // A transaction per piece of sessions, not per session: a commit costs
    // more than the writes of one session's latch.
    for piece in found.chunks(RECOVER_PER_TRANSACTION) {
        let spent = write_tx!(db.reborrow(), |c| {
            let mut db = Db::from(c);
            // A row lock another database session holds is waited for
            // within a bound, as the fleet's moves do, not for as long as
            // it is held: the error says so, and a later run recovers.
            crate::fleet::bound_lock_waits(db.reborrow())?;
            recover_piece(db, piece, now)
        })
        .map_err(said_of_a_held_lock)?;
        for (candidate, spent) in piece.iter().zip(spent) {
            let id = candidate.session;
            match spent {
                Some(spent) => {
                    tracing::info!(session = %id, gone = ?candidate.reason, "recovered a session left live");
                    report.recovered.push(id);
                    if let Some(turn) = spent.interrupted {
                        report.interrupted_turns.push((id, turn));
                    }
                }
                None => report.finalized_elsewhere.push(id),
            }
        }
    }
    Ok(report)
}
