//! Scenario files: what is refused (G11) and with which line, what parses to
//! what, and the shipped examples.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

/// A valid scenario the bad cases below are variations of.
const GOOD: &str = r#"
name = "scan"
settle_timeout_ms = 1000
idle_timeout_ms = 30000

[[agent]]
name = "root"
[[agent.turn]]
chunks = ["planning", "delegating recon"]
chunk_delay_ms = 20

[[agent]]
name = "recon"
parent = "root"
spawn_after_ms = 5
[[agent.turn]]
chunks = ["port 22 open", "port 80 open", "port 443 open"]
chunk_delay_ms = 200
[[agent.turn]]
chunks = []
end = "ignore_cancel"
ignore_ms = 500
close_delay_ms = 30
"#;

/// One agent with one empty turn, as TOML, for building cases.
fn agent(name: &str, parent: Option<&str>) -> String {
    let parent = parent.map_or(String::new(), |p| format!("parent = \"{p}\"\n"));
    format!("[[agent]]\nname = \"{name}\"\n{parent}[[agent.turn]]\n")
}

/// `name = "t"` followed by `body`.
fn doc(body: &str) -> String {
    format!("name = \"t\"\n{body}")
}

/// A two-agent document whose child's turn has `turn_body` (after `chunks`).
fn with_child_turn(turn_body: &str) -> String {
    doc(&format!(
        "{}[[agent]]\nname = \"recon\"\nparent = \"root\"\n[[agent.turn]]\nchunks = [\"a\"]\n{turn_body}\n",
        agent("root", None)
    ))
}

/// A two-agent document whose child has `agent_body` before its turn.
fn with_child(agent_body: &str) -> String {
    doc(&format!(
        "{}[[agent]]\nname = \"recon\"\nparent = \"root\"\n{agent_body}\n[[agent.turn]]\n",
        agent("root", None)
    ))
}

/// The error line for `text`, which must be refused; checks it is one line.
fn refused(text: &str) -> String {
    match Scenario::parse(text, "bad.toml") {
        Ok(scenario) => panic!("accepted:\n{text}\nas {scenario:?}"),
        Err(error) => {
            let line = error.to_string();
            assert_eq!(line.lines().count(), 1, "not one line: {line:?}");
            assert!(!line.contains('\n'), "not one line: {line:?}");
            line
        }
    }
}

#[test]
fn g11_bad_scenarios_are_refused_with_one_line_naming_file_agent_and_key() {
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "invalid TOML",
            doc("[[agent]\nname = \"root\"\n"),
            vec!["bad.toml:2:", "invalid TOML"],
        ),
        (
            "unterminated string",
            doc("[[agent]]\nname = \"root\n"),
            vec!["bad.toml:3:", "invalid TOML"],
        ),
        (
            "duplicate key",
            doc("[[agent]]\nname = \"root\"\nname = \"again\"\n[[agent.turn]]\n"),
            vec!["bad.toml:4:", "invalid TOML", "duplicate key"],
        ),
        (
            "integer out of range",
            with_child_turn("chunk_delay_ms = 99999999999999999999"),
            vec!["bad.toml:10:18", "invalid TOML"],
        ),
        (
            "unknown top-level key",
            format!("nmae = \"x\"\n{}", doc(&agent("root", None))),
            vec!["bad.toml:1:1", "key \"nmae\"", "unknown key", "`name`"],
        ),
        (
            "unknown agent key",
            with_child("parnet = \"root\""),
            vec!["agent \"recon\"", "key \"parnet\"", "unknown key"],
        ),
        (
            "unknown turn key",
            with_child_turn("chunkz = 3"),
            vec![
                "bad.toml:10:1",
                "agent \"recon\": turn 1: key \"chunkz\"",
                "`chunks`",
            ],
        ),
        (
            "unknown key in a later turn",
            doc(&format!(
                "{}[[agent.turn]]\nchunk_dleay_ms = 3\n",
                agent("root", None)
            )),
            vec!["agent \"root\": turn 2: key \"chunk_dleay_ms\""],
        ),
        (
            "missing scenario name",
            agent("root", None),
            vec!["bad.toml: key \"name\": this required key is missing"],
        ),
        (
            "missing agent name",
            doc(&format!(
                "{}[[agent]]\nparent = \"root\"\n[[agent.turn]]\n",
                agent("root", None)
            )),
            vec!["bad.toml:5:1", "agent #2", "key \"name\"", "missing"],
        ),
        (
            "duration as a string",
            with_child_turn("chunk_delay_ms = \"20\""),
            vec![
                "bad.toml:10:",
                "agent \"recon\": turn 1: key \"chunk_delay_ms\"",
            ],
        ),
        (
            "duration as a float",
            with_child("spawn_after_ms = 1.5"),
            vec!["agent \"recon\": key \"spawn_after_ms\"", "wrong value"],
        ),
        (
            "duration as a boolean",
            format!("settle_timeout_ms = true\n{}", doc(&agent("root", None))),
            vec!["bad.toml:1:", "key \"settle_timeout_ms\""],
        ),
        (
            "a chunk that is not a string",
            doc("[[agent]]
name = \"root\"
[[agent.turn]]
chunks = [\"a\", 3]
"),
            vec!["agent \"root\": turn 1: key \"chunks\""],
        ),
        (
            "agent as a table",
            doc("[agent]\nname = \"root\"\n"),
            vec!["key \"agent\""],
        ),
        (
            "turn as a string",
            doc("[[agent]]\nname = \"root\"\nturn = \"fast\"\n"),
            vec!["agent \"root\": key \"turn\""],
        ),
        (
            "no agent",
            doc(""),
            vec!["bad.toml", "key \"agent\"", "no [[agent]]"],
        ),
        (
            "empty agent array",
            doc("agent = []\n"),
            vec!["bad.toml", "no [[agent]]"],
        ),
        (
            "no root",
            doc(&format!(
                "{}{}",
                agent("a", Some("b")),
                agent("b", Some("a"))
            )),
            vec!["bad.toml:4:", "agent \"a\": key \"parent\"", "no root"],
        ),
        (
            "a second root",
            doc(&format!(
                "{}{}{}",
                agent("root", None),
                agent("recon", Some("root")),
                agent("web", None)
            )),
            vec![
                "bad.toml:10:8",
                "agent \"web\": key \"parent\"",
                "second root",
                "\"root\"",
            ],
        ),
        (
            "unknown parent",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("recon", Some("rcon"))
            )),
            vec!["bad.toml:7:10: agent \"recon\": key \"parent\": no agent named \"rcon\""],
        ),
        (
            "own parent",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("recon", Some("recon"))
            )),
            vec!["agent \"recon\": key \"parent\"", "own parent"],
        ),
        (
            "cycle",
            doc(&format!(
                "{}{}{}{}",
                agent("root", None),
                agent("leaf", Some("a")),
                agent("a", Some("b")),
                agent("b", Some("a"))
            )),
            vec![
                "agent \"a\": key \"parent\"",
                "cycle: \"a\" -> \"b\" -> \"a\"",
            ],
        ),
        (
            "duplicate names",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("root", Some("root"))
            )),
            vec![
                "bad.toml:6:",
                "agent \"root\": key \"name\"",
                "duplicate",
                "line 3",
            ],
        ),
        (
            "empty agent name",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("", Some("root"))
            )),
            vec!["agent #2: key \"name\"", "empty"],
        ),
        (
            "blank agent name",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("   ", Some("root"))
            )),
            vec!["agent #2: key \"name\"", "empty"],
        ),
        (
            "a newline in a name",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent("a\\nb", Some("root"))
            )),
            vec!["agent #2: key \"name\"", "control character"],
        ),
        (
            "a name too long",
            doc(&format!(
                "{}{}",
                agent("root", None),
                agent(&"x".repeat(200), Some("root"))
            )),
            vec!["agent #2: key \"name\"", "128"],
        ),
        (
            "empty scenario name",
            format!("name = \"\"\n{}", agent("root", None)),
            vec!["bad.toml:1:8: key \"name\"", "empty"],
        ),
        (
            "negative spawn_after_ms",
            with_child("spawn_after_ms = -5"),
            vec!["agent \"recon\": key \"spawn_after_ms\"", "negative", "-5"],
        ),
        (
            "negative settle_timeout_ms",
            doc(&format!("settle_timeout_ms = -1\n{}", agent("root", None))),
            vec!["bad.toml:2:21: key \"settle_timeout_ms\"", "negative"],
        ),
        (
            "negative close_delay_ms",
            with_child_turn("close_delay_ms = -1"),
            vec![
                "agent \"recon\": turn 1: key \"close_delay_ms\"",
                "negative",
            ],
        ),
        (
            "absurd chunk_delay_ms",
            with_child_turn("chunk_delay_ms = 100000000"),
            vec![
                "agent \"recon\": turn 1: key \"chunk_delay_ms\"",
                "cap of 86400000 ms (24 h)",
            ],
        ),
        (
            "absurd ignore_ms",
            with_child_turn("end = \"ignore_cancel\"\nignore_ms = 9223372036854775807"),
            vec!["agent \"recon\": turn 1: key \"ignore_ms\"", "cap"],
        ),
        (
            "absurd idle_timeout_ms",
            doc(&format!(
                "idle_timeout_ms = 86400001\n{}",
                agent("root", None)
            )),
            vec!["key \"idle_timeout_ms\"", "cap"],
        ),
        (
            "zero idle_timeout_ms",
            doc(&format!("idle_timeout_ms = 0\n{}", agent("root", None))),
            vec!["key \"idle_timeout_ms\"", "0 ms"],
        ),
        (
            "unknown turn end",
            with_child_turn("end = \"explode\""),
            vec![
                "bad.toml:10:7: agent \"recon\": turn 1: key \"end\"",
                "\"explode\"",
                "complete, fail, hang, self_cancel, ignore_cancel",
            ],
        ),
        (
            "unknown turn end in an inline table",
            doc("agent = [{ name = \"r\", turn = [{ end = \"boom\" }] }]\n"),
            vec!["agent \"r\": turn 1: key \"end\"", "ignore_cancel"],
        ),
        (
            "an agent with no turn",
            doc(&format!(
                "{}[[agent]]\nname = \"recon\"\nparent = \"root\"\n",
                agent("root", None)
            )),
            vec![
                "bad.toml:5:1: agent \"recon\": key \"turn\"",
                "no [[agent.turn]]",
            ],
        ),
        (
            "spawn_after_ms on the root",
            doc("[[agent]]\nname = \"root\"\nspawn_after_ms = 5\n[[agent.turn]]\n"),
            vec!["agent \"root\": key \"spawn_after_ms\"", "root"],
        ),
        (
            "ignore_ms without ignore_cancel",
            with_child_turn("end = \"hang\"\nignore_ms = 10"),
            vec!["agent \"recon\": turn 1: key \"ignore_ms\"", "\"hang\""],
        ),
        (
            "count of zero",
            with_child("count = 0"),
            vec![
                "bad.toml:8:9: agent \"recon\": key \"count\"",
                "at least 1 (found 0)",
            ],
        ),
        (
            "negative count",
            with_child("count = -3"),
            vec!["agent \"recon\": key \"count\"", "found -3"],
        ),
        (
            "count as a string",
            with_child("count = \"3\""),
            vec!["agent \"recon\": key \"count\"", "wrong value"],
        ),
        (
            "count on the root",
            doc("[[agent]]\nname = \"root\"\ncount = 2\n[[agent.turn]]\n"),
            vec!["agent \"root\": key \"count\"", "the root is one agent"],
        ),
        (
            "count over the cap",
            with_child("count = 1000001"),
            vec![
                "agent \"recon\": key \"count\"",
                "more than the 1000000 agents",
            ],
        ),
        (
            "counts that add up over the cap",
            doc(&format!(
                "{}[[agent]]\nname = \"a\"\nparent = \"root\"\ncount = 600000\n[[agent.turn]]\n\
                 [[agent]]\nname = \"b\"\nparent = \"root\"\ncount = 400000\n[[agent.turn]]\n",
                agent("root", None)
            )),
            vec!["agent \"b\": key \"count\"", "more than the 1000000 agents"],
        ),
        (
            "counted turns whose chunks add up over the cap",
            with_child(&format!(
                "count = 1000\n[[agent.turn]]\nchunks = [{}]",
                "\"\",".repeat(20_000)
            )),
            vec![
                "agent \"recon\": key \"count\"",
                "more than the 10000000 turns and chunks",
            ],
        ),
        (
            "counted entries whose turns add up over the cap",
            doc(&format!(
                "{}[[agent]]\nname = \"a\"\nparent = \"root\"\ncount = 500000\n{}\
                 [[agent]]\nname = \"b\"\nparent = \"root\"\ncount = 400000\n{}",
                agent("root", None),
                "[[agent.turn]]\nchunks = [\"x\", \"y\"]\n".repeat(5),
                "[[agent.turn]]\n".repeat(7),
            )),
            vec![
                "agent \"b\": key \"count\"",
                "more than the 10000000 turns and chunks",
            ],
        ),
        (
            "a parent that names a counted entry",
            doc(&format!(
                "{}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 3\n[[agent.turn]]\n{}",
                agent("root", None),
                agent("kid", Some("w"))
            )),
            vec![
                "agent \"kid\": key \"parent\"",
                "\"w\" has count = 3",
                "\"w-1\" to \"w-3\"",
            ],
        ),
        (
            "a counted name already taken",
            doc(&format!(
                "{}{}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 3\n[[agent.turn]]\n",
                agent("root", None),
                agent("w-2", Some("root"))
            )),
            vec![
                "agent \"w\": key \"count\"",
                "\"w-2\" is taken by the agent at line 6",
            ],
        ),
        (
            "an agent named like a counted entry",
            doc(&format!(
                "{}[[agent]]\nname = \"w\"\nparent = \"root\"\ncount = 3\n[[agent.turn]]\n{}",
                agent("root", None),
                agent("w", Some("root"))
            )),
            vec!["agent \"w\": key \"name\"", "duplicate name", "line 6"],
        ),
        (
            "a counted name too long",
            doc(&format!(
                "{}[[agent]]\nname = \"{}\"\nparent = \"root\"\ncount = 10\n[[agent.turn]]\n",
                agent("root", None),
                "n".repeat(126)
            )),
            vec!["key \"count\"", "longer than 128 characters"],
        ),
    ];
    assert!(cases.len() >= 25);
    let mut failures = Vec::new();
    for (what, text, expected) in &cases {
        let line = refused(text);
        println!("{what}: {line}");
        if !line.starts_with("bad.toml") {
            failures.push(format!("{what}: {line:?} does not start with the file"));
        }
        for part in expected {
            if !line.contains(part) {
                failures.push(format!("{what}: {line:?} lacks {part:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn g11_errors_are_typed() {
    let error = Scenario::parse(
        &doc(&format!(
            "{}{}",
            agent("root", None),
            agent("recon", Some("rcon"))
        )),
        "x.toml",
    )
    .unwrap_err();
    assert_eq!(
        error.problem(),
        Some(&Problem::UnknownParent {
            parent: "rcon".into()
        })
    );
    let at = error.location().unwrap();
    assert_eq!(at.agent, Some(AgentRef::Named("recon".into())));
    assert_eq!(at.key.as_deref(), Some("parent"));
    assert_eq!(at.line_col, Some((7, 10)));
}

#[test]
fn g11_the_origin_name_cannot_split_the_line() {
    let line = Scenario::parse("name = ", "evil\nname.toml")
        .unwrap_err()
        .to_string();
    assert_eq!(line.lines().count(), 1, "{line:?}");
    assert!(line.starts_with("evil\\nname.toml:1:"), "{line:?}");
}

#[test]
fn g11_text_over_the_limit_is_refused() {
    let text = format!("name = \"big\"\n#{}\n", "x".repeat(1024 * 1024));
    let line = refused(&text);
    assert!(line.contains("larger than the 1048576 bytes"), "{line}");
}

#[test]
fn the_spec_example_parses_to_its_structure() {
    let scenario = Scenario::parse(GOOD, "good.toml").unwrap();
    assert_eq!(scenario.name(), "scan");
    assert_eq!(scenario.settle_timeout(), Some(Duration::from_secs(1)));
    assert_eq!(scenario.idle_timeout(), Some(Duration::from_secs(30)));
    assert_eq!(
        scenario.agents(),
        &[
            AgentSpec {
                name: "root".into(),
                parent: None,
                spawn_after: Duration::ZERO,
                turns: [TurnSpec {
                    chunks: vec!["planning".into(), "delegating recon".into()],
                    chunk_delay: Duration::from_millis(20),
                    end: TurnEnd::Complete,
                    close_delay: Duration::ZERO,
                    ignore: DEFAULT_IGNORE,
                }]
                .into(),
            },
            AgentSpec {
                name: "recon".into(),
                parent: Some("root".into()),
                spawn_after: Duration::from_millis(5),
                turns: [
                    TurnSpec {
                        chunks: vec![
                            "port 22 open".into(),
                            "port 80 open".into(),
                            "port 443 open".into()
                        ],
                        chunk_delay: Duration::from_millis(200),
                        end: TurnEnd::Complete,
                        close_delay: Duration::ZERO,
                        ignore: DEFAULT_IGNORE,
                    },
                    TurnSpec {
                        chunks: vec![],
                        chunk_delay: Duration::ZERO,
                        end: TurnEnd::IgnoreCancel,
                        close_delay: Duration::from_millis(30),
                        ignore: Duration::from_millis(500),
                    },
                ]
                .into(),
            },
        ]
    );
    assert_eq!(scenario.root().name, "root");
}

#[test]
fn defaults_apply_and_every_end_is_accepted() {
    let mut text = doc("[[agent]]\nname = \"root\"\n");
    for end in TurnEnd::ALL {
        text.push_str(&format!("[[agent.turn]]\nend = \"{end}\"\n"));
    }
    text.push_str("[[agent.turn]]\n");
    let scenario = Scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(scenario.settle_timeout(), None);
    assert_eq!(scenario.idle_timeout(), None);
    let turns = &scenario.root().turns;
    let ends: Vec<TurnEnd> = turns.iter().map(|turn| turn.end).collect();
    let mut expected = TurnEnd::ALL.to_vec();
    expected.push(TurnEnd::Complete);
    assert_eq!(ends, expected);
    for turn in turns.iter() {
        assert!(turn.chunks.is_empty());
        assert_eq!(turn.chunk_delay, Duration::ZERO);
        assert_eq!(turn.close_delay, Duration::ZERO);
        assert_eq!(turn.ignore, Duration::from_secs(60));
    }
}

#[test]
fn edge_values_are_accepted() {
    let text = format!(
        "\u{feff}name = \"édge ✓\"\nsettle_timeout_ms = 0\nidle_timeout_ms = 86400000\n{}",
        agent("racine ✓", None)
    );
    let scenario = Scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(scenario.name(), "édge ✓");
    assert_eq!(scenario.settle_timeout(), Some(Duration::ZERO));
    assert_eq!(scenario.idle_timeout(), Some(MAX_DURATION));
    assert_eq!(scenario.root().name, "racine ✓");
}

#[test]
fn tree_helpers_follow_parents_and_file_order() {
    // Children listed before their parents, and siblings interleaved.
    let text = doc(&format!(
        "{}{}{}{}{}",
        agent("grandchild", Some("b")),
        agent("b", Some("root")),
        agent("root", None),
        agent("a", Some("root")),
        agent("b2", Some("b")),
    ));
    let scenario = Scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(scenario.root().name, "root");
    let names = |agents: Vec<&AgentSpec>| -> Vec<String> {
        agents.into_iter().map(|agent| agent.name.clone()).collect()
    };
    assert_eq!(names(scenario.children("root").collect()), ["b", "a"]);
    assert_eq!(
        names(scenario.children("b").collect()),
        ["grandchild", "b2"]
    );
    assert!(scenario.children("a").next().is_none());
    assert!(scenario.children("nobody").next().is_none());
    let order = names(scenario.topological_order().collect());
    assert_eq!(order, ["root", "b", "a", "grandchild", "b2"]);
    for (position, name) in order.iter().enumerate() {
        if let Some(parent) = &scenario.agent(name).unwrap().parent {
            let parent_position = order.iter().position(|n| n == parent).unwrap();
            assert!(parent_position < position, "{parent} after {name}");
        }
    }
    assert_eq!(scenario.agent("a").unwrap().parent.as_deref(), Some("root"));
    assert!(scenario.agent("c").is_none());
}

#[test]
fn a_count_describes_a_hundred_thousand_agents_in_a_few_lines() {
    let text = doc(&format!(
        "{}[[agent]]\nname = \"worker\"\nparent = \"root\"\nspawn_after_ms = 5\ncount = 100000\n\
         [[agent.turn]]\nchunks = [\"a\", \"b\"]\nend = \"hang\"\n",
        agent("root", None)
    ));
    assert!(text.len() < 200, "{} bytes", text.len());
    let scenario = Scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(scenario.agents().len(), 100_001);
    assert_eq!(scenario.children("root").count(), 100_000);
    let first = scenario.agent("worker-1").unwrap();
    let last = scenario.agent("worker-100000").unwrap();
    for worker in [first, last] {
        assert_eq!(worker.parent.as_deref(), Some("root"));
        assert_eq!(worker.spawn_after, Duration::from_millis(5));
        assert_eq!(worker.turns.len(), 1);
        assert_eq!(worker.turns[0].chunks, ["a", "b"]);
        assert_eq!(worker.turns[0].end, TurnEnd::Hang);
    }
    // The base name names no agent, and the copies come in order.
    assert!(scenario.agent("worker").is_none());
    assert!(scenario.agent("worker-0").is_none());
    assert!(scenario.agent("worker-100001").is_none());
    let order: Vec<&str> = scenario
        .topological_order()
        .take(3)
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(order, ["root", "worker-1", "worker-2"]);
}

#[test]
fn counted_agents_can_be_parents_and_count_one_is_one_numbered_agent() {
    let text = doc(&format!(
        "{}[[agent]]\nname = \"lead\"\nparent = \"root\"\ncount = 3\n[[agent.turn]]\n\
         [[agent]]\nname = \"w\"\nparent = \"lead-2\"\ncount = 4\n[[agent.turn]]\n\
         [[agent]]\nname = \"solo\"\nparent = \"w-4\"\ncount = 1\n[[agent.turn]]\n",
        agent("root", None)
    ));
    let scenario = Scenario::parse(&text, "t.toml").unwrap();
    assert_eq!(scenario.agents().len(), 1 + 3 + 4 + 1);
    let names = |parent: &str| -> Vec<String> {
        scenario.children(parent).map(|a| a.name.clone()).collect()
    };
    assert_eq!(names("root"), ["lead-1", "lead-2", "lead-3"]);
    assert_eq!(names("lead-2"), ["w-1", "w-2", "w-3", "w-4"]);
    assert!(names("lead-1").is_empty());
    assert_eq!(names("w-4"), ["solo-1"]);
    assert!(scenario.agent("solo").is_none());
}

#[test]
fn g11_a_cycle_through_counted_agents_names_the_copies() {
    let text = doc(&format!(
        "{}[[agent]]\nname = \"a\"\nparent = \"b-1\"\ncount = 2\n[[agent.turn]]\n\
         [[agent]]\nname = \"b\"\nparent = \"a-2\"\ncount = 2\n[[agent.turn]]\n",
        agent("root", None)
    ));
    let line = refused(&text);
    assert!(line.contains("cycle"), "{line}");
    assert!(line.contains("\"a-2\" -> \"b-1\" -> \"a-2\""), "{line}");
    assert!(line.contains("\"b-1\""), "{line}");
    let own = doc(&format!(
        "{}[[agent]]\nname = \"a\"\nparent = \"a-1\"\ncount = 2\n[[agent.turn]]\n",
        agent("root", None)
    ));
    let line = refused(&own);
    assert!(line.contains("own parent"), "{line}");
}

/// The repository's `examples/` folder.
fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

#[test]
fn every_example_loads() {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(examples_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "toml") {
            if let Err(error) = Scenario::load(&path) {
                panic!("{error}");
            }
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for name in ["scan.toml", "stall.toml", "stubborn.toml"] {
        assert!(seen.iter().any(|seen| seen == name), "{name} missing");
    }
}

#[test]
fn examples_show_what_they_say() {
    let load = |name: &str| Scenario::load(examples_dir().join(name)).unwrap();

    // scan: the root ends long before its children's multi-chunk turns do.
    let scan = load("scan.toml");
    let root_time: Duration = busy_time(scan.root());
    let slow = scan
        .agents()
        .iter()
        .filter(|agent| agent.parent.is_some() && busy_time(agent) > root_time * 3)
        .count();
    assert!(slow >= 2, "scan.toml: children are not slow enough");
    assert!(
        scan.agents().iter().any(|agent| agent
            .parent
            .as_ref()
            .is_some_and(|p| p != &scan.root().name)),
        "scan.toml: no grandchild"
    );

    // stall: a hanging turn and an idle timeout shorter than every pause.
    let stall = load("stall.toml");
    let idle = stall.idle_timeout().unwrap();
    let turns = || stall.agents().iter().flat_map(|agent| agent.turns.iter());
    assert!(turns().any(|turn| turn.end == TurnEnd::Hang));
    assert!(turns().all(|turn| turn.chunk_delay * 2 <= idle));

    // stubborn: ignores cancellation far longer than the settle timeout.
    let stubborn = load("stubborn.toml");
    let settle = stubborn.settle_timeout().unwrap();
    assert!(turns_of(&stubborn)
        .any(|turn| turn.end == TurnEnd::IgnoreCancel && turn.ignore > settle * 10));

    // failing: the root's last turn fails.
    let failing = load("failing.toml");
    assert_eq!(
        failing.root().turns.last().map(|turn| turn.end),
        Some(TurnEnd::Fail)
    );
}

/// Every turn of every agent of `scenario`.
fn turns_of(scenario: &Scenario) -> impl Iterator<Item = &TurnSpec> {
    scenario
        .agents()
        .iter()
        .flat_map(|agent| agent.turns.iter())
}

/// How long an agent's turns stream, pauses included, if not cancelled.
fn busy_time(agent: &AgentSpec) -> Duration {
    agent
        .turns
        .iter()
        .map(|turn| turn.chunk_delay * u32::try_from(turn.chunks.len()).unwrap())
        .sum()
}

/// The error line from loading `path`.
fn load_error(path: &Path) -> String {
    let line = Scenario::load(path).unwrap_err().to_string();
    assert_eq!(line.lines().count(), 1, "{line:?}");
    assert!(line.starts_with(&path.display().to_string()), "{line}");
    line
}

#[test]
fn g11_unreadable_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("missing.toml");
    assert!(load_error(&missing).contains("cannot read"));

    assert!(load_error(dir.path()).contains("it is a directory"));

    let looped = dir.path().join("loop.toml");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    assert!(load_error(&looped).contains("cannot read"));

    let not_utf8 = dir.path().join("latin1.toml");
    std::fs::write(&not_utf8, b"name = \"ok\"\n# caf\xe9\n").unwrap();
    let line = load_error(&not_utf8);
    assert!(line.contains("latin1.toml:2:6"), "{line}");
    assert!(line.contains("not valid UTF-8 (byte 0xe9)"), "{line}");

    // Sparse: refused from its size alone, without reading 2 GiB.
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(2 * 1024 * 1024 * 1024)
        .unwrap();
    let line = load_error(&huge);
    assert!(
        line.contains("larger than the 1048576 bytes allowed (2147483648 bytes)"),
        "{line}"
    );
}

#[test]
fn g11_a_file_without_read_permission_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked.toml");
    std::fs::write(&locked, GOOD).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // A privileged user reads it anyway; only check the refusal where the
    // system refuses.
    if std::fs::read(&locked).is_err() {
        assert!(load_error(&locked).contains("cannot read"));
    }
}

#[test]
fn load_reports_parse_errors_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        doc(&format!(
            "{}{}",
            agent("root", None),
            agent("recon", Some("rcon"))
        )),
    )
    .unwrap();
    let line = load_error(&path);
    assert!(
        line.ends_with("bad.toml:7:10: agent \"recon\": key \"parent\": no agent named \"rcon\""),
        "{line}"
    );
}

#[test]
fn g11_deep_nesting_is_refused_without_overflowing_the_stack() {
    for depth in [50, 100_000] {
        let text = format!(
            "name = \"t\"\nextra = {}{}\n{}",
            "[".repeat(depth),
            "]".repeat(depth),
            agent("root", None)
        );
        let line = refused(&text);
        assert!(line.starts_with("bad.toml:2:"), "{line}");
    }
}

#[test]
fn g11_a_missing_name_in_an_inline_agent_is_located() {
    let line = refused(&doc("agent = [{ turn = [{}] }]\n"));
    assert!(line.contains("agent #1: key \"name\""), "{line}");
}
