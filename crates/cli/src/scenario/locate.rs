//! Turning a byte offset in a scenario file into "agent, turn, key".
//!
//! A serde error carries only a byte span, and its message names at most the
//! key; the agent and turn it belongs to are lost. To name them, the file is
//! parsed a second time (only on the error path) into a loose tree that keeps
//! the span of every key and value, and the error's offset is looked up in
//! it.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use toml::Spanned;

use super::error::{AgentRef, Location};

/// Any TOML value, with the spans of the keys and values inside it.
#[derive(Debug)]
pub(crate) enum Node {
    /// A table: its keys (with their spans) and values, in file order.
    Table(Vec<(Spanned<String>, Spanned<Node>)>),
    /// An array.
    Array(Vec<Spanned<Node>>),
    /// A string.
    String(String),
    /// Any other scalar (number, boolean, date).
    Other,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Builds a [`Node`] from whatever the deserializer holds.
struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any TOML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Other)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Table(entries))
    }
}

/// The whole file as a loose tree, for locating errors.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The document's top-level table.
    root: Node,
}

/// One step of a path from the top of the document.
#[derive(Debug, PartialEq)]
enum Step<'a> {
    /// Into the value of a key.
    Key(&'a str),
    /// Into an element of an array.
    Index(usize),
}

impl Tree {
    /// Parses `text`; an error here is a TOML syntax error.
    pub(crate) fn parse(text: &str) -> Result<Self, toml::de::Error> {
        Ok(Self {
            root: toml::from_str(text)?,
        })
    }

    /// The path of keys and indexes that leads to the innermost value or key
    /// holding all of `span`.
    fn path_to(&self, span: &Range<usize>) -> Vec<Step<'_>> {
        let mut path = Vec::new();
        let mut node = &self.root;
        loop {
            match node {
                Node::Table(entries) => {
                    let hit = entries
                        .iter()
                        .find(|(key, value)| contains(&key.span(), span) || covers(value, span));
                    let Some((key, value)) = hit else { break };
                    path.push(Step::Key(key.get_ref()));
                    node = value.get_ref();
                }
                Node::Array(items) => {
                    let hit = items
                        .iter()
                        .enumerate()
                        .find(|(_, item)| covers(item, span));
                    let Some((index, item)) = hit else { break };
                    path.push(Step::Index(index));
                    node = item.get_ref();
                }
                Node::String(_) | Node::Other => break,
            }
        }
        path
    }

    /// The name of the agent at `index`, when it has a string name.
    fn agent_name(&self, index: usize) -> Option<&str> {
        let agents = table_get(&self.root, "agent")?;
        let Node::Array(agents) = agents else {
            return None;
        };
        match table_get(agents.get(index)?.get_ref(), "name")? {
            Node::String(name) => Some(name),
            _ => None,
        }
    }

    /// Fills the agent, turn and key of `at` from the byte range `span` of
    /// an error.
    pub(crate) fn locate(&self, span: &Range<usize>, at: &mut Location) {
        let path = self.path_to(span);
        let mut steps = path.as_slice();
        if let [Step::Key("agent"), Step::Index(agent), rest @ ..] = steps {
            at.agent = Some(match self.agent_name(*agent) {
                Some(name) => AgentRef::Named(name.to_owned()),
                None => AgentRef::Index(agent + 1),
            });
            steps = rest;
            if let [Step::Key("turn"), Step::Index(turn), rest @ ..] = steps {
                at.turn = Some(turn + 1);
                steps = rest;
            }
        }
        if let [Step::Key(key), ..] = steps {
            at.key = Some((*key).to_owned());
        }
    }
}

/// The value of `key` in `node`, if `node` is a table that has it.
fn table_get<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    let Node::Table(entries) = node else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, value)| value.get_ref())
}

/// Whether `span` falls in `node` or in anything inside it.
///
/// A table of an array of tables spans only its own header and keys, not its
/// sub-tables (`[[agent.turn]]` comes after `[[agent]]`'s span ends), hence the
/// search below it.
fn covers(node: &Spanned<Node>, span: &Range<usize>) -> bool {
    if contains(&node.span(), span) {
        return true;
    }
    match node.get_ref() {
        Node::Table(entries) => entries
            .iter()
            .any(|(key, value)| contains(&key.span(), span) || covers(value, span)),
        Node::Array(items) => items.iter().any(|item| covers(item, span)),
        Node::String(_) | Node::Other => false,
    }
}

/// Whether `inner` lies within `outer`. An empty `inner` is a position: it
/// lies within `outer` if it is in it, or at an empty `outer`.
fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    if inner.is_empty() {
        outer.contains(&inner.start) || (outer.is_empty() && outer.start == inner.start)
    } else {
        outer.start <= inner.start && inner.end <= outer.end
    }
}

/// Line and column (from 1; the column counts characters) of byte `offset`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}
