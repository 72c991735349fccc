//! `settle show` prints each turn's reply as flowing text, `settle export`
//! writes Markdown to read and JSON Lines to replay, and `settle show
//! --trace` writes a Chrome trace that Perfetto opens: each checked against
//! what `show --json` says about the same sessions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{json, Value};
use settle_tests::{assert_success, by_name, id_of, Sandbox};

/// A root whose first turn's reply comes in pieces over two lines and whose
/// second turn fails, with a worker that the root's end cancels mid-turn.
const TALK: &str = r#"
name = "talk"
[[agent]]
name = "root"
[[agent.turn]]
chunks = ["Hello", ", ", "world", "!\nSecond line"]
chunk_delay_ms = 5
[[agent.turn]]
chunks = ["partial"]
chunk_delay_ms = 5
end = "fail"
[[agent]]
name = "worker"
parent = "root"
[[agent.turn]]
chunks = ["w1", "w2", "w3", "w4", "w5", "w6"]
chunk_delay_ms = 200
"#;

fn talked() -> Sandbox {
    let sandbox = Sandbox::new();
    let scenario = sandbox.write("talk.toml", TALK);
    let out = sandbox.run(&["run", "--json", scenario.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "the root failed");
    sandbox
}

fn stdout(sandbox: &Sandbox, args: &[&str]) -> String {
    let out = sandbox.run(args);
    assert_success(&out, &format!("settle {args:?}"));
    String::from_utf8(out.stdout).unwrap()
}

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(format!("{name}.toml"))
}

#[test]
fn show_prints_each_reply_as_flowing_text_then_its_outcome() {
    let sandbox = talked();
    let text = stdout(&sandbox, &["show", "1"]);
    assert!(
        text.contains("  reply:\n    Hello, world!\n    Second line\n  outcome: completed\n"),
        "{text}"
    );
    // Each turn after the prompt it was sent; a failed one with its reason.
    assert!(
        text.contains("  user:\n    root turn 1\n  reply:\n    Hello, world!\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "  user:\n    root turn 2\n  reply:\n    partial\n  outcome: failed\n  \
             error: the provider reported an error: the scripted turn fails here (provider)\n"
        ),
        "{text}"
    );
    let turn_headers = text.lines().filter(|l| l.starts_with("turn ")).count();
    assert_eq!(turn_headers, 2, "{text}");

    let json = sandbox.show(1);
    let first = &json["turns"][0];
    assert_eq!(first["text"], "Hello, world!\nSecond line");
    assert_eq!(
        first["chunks"],
        json!(["Hello", ", ", "world", "!\nSecond line"])
    );
    assert_eq!(
        first["input"],
        json!([{"role": "user", "content": "root turn 1"}])
    );
    assert!(first["error"].is_null());
    let failed = &json["turns"][1];
    assert_eq!(failed["text"], "partial");
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(failed["error"]["kind"], "provider");
    assert_eq!(
        failed["error"]["message"],
        "the provider reported an error: the scripted turn fails here"
    );
    assert!(json["session"]["resumed_from"].is_null());
}

#[test]
fn export_markdown_reads_as_a_transcript() {
    let sandbox = talked();
    let md = stdout(&sandbox, &["export", "1"]);
    assert!(md.starts_with("# Session 1: root\n"), "{md}");
    assert!(md.contains("## Turn 1\n"), "{md}");
    assert!(
        md.contains("**reply:**\n\nHello, world!\nSecond line\n\n**Outcome:** completed\n"),
        "{md}"
    );
    assert!(
        md.contains(
            "**Outcome:** failed\n\n**Error** (`provider`): the provider reported an error: \
             the scripted turn fails here\n"
        ),
        "{md}"
    );
    assert!(md.contains("\n**user:**\n\nroot turn 2\n"), "{md}");
    assert!(md.contains("\n## Timeline\n"), "{md}");
    // -o writes the same text to a file, and nothing on stdout.
    let file = sandbox.path().join("root.md");
    let quiet = stdout(
        &sandbox,
        &[
            "export",
            "1",
            "--format",
            "md",
            "-o",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(quiet, "");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), md);
}

/// Replays JSON Lines into what `show --json` says: the turns (input,
/// chunks, outcome and error) and the timeline (from, to, cause).
fn replay(jsonl: &str) -> (Value, Vec<Value>, Vec<Value>) {
    let mut session = Value::Null;
    let mut turns: BTreeMap<u64, Value> = BTreeMap::new();
    let mut timeline = Vec::new();
    for line in jsonl.lines() {
        let event: Value = serde_json::from_str(line).expect("one JSON object a line");
        match event["event"].as_str().unwrap() {
            "session" => session = event,
            "transition" => timeline
                .push(json!({"from": event["from"], "to": event["to"], "cause": event["cause"]})),
            "turn_input" => {
                let no = event["turn"].as_u64().unwrap();
                let turn = json!({"input": event["messages"], "chunks": []});
                assert!(turns.insert(no, turn).is_none());
            }
            "chunk" => {
                let turn = turns.get_mut(&event["turn"].as_u64().unwrap()).unwrap();
                assert!(
                    turn.get("outcome").is_none(),
                    "a chunk after its turn's end"
                );
                let chunks = turn["chunks"].as_array_mut().unwrap();
                assert_eq!(event["seq"].as_u64(), Some(chunks.len() as u64));
                // As show --json gives them: text as a string, the others
                // as {kind, data}.
                chunks.push(match event["kind"].as_str() {
                    Some("text") => event["text"].clone(),
                    _ => json!({"kind": event["kind"], "data": event["data"]}),
                });
            }
            "turn_end" => {
                let turn = turns.get_mut(&event["turn"].as_u64().unwrap()).unwrap();
                turn["outcome"] = event["outcome"].clone();
                turn["error"] = event["error"].clone();
            }
            other => panic!("unknown event {other}"),
        }
    }
    let turns = turns
        .into_iter()
        .map(|(no, mut turn)| {
            turn["no"] = json!(no);
            turn
        })
        .collect();
    (session, turns, timeline)
}

#[test]
fn export_jsonl_replays_to_what_show_says() {
    let sandbox = talked();
    let sessions = sandbox.sessions();
    for session in &sessions {
        let id = id_of(session).to_string();
        let jsonl = stdout(&sandbox, &["export", &id, "--format", "jsonl"]);
        let (head, turns, timeline) = replay(&jsonl);
        let mut head = head;
        head.as_object_mut().unwrap().remove("event");
        assert_eq!(&head, session);
        let shown = sandbox.show(id_of(session));
        let expected_turns: Vec<Value> = shown["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                json!({"no": t["no"], "outcome": t["outcome"], "chunks": t["chunks"],
                       "input": t["input"], "error": t["error"]})
            })
            .collect();
        assert_eq!(turns, expected_turns, "{jsonl}");
        let expected_timeline: Vec<Value> = shown["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| json!({"from": t["from"], "to": t["to"], "cause": t["cause"]}))
            .collect();
        assert_eq!(timeline, expected_timeline, "{jsonl}");
        // Every line names its session.
        for line in jsonl.lines().skip(1) {
            let event: Value = serde_json::from_str(line).unwrap();
            assert_eq!(event["session"], session["id"], "{line}");
        }
    }
}

/// The events of a trace on each track (`tid`).
fn by_track(events: &[Value]) -> BTreeMap<u64, Vec<&Value>> {
    let mut tracks: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for event in events {
        tracks
            .entry(event["tid"].as_u64().unwrap())
            .or_default()
            .push(event);
    }
    tracks
}

/// Checks that the complete events of one track nest: sorted by start (the
/// longer first), each lies within the one it starts in.
fn assert_nested(tid: u64, events: &[&Value]) {
    let mut spans: Vec<(u64, u64, &str)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_u64().unwrap();
            (
                ts,
                ts + e["dur"].as_u64().unwrap(),
                e["name"].as_str().unwrap(),
            )
        })
        .collect();
    spans.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let contains = |outer: &(u64, u64, &str), inner: &(u64, u64, &str)| {
        outer.0 <= inner.0 && inner.1 <= outer.1
    };
    let mut open: Vec<(u64, u64, &str)> = Vec::new();
    for span in spans {
        while let Some(top) = open.last() {
            if contains(top, &span) {
                break;
            }
            assert!(
                top.1 <= span.0,
                "track {tid}: {span:?} overlaps {top:?} without nesting in it"
            );
            open.pop();
        }
        open.push(span);
    }
}

/// The names of `top` and its descendants, depth first, children by id.
fn depth_first(sessions: &[Value], top: u64) -> Vec<&str> {
    let session = sessions.iter().find(|s| id_of(s) == top).unwrap();
    let mut names = vec![session["name"].as_str().unwrap()];
    let mut kids: Vec<u64> = sessions
        .iter()
        .filter(|s| s["parent"] == top)
        .map(id_of)
        .collect();
    kids.sort_unstable();
    for kid in kids {
        names.extend(depth_first(sessions, kid));
    }
    names
}

fn trace_of(sandbox: &Sandbox, id: u64) -> Value {
    let path = sandbox.path().join(format!("trace-{id}.json"));
    let said = stdout(
        sandbox,
        &["show", &id.to_string(), "--trace", path.to_str().unwrap()],
    );
    assert!(said.contains("ui.perfetto.dev"), "{said}");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("the trace is JSON")
}

/// On each track of `events`: spans nest, the states follow the timeline,
/// every turn and chunk is there, a cancel for each cancelled session, one
/// finalize with its end reason.
fn assert_tracks(sandbox: &Sandbox, sessions: &[Value], events: &[Value]) {
    let tracks = by_track(events);
    for session in sessions {
        let tid = id_of(session);
        let track = &tracks[&tid];
        assert_nested(tid, track);
        let shown = sandbox.show(tid);
        let states: Vec<&str> = track
            .iter()
            .filter(|e| e["cat"] == "state" && e["ph"] == "X")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        let timeline: Vec<&str> = shown["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["to"].as_str().unwrap())
            .filter(|to| *to != "finalized")
            .collect();
        assert_eq!(states, timeline, "{}", session["name"]);
        let turns: BTreeSet<&str> = track
            .iter()
            .filter(|e| e["cat"] == "turn")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(turns.len() as u64, session["turns"].as_u64().unwrap());
        let chunks = track.iter().filter(|e| e["cat"] == "chunk").count();
        assert_eq!(chunks as u64, session["chunks"].as_u64().unwrap());
        let cancels = track.iter().filter(|e| e["cat"] == "cancel").count();
        assert_eq!(
            cancels,
            timeline.iter().filter(|to| **to == "cancelling").count(),
            "{session}"
        );
        let finalized: Vec<&&Value> = track
            .iter()
            .filter(|e| e["ph"] == "i" && e["cat"] == "state")
            .collect();
        assert_eq!(finalized.len(), 1);
        assert_eq!(
            finalized[0]["name"],
            format!("finalized: {}", session["end_reason"].as_str().unwrap())
        );
    }
}

#[test]
fn the_trace_of_a_teardown_is_a_chrome_trace_perfetto_opens() {
    let sandbox = Sandbox::new();
    let out = sandbox.run(&["run", "--json", example("scan").to_str().unwrap()]);
    assert_success(&out, "settle run examples/scan.toml");
    let sessions = sandbox.sessions();
    let root = id_of(by_name(&sessions, "root"));
    let trace = trace_of(&sandbox, root);
    let events = trace["traceEvents"].as_array().expect("traceEvents");

    // The fields every event needs in Perfetto's JSON importer.
    for event in events {
        let ph = event["ph"]
            .as_str()
            .unwrap_or_else(|| panic!("no ph: {event}"));
        assert!(["M", "X", "i"].contains(&ph), "{event}");
        assert!(event["name"].is_string(), "{event}");
        assert!(event["ts"].is_u64(), "{event}");
        assert!(event["pid"].is_u64() && event["tid"].is_u64(), "{event}");
        if ph == "X" {
            assert!(event["dur"].is_u64(), "{event}");
        }
        if ph == "i" {
            assert_eq!(event["s"], "t", "{event}");
        }
        assert_eq!(event["pid"], root, "one process: {event}");
    }

    // One track per session of the subtree, named by its path from the root,
    // sorted depth first.
    let names: BTreeMap<u64, &str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    let ids: BTreeSet<u64> = sessions.iter().map(id_of).collect();
    assert_eq!(names.keys().copied().collect::<BTreeSet<_>>(), ids);
    let id = |name: &str| id_of(by_name(&sessions, name));
    assert_eq!(names[&root], format!("root#{root}"));
    assert_eq!(
        names[&id("ports")],
        format!("root#{root}/recon#{}/ports#{}", id("recon"), id("ports"))
    );
    let mut sorted: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e["name"] == "thread_sort_index")
        .map(|e| {
            (
                e["args"]["sort_index"].as_u64().unwrap(),
                e["tid"].as_u64().unwrap(),
            )
        })
        .collect();
    sorted.sort_unstable();
    let order: Vec<&str> = sorted
        .iter()
        .map(|(_, tid)| names[tid].rsplit('/').next().unwrap())
        .map(|n| n.split('#').next().unwrap())
        .collect();
    assert_eq!(order, depth_first(&sessions, root), "children by id");

    assert_tracks(&sandbox, &sessions, events);

    // The subtree of recon: recon and ports, nothing else.
    let recon = trace_of(&sandbox, id("recon"));
    let tids: BTreeSet<u64> = recon["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert_eq!(tids, BTreeSet::from([id("recon"), id("ports")]));
}

#[test]
fn a_turn_cut_by_its_cancel_nests_in_both_states() {
    // The blocker ignores its cancel until it is detached 500 ms later: its
    // turn crosses from `running` into `cancelling`.
    let sandbox = Sandbox::new();
    let out = sandbox.run(&["run", "--json", example("stubborn").to_str().unwrap()]);
    assert_success(&out, "settle run examples/stubborn.toml");
    let sessions = sandbox.sessions();
    let root = id_of(by_name(&sessions, "root"));
    let trace = trace_of(&sandbox, root);
    let events = trace["traceEvents"].as_array().unwrap();
    assert_tracks(&sandbox, &sessions, events);
    let blocker = id_of(by_name(&sessions, "blocker"));
    let tracks = by_track(events);
    let pieces: Vec<&&Value> = tracks[&blocker]
        .iter()
        .filter(|e| e["cat"] == "turn")
        .collect();
    assert!(pieces.len() >= 2, "one piece per state crossed: {pieces:?}");
    assert!(pieces.iter().all(|p| p["args"]["outcome"] == "detached"));
    let cancelling = tracks[&blocker]
        .iter()
        .find(|e| e["name"] == "cancelling")
        .unwrap();
    assert!(
        pieces.iter().any(|p| p["ts"] == cancelling["ts"]),
        "a piece of the turn starts with the cancel: {pieces:?}"
    );
    assert!(
        cancelling["dur"].as_u64().unwrap() >= 400_000,
        "{cancelling}"
    );
}

#[test]
fn a_trace_to_stdout_is_the_json_alone() {
    let sandbox = talked();
    let out = stdout(&sandbox, &["show", "2", "--trace", "-"]);
    let trace: Value = serde_json::from_str(&out).expect("only the trace on stdout");
    assert!(trace["traceEvents"].as_array().unwrap().len() > 3);
    assert_eq!(trace["otherData"]["session"], 2);
}

/// What a model sends reaches a terminal as text, never as a control
/// sequence: `show` and the Markdown export escape every control character
/// (ESC, NUL, CR, BEL, …) of a reply, keeping its line breaks; the JSON
/// outputs keep the text exact, JSON-escaped.
#[test]
fn show_and_export_never_print_a_control_character_from_the_model() {
    let sandbox = Sandbox::new();
    let scenario = sandbox.write(
        "evil.toml",
        r#"
name = "evil"
[[agent]]
name = "root"
[[agent.turn]]
chunks = ["\u001b]0;pwned\u0007", "\u001b[2J\u0000over\rwrite", "\nnext line\u009b"]
"#,
    );
    let out = sandbox.run(&["run", "--json", scenario.to_str().unwrap()]);
    assert_success(&out, "settle run evil.toml");
    let text = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{0}over\rwrite\nnext line\u{9b}";
    let raw_controls = |printed: &str| -> Vec<char> {
        printed
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect()
    };
    for args in [
        &["show", "1"][..],
        &["export", "1"],
        &["export", "1", "--format", "md"],
    ] {
        let printed = stdout(&sandbox, args);
        assert_eq!(raw_controls(&printed), [], "{args:?} printed:\n{printed}");
        assert!(printed.contains("\\u{1b}]0;pwned"), "{args:?}: {printed}");
        assert!(printed.contains("next line"), "{args:?}: {printed}");
    }
    let shown: Value = serde_json::from_str(&stdout(&sandbox, &["show", "1", "--json"])).unwrap();
    assert_eq!(shown["turns"][0]["text"], text);
    let jsonl = stdout(&sandbox, &["export", "1", "--format", "jsonl"]);
    assert_eq!(raw_controls(&jsonl), [], "{jsonl}");
    let (_, turns, _) = replay(&jsonl);
    let replayed: String = turns[0]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(replayed, text);
}
