//! Scenario files for `settle run`: a scripted agent tree, read and checked
//! whole before anything runs.
//!
//! A scenario is TOML (see the project's specification, "Scenario files"):
//!
//! ```toml
//! name = "scan"
//! settle_timeout_ms = 1000        # optional
//! idle_timeout_ms = 30000         # optional
//!
//! [[agent]]
//! name = "root"                   # unique; exactly one agent has no parent
//! [[agent.turn]]
//! chunks = ["planning", "delegating recon"]
//! chunk_delay_ms = 20
//! # end = "complete"              # complete | fail | hang | self_cancel | ignore_cancel
//!
//! [[agent]]
//! name = "recon"
//! parent = "root"
//! spawn_after_ms = 5              # after the parent started
//! [[agent.turn]]
//! chunks = ["port 22 open", "port 80 open"]
//! chunk_delay_ms = 200
//!
//! [[agent]]
//! name = "probe"                  # probe-1 … probe-1000
//! parent = "recon"
//! count = 1000                    # optional: this entry is 1000 agents
//! [[agent.turn]]
//! chunks = ["probing"]
//! ```
//!
//! `count` (see `count.rs`) lets a file of a few lines describe a tree of a
//! hundred thousand agents, up to [`MAX_AGENTS`].
//!
//! [`Scenario::load`] and [`Scenario::parse`] either return a scenario that is
//! fully valid (one root, every parent known, no cycle, sane durations, at
//! least one turn per agent) or a [`ScenarioError`] whose `Display` is one
//! line naming the file, the agent, the turn and the key at fault (G11). They
//! never write anything.

mod count;
mod error;
mod locate;
mod raw;
mod validate;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

#[allow(unused_imports)] // part of the module's API, used by its tests
pub use error::{AgentRef, Location, Problem, ScenarioError};

/// The largest scenario file accepted, in bytes (1 MiB). A larger file is
/// refused before it is read whole.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The largest duration accepted for any `*_ms` key (24 h): anything longer
/// is a typo (seconds written as milliseconds twice over), not a scenario.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long an `ignore_cancel` turn ignores its cancellation when the turn
/// does not say (`ignore_ms`).
pub const DEFAULT_IGNORE: Duration = Duration::from_secs(60);

/// The most agents a scenario may describe, every `count` counted (the
/// scale of SPEC §9). A file of a few lines can ask for any number with
/// `count`; this is what keeps that number one a run can hold.
pub const MAX_AGENTS: usize = 1_000_000;

/// The most turns and chunks a scenario may describe, every `count`
/// counted (a turn is one, each of its chunks one more): what its agents
/// hold once they play. A file of a few lines with a `count` can describe
/// any number; this keeps it one a run can hold (at 1,000,000 agents, ten
/// each).
pub const MAX_SCRIPTED: usize = 10_000_000;

/// The longest agent or scenario name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// A scripted agent tree, validated: exactly one root, every parent names an
/// agent of the file, no cycle, unique non-empty names, every agent has at
/// least one turn, every duration within `0..=`[`MAX_DURATION`].
///
/// The fields are private so that these invariants hold for every value of
/// this type; read them through the accessors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// `name`.
    name: String,
    /// `settle_timeout_ms`.
    settle_timeout: Option<Duration>,
    /// `idle_timeout_ms`.
    idle_timeout: Option<Duration>,
    /// The agents, in file order.
    agents: Vec<AgentSpec>,
    /// Index in `agents` of the one agent without a parent.
    root: usize,
    /// For each agent (same index as `agents`), its children in file order.
    children: Vec<Vec<usize>>,
    /// Indexes in `agents`, parents before children.
    order: Vec<usize>,
    /// Name to index in `agents`.
    by_name: HashMap<String, usize>,
}

/// One agent of a scenario: a session driven by the scripted provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// Its name, unique in the scenario.
    pub name: String,
    /// The agent that spawns it; `None` for the root.
    pub parent: Option<String>,
    /// How long after its parent started it is spawned (zero for the root).
    pub spawn_after: Duration,
    /// Its turns, in order; never empty. The agent finishes after the last
    /// one, and its outcome is that turn's. The agents of one counted entry
    /// share them.
    pub turns: std::sync::Arc<[TurnSpec]>,
}

/// One turn of an agent: one scripted provider stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpec {
    /// The chunks the stream yields, in order (may be empty).
    pub chunks: Vec<String>,
    /// The pause before each chunk.
    pub chunk_delay: Duration,
    /// How the turn ends after its chunks.
    pub end: TurnEnd,
    /// How long closing the stream takes.
    pub close_delay: Duration,
    /// For [`TurnEnd::IgnoreCancel`]: how long the turn ignores its
    /// cancellation before it stops ([`DEFAULT_IGNORE`] unless the file says).
    pub ignore: Duration,
}

/// How a scripted turn ends once its chunks are out (`end` in the file):
/// the scripted provider's own vocabulary (`complete`, `fail`, `hang`,
/// `self_cancel`, `ignore_cancel`).
pub use settle_stream::ScriptedEnd as TurnEnd;

impl Scenario {
    /// Reads and validates the scenario file at `path`.
    ///
    /// Refuses, with one error line each: a path that cannot be opened or
    /// read, a directory, a file over [`MAX_FILE_BYTES`] (checked before
    /// reading it whole), a file that is not UTF-8, and everything
    /// [`Scenario::parse`] refuses. Nothing is written.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScenarioError> {
        let path = path.as_ref();
        let file = error::one_line(&path.display().to_string());
        let read_error = |io| ScenarioError::Read {
            file: file.clone(),
            io,
        };
        // Open first and ask the open handle, so the checks and the read see
        // the same file.
        let handle = File::open(path).map_err(read_error)?;
        let meta = handle.metadata().map_err(read_error)?;
        if meta.is_dir() {
            return Err(ScenarioError::Directory { file });
        }
        let known_size = meta.is_file().then_some(meta.len());
        if known_size.is_some_and(|size| size > MAX_FILE_BYTES) {
            return Err(ScenarioError::TooLarge {
                file,
                size: known_size,
                max: MAX_FILE_BYTES,
            });
        }
        // A pipe or a file that grew since `metadata` has no trustworthy
        // size: read one byte past the limit, never more.
        let mut bytes = Vec::new();
        handle
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if u64::try_from(bytes.len()).map_or(true, |len| len > MAX_FILE_BYTES) {
            return Err(ScenarioError::TooLarge {
                file,
                size: None,
                max: MAX_FILE_BYTES,
            });
        }
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(bad) => {
                let valid = bad.utf8_error().valid_up_to();
                let bytes = bad.as_bytes();
                let byte = bytes.get(valid).copied().unwrap_or_default();
                // The prefix is valid UTF-8 by definition of `valid_up_to`.
                let prefix = String::from_utf8_lossy(&bytes[..valid]);
                let mut at = Location::file(&file);
                at.line_col = Some(locate::line_col(&prefix, prefix.len()));
                return Err(ScenarioError::NotUtf8 {
                    at: Box::new(at),
                    byte,
                });
            }
        };
        Self::parse_as(&text, file)
    }

    /// Validates the scenario `text`; `origin` names it in errors (a path,
    /// or something like `<stdin>`).
    ///
    /// Refuses, with one error line each: text over [`MAX_FILE_BYTES`],
    /// invalid TOML, unknown keys, missing required keys, values of the wrong
    /// type, no agent, no root or a second root, an unknown parent, an agent
    /// that is its own parent, a cycle of parents, duplicate names, empty
    /// names or names with control characters, negative durations or ones
    /// over [`MAX_DURATION`], `idle_timeout_ms = 0`, an unknown turn `end`, an
    /// agent with no turn, `spawn_after_ms` on the root, `ignore_ms` on a
    /// turn that does not end with `ignore_cancel`, a `count` below 1 or on
    /// the root, more than [`MAX_AGENTS`] agents in all, a `parent` that names
    /// a counted entry rather than one of its agents, and a name a `count`
    /// gives that another agent has.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        Self::parse_as(text, error::one_line(origin))
    }

    /// [`Scenario::parse`] with the origin already made one line.
    fn parse_as(text: &str, file: String) -> Result<Self, ScenarioError> {
        if u64::try_from(text.len()).map_or(true, |len| len > MAX_FILE_BYTES) {
            return Err(ScenarioError::TooLarge {
                file,
                size: u64::try_from(text.len()).ok(),
                max: MAX_FILE_BYTES,
            });
        }
        // Editors on some systems start UTF-8 files with a byte order mark;
        // it is not TOML, and not worth refusing a file for.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        match toml::from_str::<raw::RawScenario>(text) {
            Ok(raw) => validate::validate(raw, text, &file),
            Err(error) => Err(validate::from_toml_error(&error, text, &file)),
        }
    }

    /// The scenario's `name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `settle_timeout_ms`, if the file sets it.
    pub fn settle_timeout(&self) -> Option<Duration> {
        self.settle_timeout
    }

    /// `idle_timeout_ms`, if the file sets it.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// Every agent, in file order.
    pub fn agents(&self) -> &[AgentSpec] {
        &self.agents
    }

    /// The one agent without a parent.
    pub fn root(&self) -> &AgentSpec {
        &self.agents[self.root]
    }

    /// The agent called `name`, if there is one.
    pub fn agent(&self, name: &str) -> Option<&AgentSpec> {
        self.by_name.get(name).map(|&index| &self.agents[index])
    }

    /// The children of the agent called `name`, in file order (none if there
    /// is no such agent).
    pub fn children(&self, name: &str) -> impl Iterator<Item = &AgentSpec> + '_ {
        self.by_name
            .get(name)
            .map(|&index| self.children[index].as_slice())
            .unwrap_or_default()
            .iter()
            .map(|&child| &self.agents[child])
    }

    /// Every agent, parents before children: the root, then each level of
    /// the tree in turn, each agent's children in file order.
    pub fn topological_order(&self) -> impl Iterator<Item = &AgentSpec> + '_ {
        self.order.iter().map(|&index| &self.agents[index])
    }
}
