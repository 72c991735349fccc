//! Why a scenario file was refused, and where.
//!
//! Every error displays as exactly one line (G11): the file, then as much of
//! the position as is known (`line:column`, agent, turn, key), then what is
//! wrong. Text that comes from the file (names, keys, values) is quoted and
//! escaped, so a name with a newline in it cannot split the line.

use std::fmt;
use std::io;
use std::time::Duration;

use super::TurnEnd;

/// A scenario file that cannot be run, and why.
///
/// `Display` is a single line that names the file and, where it applies, the
/// line and column, the agent, the turn and the key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be opened or read: missing, permission denied, a
    /// symlink loop, an I/O error.
    #[error("{file}: cannot read the scenario file: {io}")]
    Read {
        /// The file, as given.
        file: String,
        /// What the operating system said.
        io: io::Error,
    },
    /// The path names a directory, not a scenario file.
    #[error("{file}: cannot read the scenario file: it is a directory")]
    Directory {
        /// The file, as given.
        file: String,
    },
    /// The file is larger than [`MAX_FILE_BYTES`](super::MAX_FILE_BYTES); it
    /// was refused without being read whole.
    #[error(
        "{file}: the scenario file is larger than the {max} bytes allowed{}",
        size.map_or_else(String::new, |size| format!(" ({size} bytes)"))
    )]
    TooLarge {
        /// The file, as given.
        file: String,
        /// Its size, when the file system reported one.
        size: Option<u64>,
        /// The limit.
        max: u64,
    },
    /// The file is not UTF-8 text (TOML must be).
    #[error("{at}: the scenario file is not valid UTF-8 (byte 0x{byte:02x})")]
    NotUtf8 {
        /// Where the first invalid byte is.
        at: Box<Location>,
        /// The first invalid byte.
        byte: u8,
    },
    /// The file is not valid TOML.
    #[error("{at}: invalid TOML: {message}")]
    Syntax {
        /// Where the parser stopped.
        at: Box<Location>,
        /// The parser's message, on one line.
        message: String,
    },
    /// The file is valid TOML but not a valid scenario.
    #[error("{at}: {problem}")]
    Invalid {
        /// The agent, turn and key at fault.
        at: Box<Location>,
        /// What is wrong there.
        problem: Problem,
    },
}

impl ScenarioError {
    /// The position of the error in the file, when it is about the content.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::NotUtf8 { at, .. } | Self::Syntax { at, .. } | Self::Invalid { at, .. } => {
                Some(&**at)
            }
            Self::Read { .. } | Self::Directory { .. } | Self::TooLarge { .. } => None,
        }
    }

    /// What is wrong, when the file is TOML but not a valid scenario.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Invalid { problem, .. } => Some(problem),
            _ => None,
        }
    }
}

/// What is wrong with a scenario that is valid TOML.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A key this table does not accept (a typo, or a key at the wrong level).
    UnknownKey {
        /// The keys this table accepts, as the deserializer lists them.
        allowed: String,
    },
    /// A required key is absent.
    MissingKey,
    /// A value of the wrong type, or out of the range of its type.
    WrongValue {
        /// What the deserializer expected, on one line.
        message: String,
    },
    /// A turn `end` that is not one of [`TurnEnd::ALL`].
    UnknownTurnEnd {
        /// The value found.
        value: String,
    },
    /// The file has no `[[agent]]`.
    NoAgent,
    /// Every agent has a parent, so none can start the run.
    NoRoot,
    /// A second agent without a `parent`.
    SecondRoot {
        /// The first agent without a parent.
        first: String,
    },
    /// A `parent` that names no agent in the file.
    UnknownParent {
        /// The name given.
        parent: String,
    },
    /// An agent whose `parent` is itself.
    OwnParent,
    /// The parents form a cycle, cut off from the root.
    Cycle {
        /// The agents of the cycle, each followed by its parent, back to the
        /// first.
        path: Vec<String>,
    },
    /// A name used by an earlier agent.
    DuplicateName {
        /// The line of the earlier agent's name.
        first_line: usize,
    },
    /// An empty (or blank) name.
    EmptyName,
    /// A name with control characters in it, or too long to show.
    BadName {
        /// Why.
        reason: &'static str,
    },
    /// A negative duration.
    NegativeDuration {
        /// The value found, in milliseconds.
        value: i64,
    },
    /// A duration above [`MAX_DURATION`](super::MAX_DURATION).
    DurationTooLong {
        /// The value found, in milliseconds.
        value: i64,
        /// The cap.
        cap: Duration,
    },
    /// `idle_timeout_ms = 0`: it would time out every turn at once.
    ZeroIdleTimeout,
    /// An agent with no `[[agent.turn]]`.
    NoTurns,
    /// `spawn_after_ms` on the root, which has no parent to start after.
    RootSpawnAfter,
    /// `ignore_ms` on a turn whose `end` is not `ignore_cancel`.
    IgnoreWithoutIgnoreCancel {
        /// The turn's `end`.
        end: TurnEnd,
    },
    /// A `count` below 1.
    BadCount {
        /// The value found.
        value: i64,
    },
    /// `count` on the root, which is one agent.
    RootCount,
    /// The file describes more agents than [`MAX_AGENTS`](super::MAX_AGENTS).
    TooManyAgents {
        /// The cap.
        max: usize,
    },
    /// The file describes more turns and chunks than
    /// [`MAX_SCRIPTED`](super::MAX_SCRIPTED).
    TooMuchScript {
        /// The cap.
        max: usize,
    },
    /// A `parent` that names an entry with a `count`, which stands for
    /// several agents.
    ParentIsCounted {
        /// The name given.
        parent: String,
        /// The entry's `count`.
        count: usize,
    },
    /// A name a counted entry gives one of its agents is already taken.
    CountedNameTaken {
        /// The name.
        name: String,
        /// The line of the agent that has it.
        first_line: usize,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKey { allowed } => write!(f, "unknown key; {allowed}"),
            Self::MissingKey => f.write_str("this required key is missing"),
            Self::WrongValue { message } => write!(f, "wrong value: {message}"),
            Self::UnknownTurnEnd { value } => {
                write!(f, "unknown turn end {value:?}; accepted values: ")?;
                for (i, end) in TurnEnd::ALL.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(end.as_str())?;
                }
                Ok(())
            }
            Self::NoAgent => f.write_str("no [[agent]]: a scenario needs at least one agent"),
            Self::NoRoot => f.write_str(
                "no root agent: every agent has a `parent`; exactly one agent must have none",
            ),
            Self::SecondRoot { first } => write!(
                f,
                "a second root: agent {first:?} already has no `parent`; exactly one agent may \
                 have none"
            ),
            Self::UnknownParent { parent } => write!(f, "no agent named {parent:?}"),
            Self::OwnParent => f.write_str("an agent cannot be its own parent"),
            Self::Cycle { path } => {
                f.write_str("the parents form a cycle: ")?;
                for (i, name) in path.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" -> ")?;
                    }
                    write!(f, "{name:?}")?;
                }
                f.write_str(" (each agent followed by its parent)")
            }
            Self::DuplicateName { first_line } => {
                write!(f, "duplicate name: an agent at line {first_line} already has it")
            }
            Self::EmptyName => f.write_str("the name is empty"),
            Self::BadName { reason } => write!(f, "bad name: {reason}"),
            Self::NegativeDuration { value } => {
                write!(f, "a duration cannot be negative (found {value} ms)")
            }
            Self::DurationTooLong { value, cap } => write!(
                f,
                "{value} ms is more than the cap of {} ms ({} h)",
                cap.as_millis(),
                cap.as_secs() / 3600
            ),
            Self::ZeroIdleTimeout => f.write_str(
                "0 ms would time out every turn at once; leave the key out to use the default",
            ),
            Self::NoTurns => f.write_str(
                "the agent has no [[agent.turn]]; an agent finishes after its last turn, so it \
                 needs at least one",
            ),
            Self::RootSpawnAfter => f.write_str(
                "the root starts the run; `spawn_after_ms` applies only to an agent with a `parent`",
            ),
            Self::IgnoreWithoutIgnoreCancel { end } => write!(
                f,
                "`ignore_ms` applies only to end = \"ignore_cancel\", and this turn's end is {:?}",
                end.as_str()
            ),
            Self::BadCount { value } => write!(
                f,
                "`count` must be at least 1 (found {value}); leave it out for one agent"
            ),
            Self::RootCount => f.write_str(
                "the root is one agent; `count` applies only to an agent with a `parent`",
            ),
            Self::TooManyAgents { max } => write!(
                f,
                "the scenario describes more than the {max} agents `settle run` takes (counting \
                 every `count`)"
            ),
            Self::TooMuchScript { max } => write!(
                f,
                "the scenario describes more than the {max} turns and chunks `settle run` takes \
                 (a turn and each of its chunks count one, for every agent of a `count`)"
            ),
            Self::ParentIsCounted { parent, count } => write!(
                f,
                "{parent:?} has count = {count}, so it stands for {count} agents; name one of \
                 them, {:?} to {:?}",
                format!("{parent}-1"),
                format!("{parent}-{count}"),
            ),
            Self::CountedNameTaken { name, first_line } => write!(
                f,
                "`count` names this entry's agents NAME-1, NAME-2, …, and {name:?} is taken by \
                 the agent at line {first_line}"
            ),
        }
    }
}

/// Which agent an error is about: by name, or by position when it has none
/// yet (a missing or unreadable name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentRef {
    /// The agent's `name`.
    Named(String),
    /// The agent's position in the file, from 1.
    Index(usize),
}

impl fmt::Display for AgentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Named(name) => write!(f, "agent {name:?}"),
            Self::Index(n) => write!(f, "agent #{n}"),
        }
    }
}

/// Where in a scenario file an error is: `file:line:column: agent "x": turn 2:
/// key "k"`, each part present only when known.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    /// The file, as given (or the origin name given to `parse`).
    pub file: String,
    /// Line and column, from 1 (the column counts characters).
    pub line_col: Option<(usize, usize)>,
    /// The agent.
    pub agent: Option<AgentRef>,
    /// The turn of that agent, from 1.
    pub turn: Option<usize>,
    /// The key.
    pub key: Option<String>,
}

impl Location {
    /// A location with only the file.
    pub(crate) fn file(file: &str) -> Self {
        Self {
            file: file.to_owned(),
            ..Self::default()
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some((line, column)) = self.line_col {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(agent) = &self.agent {
            write!(f, ": {agent}")?;
        }
        if let Some(turn) = self.turn {
            write!(f, ": turn {turn}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key {key:?}")?;
        }
        Ok(())
    }
}

/// `text` on one line: control characters (newlines included) escaped.
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
