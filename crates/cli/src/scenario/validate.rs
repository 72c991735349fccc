//! From what the TOML says to a [`Scenario`] that can run, or the first
//! reason it cannot.
//!
//! Checks go in file order, each value once, so the error reported is the
//! first problem a reader of the file would meet; relations between agents
//! (parents, roots, cycles) are checked once every agent is known.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::count::{copy_name, longest_name_chars};
use super::error::{one_line, AgentRef, Location, Problem, ScenarioError};
use super::locate::{line_col, Tree};
use super::raw::{RawAgent, RawScenario, RawTurn};
use super::{
    AgentSpec, Scenario, TurnEnd, TurnSpec, DEFAULT_IGNORE, MAX_AGENTS, MAX_DURATION,
    MAX_NAME_CHARS, MAX_SCRIPTED,
};

/// The context errors are reported in: the text (for line and column) and
/// the file's name.
struct Ctx<'a> {
    /// The scenario text.
    text: &'a str,
    /// The file's name, one line.
    file: &'a str,
}

/// Where in the file, for an error: which agent, turn and key.
#[derive(Clone, Copy)]
struct Place<'a> {
    /// The agent, by index (from 0) and name if it has a valid one.
    agent: Option<(usize, Option<&'a str>)>,
    /// The turn, from 0.
    turn: Option<usize>,
}

impl<'a> Place<'a> {
    /// The top level of the file.
    const TOP: Place<'static> = Place {
        agent: None,
        turn: None,
    };

    /// Agent `index`, named `name` when its name is known to be valid.
    fn agent(index: usize, name: Option<&'a str>) -> Self {
        Self {
            agent: Some((index, name)),
            turn: None,
        }
    }

    /// Turn `turn` of this agent.
    fn turn(self, turn: usize) -> Self {
        Self {
            turn: Some(turn),
            ..self
        }
    }
}

impl Ctx<'_> {
    /// The error `problem` at `span`, in `place`, about `key`.
    fn error(
        &self,
        span: Range<usize>,
        place: Place<'_>,
        key: &str,
        problem: Problem,
    ) -> ScenarioError {
        let at = Location {
            file: self.file.to_owned(),
            line_col: Some(line_col(self.text, span.start)),
            agent: place.agent.map(|(index, name)| match name {
                Some(name) => AgentRef::Named(name.to_owned()),
                None => AgentRef::Index(index + 1),
            }),
            turn: place.turn.map(|turn| turn + 1),
            key: Some(key.to_owned()),
        };
        ScenarioError::Invalid {
            at: Box::new(at),
            problem,
        }
    }

    /// A duration in milliseconds, within `0..=MAX_DURATION`.
    fn duration(
        &self,
        value: Option<&Spanned<i64>>,
        place: Place<'_>,
        key: &str,
    ) -> Result<Option<Duration>, ScenarioError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let ms = *value.get_ref();
        let Ok(unsigned) = u64::try_from(ms) else {
            return Err(self.error(
                value.span(),
                place,
                key,
                Problem::NegativeDuration { value: ms },
            ));
        };
        let duration = Duration::from_millis(unsigned);
        if duration > MAX_DURATION {
            return Err(self.error(
                value.span(),
                place,
                key,
                Problem::DurationTooLong {
                    value: ms,
                    cap: MAX_DURATION,
                },
            ));
        }
        Ok(Some(duration))
    }

    /// A name: not blank, no control characters, not too long.
    fn name<'n>(
        &self,
        name: &'n Spanned<String>,
        place: Place<'_>,
    ) -> Result<&'n str, ScenarioError> {
        let text = name.get_ref().as_str();
        let problem = if text.trim().is_empty() {
            Problem::EmptyName
        } else if text.chars().any(char::is_control) {
            Problem::BadName {
                reason: "it contains a control character",
            }
        } else if text.chars().count() > MAX_NAME_CHARS {
            Problem::BadName {
                reason: "it is longer than 128 characters",
            }
        } else {
            return Ok(text);
        };
        Err(self.error(name.span(), place, "name", problem))
    }

    /// `count` of entry `agent`: `None` when absent; refused below 1, on the
    /// root (an entry without a `parent`), above [`MAX_AGENTS`], or when the
    /// names it gives would be too long.
    fn count(&self, agent: &RawAgent, place: Place<'_>) -> Result<Option<usize>, ScenarioError> {
        let Some(value) = &agent.count else {
            return Ok(None);
        };
        let n = *value.get_ref();
        let problem = match usize::try_from(n) {
            Ok(0) | Err(_) if n < 1 => Problem::BadCount { value: n },
            _ if agent.parent.is_none() => Problem::RootCount,
            Ok(count) if count <= MAX_AGENTS => {
                let base = agent.name.get_ref();
                if longest_name_chars(base, count) > MAX_NAME_CHARS {
                    Problem::BadName {
                        reason: "with the number `count` adds, it is longer than 128 characters",
                    }
                } else {
                    return Ok(Some(count));
                }
            }
            _ => Problem::TooManyAgents { max: MAX_AGENTS },
        };
        Err(self.error(value.span(), place, "count", problem))
    }

    /// One turn of agent `place`.
    fn turn(&self, turn: &RawTurn, place: Place<'_>) -> Result<TurnSpec, ScenarioError> {
        let chunk_delay = self.duration(turn.chunk_delay_ms.as_ref(), place, "chunk_delay_ms")?;
        let end = turn
            .end
            .as_ref()
            .map_or(TurnEnd::Complete, |end| end.get_ref().0);
        let close_delay = self.duration(turn.close_delay_ms.as_ref(), place, "close_delay_ms")?;
        let ignore = self.duration(turn.ignore_ms.as_ref(), place, "ignore_ms")?;
        if let (Some(span), true) = (
            turn.ignore_ms.as_ref().map(Spanned::span),
            end != TurnEnd::IgnoreCancel,
        ) {
            return Err(self.error(
                span,
                place,
                "ignore_ms",
                Problem::IgnoreWithoutIgnoreCancel { end },
            ));
        }
        Ok(TurnSpec {
            chunks: turn.chunks.clone(),
            chunk_delay: chunk_delay.unwrap_or_default(),
            end,
            close_delay: close_delay.unwrap_or_default(),
            ignore: ignore.unwrap_or(DEFAULT_IGNORE),
        })
    }
}

/// Checks `raw` (parsed from `text`, called `file`) and builds the scenario.
pub(crate) fn validate(
    raw: RawScenario,
    text: &str,
    file: &str,
) -> Result<Scenario, ScenarioError> {
    let ctx = Ctx { text, file };
    let name = ctx.name(&raw.name, Place::TOP)?.to_owned();
    let settle_timeout = ctx.duration(
        raw.settle_timeout_ms.as_ref(),
        Place::TOP,
        "settle_timeout_ms",
    )?;
    let idle_timeout = ctx.duration(raw.idle_timeout_ms.as_ref(), Place::TOP, "idle_timeout_ms")?;
    if let (Some(value), Some(Duration::ZERO)) = (&raw.idle_timeout_ms, idle_timeout) {
        return Err(ctx.error(
            value.span(),
            Place::TOP,
            "idle_timeout_ms",
            Problem::ZeroIdleTimeout,
        ));
    }
    if raw.agent.is_empty() {
        return Err(ScenarioError::Invalid {
            at: Box::new(Location {
                key: Some("agent".to_owned()),
                ..Location::file(file)
            }),
            problem: Problem::NoAgent,
        });
    }

    // Each entry on its own, in file order; a counted entry stands for
    // `count` agents (see `count`).
    let mut by_name: HashMap<String, usize> = HashMap::with_capacity(raw.agent.len());
    // The base names of counted entries: entry index and count.
    let mut counted: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut agents = Vec::with_capacity(raw.agent.len());
    // The turns and chunks of the agents so far (see `MAX_SCRIPTED`).
    let mut scripted: usize = 0;
    // For each agent (same index as `agents`), the entry it comes from.
    let mut entry_of: Vec<usize> = Vec::with_capacity(raw.agent.len());
    let line_of = |entry: usize| {
        let first: &RawAgent = raw.agent[entry].get_ref();
        line_col(text, first.name.span().start).0
    };
    for (index, spanned) in raw.agent.iter().enumerate() {
        let agent: &RawAgent = spanned.get_ref();
        let agent_name = ctx.name(&agent.name, Place::agent(index, None))?;
        let place = Place::agent(index, Some(agent_name));
        let taken = by_name
            .get(agent_name)
            .map(|&first| entry_of[first])
            .or_else(|| counted.get(agent_name).map(|&(entry, _)| entry));
        if let Some(first) = taken {
            return Err(ctx.error(
                agent.name.span(),
                place,
                "name",
                Problem::DuplicateName {
                    first_line: line_of(first),
                },
            ));
        }
        let count = ctx.count(agent, place)?;
        let copies = count.unwrap_or(1);
        // Too much for a run, said at its `count` (its name without one).
        let too_much = |problem| {
            let at = agent.count.as_ref();
            let span = at.map_or(agent.name.span(), Spanned::span);
            ctx.error(span, place, "count", problem)
        };
        if copies > MAX_AGENTS - agents.len() {
            return Err(too_much(Problem::TooManyAgents { max: MAX_AGENTS }));
        }
        let spawn_after = ctx.duration(agent.spawn_after_ms.as_ref(), place, "spawn_after_ms")?;
        if agent.turn.is_empty() {
            return Err(ctx.error(spanned.span(), place, "turn", Problem::NoTurns));
        }
        let turns = agent
            .turn
            .iter()
            .enumerate()
            .map(|(turn_index, turn)| ctx.turn(turn.get_ref(), place.turn(turn_index)))
            .collect::<Result<std::sync::Arc<[_]>, _>>()?;
        // What its agents will hold once they play, every copy counted.
        let each: usize = turns.iter().map(|turn| 1 + turn.chunks.len()).sum();
        match each.checked_mul(copies) {
            Some(more) if more <= MAX_SCRIPTED - scripted => scripted += more,
            _ => return Err(too_much(Problem::TooMuchScript { max: MAX_SCRIPTED })),
        }
        let spec = |name: String| AgentSpec {
            name,
            parent: agent.parent.as_ref().map(|parent| parent.get_ref().clone()),
            spawn_after: spawn_after.unwrap_or_default(),
            turns: turns.clone(),
        };
        let Some(count) = count else {
            by_name.insert(agent_name.to_owned(), agents.len());
            agents.push(spec(agent_name.to_owned()));
            entry_of.push(index);
            continue;
        };
        counted.insert(agent_name, (index, count));
        for i in 1..=count {
            let name = copy_name(agent_name, i);
            if let Some(&first) = by_name.get(&name) {
                return Err(ctx.error(
                    agent.name.span(),
                    place,
                    "count",
                    Problem::CountedNameTaken {
                        name,
                        first_line: line_of(entry_of[first]),
                    },
                ));
            }
            by_name.insert(name.clone(), agents.len());
            agents.push(spec(name));
            entry_of.push(index);
        }
    }

    // Parents, in file order.
    let mut parents: Vec<Option<usize>> = Vec::with_capacity(agents.len());
    for (index, &entry) in entry_of.iter().enumerate() {
        let agent = raw.agent[entry].get_ref();
        let place = Place::agent(entry, Some(agent.name.get_ref()));
        let Some(parent) = &agent.parent else {
            parents.push(None);
            continue;
        };
        if parent.get_ref() == &agents[index].name {
            return Err(ctx.error(parent.span(), place, "parent", Problem::OwnParent));
        }
        if let Some(&(_, count)) = counted.get(parent.get_ref().as_str()) {
            return Err(ctx.error(
                parent.span(),
                place,
                "parent",
                Problem::ParentIsCounted {
                    parent: parent.get_ref().clone(),
                    count,
                },
            ));
        }
        let Some(&parent_index) = by_name.get(parent.get_ref()) else {
            return Err(ctx.error(
                parent.span(),
                place,
                "parent",
                Problem::UnknownParent {
                    parent: parent.get_ref().clone(),
                },
            ));
        };
        parents.push(Some(parent_index));
    }

    // Exactly one root.
    let mut roots = parents
        .iter()
        .enumerate()
        .filter(|(_, parent)| parent.is_none())
        .map(|(index, _)| index);
    let Some(root) = roots.next() else {
        let first = raw.agent[0].get_ref();
        let span = first
            .parent
            .as_ref()
            .map_or(first.name.span(), Spanned::span);
        return Err(ctx.error(
            span,
            Place::agent(0, Some(first.name.get_ref())),
            "parent",
            Problem::NoRoot,
        ));
    };
    if let Some(second) = roots.next() {
        let entry = entry_of[second];
        let agent = raw.agent[entry].get_ref();
        return Err(ctx.error(
            agent.name.span(),
            Place::agent(entry, Some(agent.name.get_ref())),
            "parent",
            Problem::SecondRoot {
                first: agents[root].name.clone(),
            },
        ));
    }
    if let Some(spawn_after) = &raw.agent[entry_of[root]].get_ref().spawn_after_ms {
        return Err(ctx.error(
            spawn_after.span(),
            Place::agent(entry_of[root], Some(&agents[root].name)),
            "spawn_after_ms",
            Problem::RootSpawnAfter,
        ));
    }

    // The tree from the root; whatever it does not reach hangs off a cycle.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); agents.len()];
    for (index, parent) in parents.iter().enumerate() {
        if let Some(parent) = parent {
            children[*parent].push(index);
        }
    }
    let mut order = Vec::with_capacity(agents.len());
    let mut queue = VecDeque::from([root]);
    while let Some(index) = queue.pop_front() {
        order.push(index);
        queue.extend(children[index].iter().copied());
    }
    if order.len() < agents.len() {
        let mut reached = vec![false; agents.len()];
        for &index in &order {
            reached[index] = true;
        }
        return Err(cycle_error(
            &ctx, &raw, &agents, &entry_of, &parents, &reached,
        ));
    }

    Ok(Scenario {
        name,
        settle_timeout,
        idle_timeout,
        agents,
        root,
        children,
        order,
        by_name,
    })
}

/// The error for the cycle that the first agent not `reached` from the root
/// leads into.
fn cycle_error(
    ctx: &Ctx<'_>,
    raw: &RawScenario,
    agents: &[AgentSpec],
    entry_of: &[usize],
    parents: &[Option<usize>],
    reached: &[bool],
) -> ScenarioError {
    // An unreached agent has a parent (the root is the only one without),
    // and so does every agent up its chain, which must therefore loop.
    let start = reached
        .iter()
        .position(|reached| !reached)
        .unwrap_or_default();
    let mut seen_at: HashMap<usize, usize> = HashMap::new();
    let mut chain = Vec::new();
    let mut current = start;
    while let Entry::Vacant(slot) = seen_at.entry(current) {
        slot.insert(chain.len());
        chain.push(current);
        match parents[current] {
            Some(parent) => current = parent,
            None => break,
        }
    }
    let cycle_start = seen_at.get(&current).copied().unwrap_or_default();
    let mut cycle: Vec<usize> = chain[cycle_start..].to_vec();
    // Start the cycle at the agent that comes first in the file.
    if let Some(first) = cycle.iter().enumerate().min_by_key(|(_, index)| **index) {
        let first = first.0;
        cycle.rotate_left(first);
    }
    let name_of = |index: usize| agents[index].name.clone();
    let mut path: Vec<String> = cycle.iter().map(|&index| name_of(index)).collect();
    let first = cycle.first().copied().unwrap_or(start);
    path.push(name_of(first));
    let entry = entry_of[first];
    let agent = raw.agent[entry].get_ref();
    let span = agent
        .parent
        .as_ref()
        .map_or(agent.name.span(), Spanned::span);
    ctx.error(
        span,
        Place::agent(entry, Some(agent.name.get_ref())),
        "parent",
        Problem::Cycle { path },
    )
}

/// Turns a TOML or serde error into a [`ScenarioError`] that says where it
/// is: line and column always, and agent, turn and key when the file is
/// valid TOML.
pub(crate) fn from_toml_error(error: &toml::de::Error, text: &str, file: &str) -> ScenarioError {
    let mut at = Location::file(file);
    // A key missing from the document's top level comes with an empty span
    // at 0, which would point into whatever table comes first: drop it.
    let span = error
        .span()
        .filter(|span| !(span.is_empty() && error.message().starts_with("missing field")));
    if let Some(span) = &span {
        at.line_col = Some(line_col(text, span.start));
    }
    let message = one_line(&error.message().trim().replace('\n', "; "));
    let tree = match Tree::parse(text) {
        Ok(tree) => tree,
        Err(_) => {
            return ScenarioError::Syntax {
                at: Box::new(at),
                message,
            }
        }
    };
    if let Some(span) = &span {
        tree.locate(span, &mut at);
    }
    let problem = if let Some(rest) = message.strip_prefix("unknown field ") {
        if let Some(key) = quoted(rest) {
            at.key = Some(key.to_owned());
        }
        let allowed = rest
            .split_once(", ")
            .map_or("", |(_, allowed)| allowed)
            .to_owned();
        Problem::UnknownKey { allowed }
    } else if let Some(rest) = message.strip_prefix("missing field ") {
        at.key = quoted(rest).map(str::to_owned);
        Problem::MissingKey
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        // `end` is the only enumerated key.
        Problem::UnknownTurnEnd {
            value: quoted(rest).unwrap_or(rest).to_owned(),
        }
    } else {
        let mut message =
            message.replace("expected i64", "expected a whole number of milliseconds");
        if message.ends_with("expected a sequence") {
            // `[agent]` for `[[agent]]`, or `turn = {..}` for `[[agent.turn]]`.
            message.push_str(" (each agent is an [[agent]] table, each turn an [[agent.turn]])");
        }
        Problem::WrongValue { message }
    };
    ScenarioError::Invalid {
        at: Box::new(at),
        problem,
    }
}

/// The text between the first pair of backticks of `text`.
fn quoted(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('`')?;
    rest.split_once('`').map(|(quoted, _)| quoted)
}
