//! Crashes (G7), recovery (G8) and leases.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{self, rt, Backend, TestDb};
use crate::{append_all, now, open, owner, session, texts, write, HOUR};
use settle_store::{
    EndReason, FinalizeRequest, HostIdentity, NewSession, Outcome, OwnerGone, OwnerId, OwnerInfo,
    RecoverOptions, SessionFilter, SessionId, SessionStore, State, Store, StoreError,
};

// --- crash (G7) and recovery (G8) --------------------------------------------------

/// A child process appends chunks, printing each one once acknowledged; it is
/// killed with SIGKILL mid-stream. Every acknowledged chunk must be there.
pub(crate) fn g7_acknowledged_chunks_survive_kill_9(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let mut child = common::child("writer")
        .env("SETTLE_STORE_TEST_URL", &db.url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acked: Vec<(SessionId, u32, String)> = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("ACK ") else {
            continue;
        };
        let mut f = rest.splitn(3, ' ');
        let id = SessionId(f.next().unwrap().parse().unwrap());
        let seq: u32 = f.next().unwrap().parse().unwrap();
        acked.push((id, seq, f.next().unwrap().to_owned()));
        if acked.len() == 400 {
            child.kill().unwrap(); // SIGKILL
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the writer must have been killed");
    assert_eq!(acked.len(), 400, "the writer stopped early");

    let store = open(&db);
    let id = acked[0].0;
    rt().block_on(async {
        let detail = store.session_detail(id).await.unwrap();
        let chunks = &detail.turns[0].chunks;
        for (_, seq, text) in &acked {
            assert_eq!(
                &chunks[*seq as usize].text, text,
                "acknowledged chunk {seq} lost"
            );
        }
        // The writer's process is gone: recovery takes its session over,
        // keeps the transcript, and commits no memory from the cut turn.
        let report = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert_eq!(report.recovered, vec![id]);
        assert!(matches!(
            report.owners_gone[..],
            [(_, OwnerGone::ProcessGone)]
        ));
        let after = store.session_detail(id).await.unwrap();
        assert_eq!(after.session.end_reason, Some(EndReason::Recovered));
        assert_eq!(after.turns[0].outcome, Some(Outcome::Interrupted));
        assert_eq!(after.turns[0].chunks, *chunks);
        assert!(store.memories(id).await.unwrap().is_empty());
    });
}

pub(crate) fn child_writer() {
    let url = std::env::var("SETTLE_STORE_TEST_URL").unwrap();
    let store = Store::open(&url).unwrap();
    rt().block_on(async {
        let (_, id) = session(&store, "doomed").await;
        write::start_turn(&store, id, 1, None, now()).await.unwrap();
        let mut pending = std::collections::VecDeque::new();
        let mut i = 0u64;
        loop {
            // Keep a few chunks in flight so that kills land mid-batch.
            while pending.len() < 8 {
                let text = format!("chunk-{i}");
                pending.push_back((text.clone(), store.append_chunk(id, 1, text.into())));
                i += 1;
            }
            let (text, receipt) = pending.pop_front().unwrap();
            let ack = receipt.await.unwrap();
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "ACK {} {} {}", id, ack.seq, text).unwrap();
            out.flush().unwrap();
        }
    });
}

/// An owner elsewhere (a place that shares no processes with this one), with
/// a live lease.
pub(crate) async fn owner_elsewhere(store: &dyn SessionStore, pid: u32) -> OwnerId {
    store
        .register_owner(
            OwnerInfo {
                host: "elsewhere".into(),
                identity: HostIdentity {
                    machine: Some("another-machine".into()),
                    pid_namespace: Some(1),
                },
                pid,
                started_at: now(),
                advertise: None,
            },
            HOUR,
        )
        .await
        .unwrap()
}

/// End `owner`'s lease now, as if its process had stalled past it: a
/// renewal for no time at all.
pub(crate) async fn expire(store: &dyn SessionStore, owner: OwnerId) {
    store.renew_lease(owner, Duration::ZERO).await.unwrap();
}

pub(crate) fn g8_recover_expired_lease(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        // An owner whose lease expires at once, on a host that is not this one.
        let crashed = owner_elsewhere(&*store, 4_000_000).await;
        let parent = write::register(&*store, NewSession::new("p", crashed))
            .await
            .unwrap();
        let child = write::register(&*store, NewSession::new("c", crashed).with_parent(parent))
            .await
            .unwrap();
        write::start_turn(&*store, child, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, child, 1, &["done"]).await;
        write::end_turn(&*store, child, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        write::start_turn(&*store, child, 2, None, now())
            .await
            .unwrap();
        append_all(&*store, child, 2, &["cut", " short"]).await;
        let (_, live) = session(&*store, "live").await;

        let later = now() + Duration::from_secs(1);
        expire(&*store, crashed).await;
        let opts = RecoverOptions {
            here: HostIdentity::unknown(),
            now: later,
        };
        let report = store.recover(opts.clone()).await.unwrap();
        assert_eq!(
            report.recovered,
            vec![child, parent],
            "children before parents"
        );
        assert_eq!(report.interrupted_turns, vec![(child, 2)]);
        assert_eq!(report.owners_gone, vec![(crashed, OwnerGone::LeaseExpired)]);

        let detail = store.session_detail(child).await.unwrap();
        assert_eq!(detail.session.state, State::Finalized);
        assert_eq!(detail.session.end_reason, Some(EndReason::Recovered));
        assert_eq!(detail.session.outcome, Some(Outcome::Interrupted));
        assert_eq!(detail.turns[0].outcome, Some(Outcome::Completed));
        assert_eq!(detail.turns[1].outcome, Some(Outcome::Interrupted));
        assert_eq!(texts(&detail.turns[1]), vec!["cut", " short"]);
        let last = detail.timeline.last().unwrap();
        assert_eq!(
            (last.from, last.to),
            (Some(State::Registered), State::Finalized)
        );
        assert!(last.cause.contains("lease"), "{}", last.cause);
        assert!(store.memories(child).await.unwrap().is_empty());
        let live_row = &store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap()[2];
        assert_eq!((live_row.id, live_row.state), (live, State::Registered));

        // Idempotent.
        let again = store.recover(opts).await.unwrap();
        assert!(again.recovered.is_empty(), "{again:?}");
        // The crashed owner's lease cannot be renewed any more.
        let err = store.renew_lease(crashed, HOUR).await.unwrap_err();
        assert!(
            matches!(err, StoreError::LeaseLost(o) if o == crashed),
            "{err:?}"
        );
    });
}

/// Found from outside: a crashed owner's session whose child another,
/// live owner holds (or whose child has no owner row) was finalized
/// `recovered` over that live child (G1). Recovery spares every session
/// with a descendant it leaves live, and takes the rest: here the crashed
/// owner's other tree.
pub(crate) fn g1_g8_recovery_never_finalizes_a_parent_over_a_child_it_leaves_live(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let crashed = owner_elsewhere(&*store, 4_000_001).await;
        let alive = owner(&*store, HOUR).await;
        let top = write::register(&*store, NewSession::new("top", crashed))
            .await
            .unwrap();
        let middle = write::register(&*store, NewSession::new("middle", crashed).with_parent(top))
            .await
            .unwrap();
        // Another owner's child under the crashed owner's session.
        let theirs = write::register(
            &*store,
            NewSession::new("theirs", alive).with_parent(middle),
        )
        .await
        .unwrap();
        let alone = write::register(&*store, NewSession::new("alone", crashed))
            .await
            .unwrap();
        let leaf = write::register(&*store, NewSession::new("leaf", crashed).with_parent(alone))
            .await
            .unwrap();
        expire(&*store, crashed).await;
        let opts = RecoverOptions {
            here: HostIdentity::unknown(),
            now: now() + Duration::from_secs(1),
        };
        let listed: Vec<SessionId> = store
            .recovery_candidates(opts.clone())
            .await
            .unwrap()
            .iter()
            .map(|c| c.session)
            .collect();
        assert_eq!(listed, vec![leaf, alone], "the dry run says the same");
        let report = store.recover(opts).await.unwrap();
        assert_eq!(report.recovered, vec![leaf, alone]);
        for (id, state) in [
            (top, State::Registered),
            (middle, State::Registered),
            (theirs, State::Registered),
            (alone, State::Finalized),
        ] {
            let row = store.session_detail(id).await.unwrap().session;
            assert_eq!(row.state, state, "session {id}");
        }
    });
}

/// An owner whose process is gone is recovered at once by a recoverer in the
/// same place (machine identity and PID namespace). Owners elsewhere — even
/// with the same host name and pid — and live processes here are left to
/// their leases.
pub(crate) fn g8_recover_gone_process_on_this_host(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = exited.id();
    exited.wait().unwrap();
    rt().block_on(async {
        let store = open(&db);
        let here = HostIdentity::this_process();
        let host = settle_store::local_host_name();
        let reg = |identity: HostIdentity, pid: u32| {
            let (store, host) = (store.clone(), host.clone());
            async move {
                store
                    .register_owner(
                        OwnerInfo {
                            host,
                            identity,
                            pid,
                            started_at: now(),
                            advertise: None,
                        },
                        HOUR,
                    )
                    .await
                    .unwrap()
            }
        };
        let other_machine = HostIdentity {
            machine: Some("a-clone-of-this-machine".into()),
            ..here.clone()
        };
        let other_namespace = HostIdentity {
            pid_namespace: here.pid_namespace.map(|ns| ns + 1),
            ..here.clone()
        };
        let dead_here = reg(here.clone(), gone_pid).await;
        let same_name_other_machine = reg(other_machine, gone_pid).await;
        let same_name_other_namespace = reg(other_namespace, gone_pid).await;
        let unknown_place = reg(HostIdentity::unknown(), gone_pid).await;
        let alive_here = reg(here.clone(), std::process::id()).await;
        let mut ids = Vec::new();
        for owner in [
            dead_here,
            same_name_other_machine,
            same_name_other_namespace,
            unknown_place,
            alive_here,
        ] {
            ids.push(
                write::register(&*store, NewSession::new("s", owner))
                    .await
                    .unwrap(),
            );
        }
        let report = store
            .recover(RecoverOptions {
                here: here.clone(),
                now: now(),
            })
            .await
            .unwrap();
        assert_eq!(report.recovered, vec![ids[0]]);
        assert_eq!(
            report.owners_gone,
            vec![(dead_here, OwnerGone::ProcessGone)]
        );
        let states: Vec<_> = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.state)
            .collect();
        assert_eq!(
            states,
            [
                State::Finalized,
                State::Registered,
                State::Registered,
                State::Registered,
                State::Registered
            ]
        );
        // Seen from a machine that shares only the host name, no missing
        // pid names a process of its own: nothing more is recovered.
        let report = store
            .recover(RecoverOptions {
                here: HostIdentity {
                    machine: Some("a-third-machine".into()),
                    ..here.clone()
                },
                now: now(),
            })
            .await
            .unwrap();
        assert!(report.recovered.is_empty(), "{report:?}");
    });
}

pub(crate) fn g8_two_stores_recovering_at_once_finalize_once(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let rt = rt();
    let (one, two) = (open(&db), open(&db));
    rt.block_on(async {
        let crashed = owner_elsewhere(&*one, 1).await;
        let mut ids = BTreeSet::new();
        for i in 0..30 {
            ids.insert(
                write::register(&*one, NewSession::new(format!("s{i}"), crashed))
                    .await
                    .unwrap(),
            );
        }
        expire(&*one, crashed).await;
        let opts = RecoverOptions {
            here: HostIdentity::unknown(),
            now: now() + Duration::from_secs(1),
        };
        let (a, b) = tokio::join!(
            tokio::spawn({
                let (s, o) = (one.clone(), opts.clone());
                async move { s.recover(o).await }
            }),
            tokio::spawn({
                let (s, o) = (two.clone(), opts.clone());
                async move { s.recover(o).await }
            })
        );
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        let mut all: Vec<SessionId> = a.recovered.iter().chain(&b.recovered).copied().collect();
        all.sort();
        assert_eq!(
            all,
            ids.iter().copied().collect::<Vec<_>>(),
            "each session recovered once"
        );
        for id in ids {
            let d = two.session_detail(id).await.unwrap();
            assert_eq!(
                d.timeline
                    .iter()
                    .filter(|t| t.to == State::Finalized)
                    .count(),
                1
            );
        }
    });
}

/// Two processes race on one database: one finalizes every session, the
/// other recovers them (their owner's process is gone from this machine),
/// in opposite orders.
/// Every session is finalized exactly once, by one of them.
pub(crate) fn g2_g8_two_processes_race_finalize_and_recover(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let sessions = 30;
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let gone = exited.id();
    exited.wait().unwrap();
    let ids: Vec<SessionId> = rt().block_on(async {
        let store = open(&db);
        // Its process is gone from this machine; its lease still runs, so
        // the finalizer may still write as it, and the recoverer may take
        // its sessions over.
        let crashed = store
            .register_owner(
                OwnerInfo {
                    host: settle_store::local_host_name(),
                    identity: HostIdentity::this_process(),
                    pid: gone,
                    started_at: now(),
                    advertise: None,
                },
                HOUR,
            )
            .await
            .unwrap();
        let mut ids = Vec::new();
        for i in 0..sessions {
            let id = write::register(&*store, NewSession::new(format!("s{i}"), crashed))
                .await
                .unwrap();
            write::start_turn(&*store, id, 1, None, now())
                .await
                .unwrap();
            append_all(&*store, id, 1, &["whole"]).await;
            write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
                .await
                .unwrap();
            write::start_turn(&*store, id, 2, None, now())
                .await
                .unwrap();
            append_all(&*store, id, 2, &["partial"]).await;
            ids.push(id);
        }
        ids
    });
    let start_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 700;
    let racers: Vec<_> = ["finalizer", "recoverer"]
        .iter()
        .map(|role| {
            common::child(role)
                .env("SETTLE_STORE_TEST_URL", &db.url)
                .env("SETTLE_STORE_TEST_START_AT", start_at.to_string())
                .env(
                    "SETTLE_STORE_TEST_IDS",
                    ids.iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                )
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut winners: BTreeMap<SessionId, Vec<&str>> = BTreeMap::new();
    for (child, role) in racers.into_iter().zip(["finalizer", "recoverer"]) {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{role} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(id) = line.strip_prefix("WON ") {
                winners
                    .entry(SessionId(id.parse().unwrap()))
                    .or_default()
                    .push(role);
            }
        }
    }
    let store = open(&db);
    rt().block_on(async {
        for id in &ids {
            let won_by = winners.get(id).cloned().unwrap_or_default();
            assert_eq!(won_by.len(), 1, "session {id} won by {won_by:?}");
            let d = store.session_detail(*id).await.unwrap();
            assert_eq!(d.session.state, State::Finalized);
            assert_eq!(
                d.timeline
                    .iter()
                    .filter(|t| t.to == State::Finalized)
                    .count(),
                1
            );
            let memories = store.memories(*id).await.unwrap();
            if won_by[0] == "finalizer" {
                assert_eq!(d.session.end_reason, Some(EndReason::Shutdown));
                assert_eq!(memories.len(), 1, "memory from the completed turn only");
                assert_eq!(memories[0].content, "whole");
            } else {
                assert_eq!(d.session.end_reason, Some(EndReason::Recovered));
                assert!(memories.is_empty());
            }
            assert_eq!(d.turns[1].outcome, Some(Outcome::Interrupted));
        }
    });
    eprintln!(
        "race: finalizer won {}, recoverer won {}",
        winners.values().filter(|w| w[0] == "finalizer").count(),
        winners.values().filter(|w| w[0] == "recoverer").count()
    );
}

pub(crate) fn child_racer(role: &str) {
    let url = std::env::var("SETTLE_STORE_TEST_URL").unwrap();
    let start_at: u128 = std::env::var("SETTLE_STORE_TEST_START_AT")
        .unwrap()
        .parse()
        .unwrap();
    let mut ids: Vec<SessionId> = std::env::var("SETTLE_STORE_TEST_IDS")
        .unwrap()
        .split(',')
        .map(|s| SessionId(s.parse().unwrap()))
        .collect();
    let store = Store::open(&url).unwrap();
    let wait = start_at.saturating_sub(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    );
    std::thread::sleep(Duration::from_millis(wait as u64));
    rt().block_on(async {
        let mut won = Vec::new();
        if role == "finalizer" {
            ids.reverse();
            for id in ids {
                let plan = FinalizeRequest::new(EndReason::Shutdown).commit_memory(true);
                if write::finalize(&store, id, plan).await.unwrap().won() {
                    won.push(id);
                }
            }
        } else {
            let opts = RecoverOptions::now_on_this_host();
            won = store.recover(opts).await.unwrap().recovered;
        }
        for id in won {
            println!("WON {id}");
        }
    });
}

// --- leases -------------------------------------------------------------------------

pub(crate) fn leases_renew_until_they_lapse(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let o = owner(&*store, HOUR).await;
        let until = store
            .renew_lease(o, Duration::from_secs(7200))
            .await
            .unwrap();
        assert!(until > now() + HOUR);
        let short = owner(&*store, Duration::ZERO).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let err = store.renew_lease(short, HOUR).await.unwrap_err();
        assert!(
            matches!(err, StoreError::LeaseLost(x) if x == short),
            "{err:?}"
        );
        let err = store.renew_lease(OwnerId(987_654), HOUR).await.unwrap_err();
        assert!(matches!(err, StoreError::UnknownOwner(_)), "{err:?}");
    });
}

/// `settle recover --dry-run`: the candidates with their owner, lease and
/// reason, and nothing written; recovery then takes exactly those.
pub(crate) fn g8_recover_dry_run_names_candidates_and_writes_nothing(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let crashed = owner_elsewhere(&*store, 4_000_001).await;
        let root = write::register(&*store, NewSession::new("root", crashed))
            .await
            .unwrap();
        let kid = write::register(&*store, NewSession::new("kid", crashed).with_parent(root))
            .await
            .unwrap();
        write::start_turn(&*store, kid, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, kid, 1, &["partial"]).await;
        expire(&*store, crashed).await;
        let (_, live) = session(&*store, "live").await;
        let options = RecoverOptions {
            here: HostIdentity::unknown(),
            now: now() + Duration::from_secs(1),
        };
        let before: Vec<_> = {
            let mut all = Vec::new();
            for id in [root, kid, live] {
                all.push(store.session_detail(id).await.unwrap());
            }
            all
        };

        let candidates = store.recovery_candidates(options.clone()).await.unwrap();
        let seen: Vec<_> = candidates
            .iter()
            .map(|c| (c.session, c.name.as_str(), c.state, c.open_turn, c.reason))
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    kid,
                    "kid",
                    State::Registered,
                    Some(1),
                    OwnerGone::LeaseExpired
                ),
                (
                    root,
                    "root",
                    State::Registered,
                    None,
                    OwnerGone::LeaseExpired
                ),
            ],
            "children before parents"
        );
        let owner = &candidates[0].owner;
        assert_eq!(
            (owner.id, owner.host.as_str(), owner.pid),
            (crashed, "elsewhere", 4_000_001)
        );
        assert!(owner.lease_expires_at <= options.now);

        for (id, was) in [root, kid, live].into_iter().zip(&before) {
            assert_eq!(
                &store.session_detail(id).await.unwrap(),
                was,
                "the dry run wrote"
            );
        }
        // It is read-only, so asking again gives the same answer.
        assert_eq!(
            store.recovery_candidates(options.clone()).await.unwrap(),
            candidates
        );

        let report = store.recover(options.clone()).await.unwrap();
        assert_eq!(report.recovered, vec![kid, root]);
        assert!(store.recovery_candidates(options).await.unwrap().is_empty());
    });
}
