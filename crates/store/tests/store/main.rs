//! The store's test suite. Every test in `on_every_backend!` runs on SQLite,
//! on PostgreSQL and on [`MemoryStore`](settle_store::MemoryStore), the
//! in-memory store the runtime's own tests run on, so the two implementations
//! cannot drift apart; those in `on_durable_backends!` need a database (files,
//! processes, a crash) and run on SQLite and PostgreSQL. A few concern one
//! backend's `open` only. Tests of a guarantee are named after it (`g2_...`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod bounds;
mod finalize;
mod fleet;
mod ids;
mod inputs;
mod leases;
mod lifecycle;
mod open;
mod reads;
mod recovery;
mod transcripts;
mod write;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::TestDb;
use settle_store::{NewSession, OwnerId, OwnerInfo, SessionId, SessionStore, TurnRow};

/// One `#[test]` per backend and test, in modules named after the backends:
/// `every` tests run on all three, `durable` ones on the two databases.
macro_rules! on_backends {
    (
        every: [$($em:ident :: $every:ident),* $(,)?],
        durable: [$($dm:ident :: $durable:ident),* $(,)?] $(,)?
    ) => {
        mod sqlite {
            $( #[test] fn $every() { crate::$em::$every(crate::common::Backend::Sqlite) } )*
            $( #[test] fn $durable() { crate::$dm::$durable(crate::common::Backend::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $every() { crate::$em::$every(crate::common::Backend::Postgres) } )*
            $( #[test] fn $durable() { crate::$dm::$durable(crate::common::Backend::Postgres) } )*
        }
        mod memory {
            $( #[test] fn $every() { crate::$em::$every(crate::common::Backend::Memory) } )*
        }
    };
}

on_backends! {
    // The contract of `SessionStore`: every implementation keeps it.
    every: [
        ids::reserved_ids_are_never_handed_out_twice,
        lifecycle::sessions_form_trees_under_open_parents,
        lifecycle::transition_is_conditional_and_recorded,
        lifecycle::chunks_keep_append_order_per_turn,
        lifecycle::g10_turn_closed_after_end_turn,
        lifecycle::g10_a_closed_turn_refuses_its_chunks_and_not_those_batched_with_it,
        lifecycle::g10_a_batch_of_many_turns_refuses_the_closed_ones_and_not_the_rest,
        lifecycle::g10_session_closed_after_finalize,
        lifecycle::every_refusal_names_its_reason,
        finalize::g2_finalize_latch_wins_once_across_stores,
        finalize::g7_memory_only_from_completed_turns,
        recovery::g8_recover_expired_lease,
        recovery::g8_recover_gone_process_on_this_host,
        recovery::g1_g8_recovery_never_finalizes_a_parent_over_a_child_it_leaves_live,
        recovery::g8_two_stores_recovering_at_once_finalize_once,
        recovery::leases_renew_until_they_lapse,
        reads::flush_waits_for_every_appended_chunk,
        reads::lists_and_details_carry_the_cli_fields,
        reads::sessions_list_newest_first_with_filters,
        reads::sessions_list_pages_after_a_cursor_among_given_ids,
        recovery::g8_recover_dry_run_names_candidates_and_writes_nothing,
        transcripts::g7_whole_transcripts_keep_input_chunks_and_errors,
        transcripts::g7_a_turn_without_reply_text_commits_no_memory,
        transcripts::resumed_sessions_name_the_session_they_continue,
        transcripts::a_page_of_a_turn_is_that_turn_of_the_whole_session_from_a_chunk,
        inputs::turn_inputs_are_additions_and_read_back_whole,
        batch::g2_a_finalize_that_loses_its_race_does_not_fail_the_batch,
        batch::batch_writes_meet_the_session_the_writes_before_left,
        batch::g7_a_batch_commits_memory_from_turns_it_completed,
        batch::batch_registrations_answer_ids_and_refuse_alone,
        batch::a_batch_larger_than_a_statement_is_applied_whole,
        batch::batches_are_applied_in_the_order_first_polled,
        batch::a_finalize_carrying_its_steps_and_turn_end_writes_what_the_writes_one_by_one_do,
        leases::g8_an_owner_whose_lease_expired_gets_lease_lost_on_renew_and_writes,
        leases::g8_a_recoverer_whose_clock_runs_ahead_does_not_recover_a_live_owner,
        leases::g8_owners_named_alike_on_different_machines_keep_their_live_sessions,
    ],
    // What only a database does: keep a schema, survive a crash, be shared by
    // processes, run a trigger.
    durable: [
        open::schema_is_created_on_first_use_and_kept,
        open::g11_newer_schema_is_refused_and_left_alone,
        open::a_store_opened_to_read_reads_beside_its_writer_and_writes_nothing,
        lifecycle::a_nul_in_a_chunks_text_is_kept_with_its_batch,
        open::an_old_database_upgrades_in_place,
        open::the_state_check_refuses_other_words_without_a_temporary_table,
        inputs::an_old_whole_conversation_row_reads_as_before,
        lifecycle::a_session_marked_closing_admits_no_new_turn,
        lifecycle::chunk_numbers_continue_from_a_turns_last_chunk_in_every_store,
        finalize::a_failed_finalize_step_is_reported_and_recorded,
        recovery::g7_acknowledged_chunks_survive_kill_9,
        recovery::g2_g8_two_processes_race_finalize_and_recover,
        batch::a_failed_batch_writes_nothing,
        batch::g1_a_batch_chained_behind_one_that_failed_is_refused_until_one_that_is_not,
        batch::a_turn_ended_by_its_finalize_reads_ended_without_its_own_row_write,
        batch::g2_the_set_latch_answers_as_the_rules_do,
        fleet::g12_two_processes_racing_to_adopt_a_released_session_adopt_it_once,
        fleet::g12_releasing_many_sessions_at_once_refuses_each_that_may_not_go_alone,
        fleet::g12_g8_the_former_owner_never_writes_a_released_or_adopted_session,
        fleet::g12_g2_a_released_session_nobody_adopts_is_reaped_once,
        fleet::g3_g12_a_held_release_is_not_reaped_and_its_holds_go_to_its_adopter,
        fleet::g3_g12_a_crashed_owners_held_session_is_adopted_held,
        fleet::g8_g12_a_crashed_peers_sessions_are_released_with_their_turn_interrupted,
        fleet::g8_g12_a_peer_whose_process_is_gone_here_is_released_before_its_lease_ends,
        fleet::g12_a_sessions_principal_comes_with_its_adoption,
        fleet::a_principal_is_recorded_with_its_sessions_registration,
        fleet::g1_g12_adopting_a_grandchild_adopts_its_whole_tree,
        fleet::g1_g3_the_fleets_reap_never_finalizes_a_parent_over_a_live_child,
        fleet::g8_g12_recovery_leaves_a_session_released_after_it_read_its_candidates,
        fleet::g8_g12_recovery_leaves_a_session_released_while_its_piece_is_written,
    ],
}

/// A store on `db`. Every call opens another handle on the same data (for
/// MemoryStore, a clone sharing its tables), as another process would.
fn open(db: &TestDb) -> Arc<dyn SessionStore> {
    db.open()
}

async fn owner(store: &dyn SessionStore, ttl: Duration) -> OwnerId {
    store
        .register_owner(OwnerInfo::this_process(), ttl)
        .await
        .unwrap()
}

/// A trigger `name` that fails every `event` (`BEFORE INSERT ON memories`)
/// with `message`, as a database refusing writes does (a full disk); gone
/// again with [`drop_failing_trigger`]. Databases only.
fn failing_trigger(db: &TestDb, b: common::Backend, name: &str, event: &str, message: &str) {
    match b {
        common::Backend::Sqlite => db.execute(&format!(
            "CREATE TRIGGER {name} {event} BEGIN SELECT RAISE(ABORT, '{message}'); END;"
        )),
        common::Backend::Postgres => db.execute(&format!(
            "CREATE FUNCTION {name}() RETURNS trigger AS $$ \
             BEGIN RAISE EXCEPTION '{message}'; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER {name} {event} FOR EACH ROW EXECUTE FUNCTION {name}();"
        )),
        common::Backend::Memory => unreachable!("a database test"),
    }
}

/// Drops [`failing_trigger`] `name` on `table`.
fn drop_failing_trigger(db: &TestDb, b: common::Backend, name: &str, table: &str) {
    db.execute(&match b {
        common::Backend::Postgres => format!("DROP TRIGGER {name} ON {table}"),
        _ => format!("DROP TRIGGER {name}"),
    });
}

const HOUR: Duration = Duration::from_secs(3600);

fn now() -> SystemTime {
    SystemTime::now()
}

/// A session with a live owner.
async fn session(store: &dyn SessionStore, name: &str) -> (OwnerId, SessionId) {
    let o = owner(store, HOUR).await;
    let id = write::register(store, NewSession::new(name, o))
        .await
        .unwrap();
    (o, id)
}

/// The texts of a turn's chunks, in order.
fn texts(turn: &TurnRow) -> Vec<String> {
    turn.chunks.iter().map(|c| c.text.clone()).collect()
}

/// Append `texts` to a turn and wait for every acknowledgement.
async fn append_all(
    store: &dyn SessionStore,
    id: SessionId,
    turn: u32,
    texts: &[&str],
) -> Vec<u32> {
    let receipts: Vec<_> = texts
        .iter()
        .map(|t| store.append_chunk(id, turn, (*t).into()))
        .collect();
    let mut seqs = Vec::new();
    for r in receipts {
        seqs.push(r.await.unwrap().seq);
    }
    seqs
}

// --- children --------------------------------------------------------------------------------

/// Not a test of its own: the entry point of the child processes of the
/// suite. Does nothing unless the role variable is set.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(common::ROLE) else {
        return;
    };
    // The test harness has printed `test child_process ... ` without a line end.
    println!();
    match role.as_str() {
        "writer" => recovery::child_writer(),
        "finalizer" | "recoverer" => recovery::child_racer(&role),
        "read_only" => open::child_read_only(),
        other => panic!("unknown child role {other}"),
    }
}
