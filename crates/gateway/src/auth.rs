//! Who a connection speaks for: [`Tokens`], the bearer tokens a gateway
//! accepts, each the key of one principal, and the check of a request's
//! `Authorization: Bearer TOKEN` before its upgrade.
//!
//! A gateway without tokens serves one anonymous principal, as a gateway
//! on a loopback address always did. Tokens are compared in constant time,
//! and never written anywhere: not in an error, not in a log line, not in
//! `Debug`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

/// The fewest characters a token may have: a short one could be guessed.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The longest principal name accepted, in characters.
const MAX_PRINCIPAL_CHARS: usize = 64;

/// Who a connection speaks for: a principal of the token file, or the one
/// anonymous principal of a gateway without tokens.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Principal(Option<Arc<str>>);

impl Principal {
    /// The principal of a gateway without tokens.
    pub const ANONYMOUS: Principal = Principal(None);

    pub fn is_anonymous(&self) -> bool {
        self.0.is_none()
    }

    /// The principal named `name`, as the store records it (SPEC §12).
    pub fn named(name: &str) -> Self {
        Principal(Some(name.into()))
    }

    /// Its name, as the store records it; `None` for the anonymous one.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("anonymous"))
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Principal({self})")
    }
}

/// The bearer tokens a gateway accepts, each the key of one principal (a
/// principal may have several, to rotate them). Read from a token file:
/// one `PRINCIPAL TOKEN` pair per line, `#` comments and blank lines
/// allowed. Cheap to clone; its `Debug` shows the principals, never a token.
#[derive(Clone)]
pub struct Tokens {
    entries: Arc<[Entry]>,
}

/// A principal and one of its tokens.
type Entry = (Arc<str>, Box<[u8]>);

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field("principals", &self.principals().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Why a token file was refused. Its message names the line at fault and
/// never quotes a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}",
    path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default(),
    line.map(|n| format!("line {n}: ")).unwrap_or_default())]
pub struct TokenFileError {
    /// The file, when it was read from one.
    pub path: Option<PathBuf>,
    /// The line at fault, from 1.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Tokens {
    /// Reads the token file at `path`.
    ///
    /// # Errors
    /// When it cannot be read, or a line is not a `PRINCIPAL TOKEN` pair
    /// (see [`parse`](Self::parse)).
    pub fn load(path: &Path) -> Result<Tokens, TokenFileError> {
        let refuse = |message: String| TokenFileError {
            path: Some(path.to_owned()),
            line: None,
            message,
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| refuse(format!("cannot read the token file: {e}")))?;
        // Anyone who may write it may add a principal of their own.
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode();
            if mode & 0o002 != 0 {
                return Err(refuse(format!(
                    "anyone on this machine may write the token file (mode {:o}), and so add \
                     a principal of their own; chmod o-w it (0600 keeps its tokens to its owner)",
                    mode & 0o7777
                )));
            }
        }
        Tokens::parse(&text).map_err(|e| TokenFileError {
            path: Some(path.to_owned()),
            ..e
        })
    }

    /// Reads a token file's text: one `PRINCIPAL TOKEN` pair per line,
    /// separated by spaces or tabs; `#` starts a comment line; blank lines
    /// are skipped. A principal is at most 64 printable characters; a
    /// token at least [`MIN_TOKEN_CHARS`] visible ASCII characters, given
    /// to one principal only.
    ///
    /// # Errors
    /// On the first line that breaks these rules, or when no token is given.
    pub fn parse(text: &str) -> Result<Tokens, TokenFileError> {
        let mut entries: Vec<Entry> = Vec::new();
        // The line of each entry.
        let mut lines: Vec<usize> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let refuse = |message: String| TokenFileError {
                path: None,
                line: Some(i + 1),
                message,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(principal), Some(token), None) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(refuse(
                    "expected two fields, `PRINCIPAL TOKEN`, separated by spaces".into(),
                ));
            };
            if principal.chars().count() > MAX_PRINCIPAL_CHARS
                || principal.chars().any(char::is_control)
            {
                return Err(refuse(format!(
                    "a principal is at most {MAX_PRINCIPAL_CHARS} printable characters"
                )));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(refuse(
                    "a token is visible ASCII characters only (it travels in an HTTP header)"
                        .into(),
                ));
            }
            // No message quotes a field: with the columns swapped, the
            // principal's place holds the token.
            if token.len() < MIN_TOKEN_CHARS {
                return Err(refuse(format!(
                    "the token (the second field) is {} characters long; at least \
                     {MIN_TOKEN_CHARS} are required",
                    token.len()
                )));
            }
            let same = entries.iter().position(|(_, t)| **t == *token.as_bytes());
            if let Some(other) = same {
                return Err(refuse(format!(
                    "this token is already the token of line {}: each token names one principal",
                    lines[other]
                )));
            }
            entries.push((principal.into(), token.as_bytes().into()));
            lines.push(i + 1);
        }
        if entries.is_empty() {
            return Err(TokenFileError {
                path: None,
                line: None,
                message: "no `PRINCIPAL TOKEN` line: every client would be refused".into(),
            });
        }
        Ok(Tokens {
            entries: entries.into(),
        })
    }

    /// The principals, in the file's order, once per token.
    pub fn principals(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(p, _)| &**p)
    }

    /// The principal whose token is `token`. Every token is compared, in
    /// constant time, whichever matches.
    fn principal(&self, token: &[u8]) -> Option<Principal> {
        let mut found = None;
        for (principal, known) in self.entries.iter() {
            if bool::from(known.as_ref().ct_eq(token)) {
                found = Some(principal.clone());
            }
        }
        found.map(|p| Principal(Some(p)))
    }
}

/// Why a request was refused before its upgrade (HTTP 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unauthorized {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token no principal has.
    Unknown,
    /// More than one `Authorization` header: which one speaks is not the
    /// gateway's to guess (a proxy and a client may each have set one).
    Several,
}

impl Unauthorized {
    /// The sentence for the client (and the log); no token in it.
    pub fn message(self) -> &'static str {
        match self {
            Unauthorized::Missing => {
                "a bearer token is required: send `Authorization: Bearer TOKEN` with the upgrade"
            }
            Unauthorized::Unknown => "this bearer token is not known to the gateway",
            Unauthorized::Several => {
                "send one `Authorization` header with the upgrade, not several"
            }
        }
    }
}

/// Who the request with `headers` speaks for: the anonymous principal when
/// there are no tokens; else the principal of its bearer token.
pub(crate) fn authenticate(
    tokens: Option<&Tokens>,
    headers: &HeaderMap,
) -> Result<Principal, Unauthorized> {
    let Some(tokens) = tokens else {
        return Ok(Principal::ANONYMOUS);
    };
    // As the JSON of a request refuses a key given twice: two headers
    // would leave the principal to whichever one a reader takes.
    let mut given = headers.get_all(AUTHORIZATION).iter();
    let value = given.next().ok_or(Unauthorized::Missing)?.as_bytes();
    if given.next().is_some() {
        return Err(Unauthorized::Several);
    }
    let token = match value.iter().position(|b| *b == b' ') {
        Some(space) if value[..space].eq_ignore_ascii_case(b"bearer") => {
            value[space + 1..].trim_ascii()
        }
        _ => return Err(Unauthorized::Missing),
    };
    tokens.principal(token).ok_or(Unauthorized::Unknown)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const A: &str = "alice-0123456789abcdef";
    const B: &str = "bob-0123456789abcdefgh";

    fn tokens() -> Tokens {
        Tokens::parse(&format!("# who may connect\n\nalice {A}\n  bob\t{B}  \n")).unwrap()
    }

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn a_token_names_its_principal_and_nothing_else_passes() {
        let tokens = tokens();
        assert_eq!(tokens.principals().collect::<Vec<_>>(), ["alice", "bob"]);
        let alice = authenticate(Some(&tokens), &with(&format!("Bearer {A}"))).unwrap();
        assert_eq!(alice.to_string(), "alice");
        let bob = authenticate(Some(&tokens), &with(&format!("bearer {B}"))).unwrap();
        assert_eq!(bob.to_string(), "bob");
        assert_ne!(alice, bob);
        assert_eq!(
            authenticate(Some(&tokens), &HeaderMap::new()),
            Err(Unauthorized::Missing)
        );
        assert_eq!(
            authenticate(Some(&tokens), &with(&format!("Basic {A}"))),
            Err(Unauthorized::Missing)
        );
        assert_eq!(
            authenticate(Some(&tokens), &with(&format!("Bearer {A}x"))),
            Err(Unauthorized::Unknown)
        );
        assert_eq!(
            authenticate(None, &HeaderMap::new()),
            Ok(Principal::ANONYMOUS)
        );
    }

    #[test]
    fn two_authorization_headers_are_refused_whichever_comes_first() {
        let tokens = tokens();
        for (first, second) in [(A, B), (B, A), (A, A)] {
            let mut headers = with(&format!("Bearer {first}"));
            headers.append(
                AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {second}")).unwrap(),
            );
            assert_eq!(
                authenticate(Some(&tokens), &headers),
                Err(Unauthorized::Several)
            );
        }
    }

    #[test]
    fn a_bad_token_file_names_its_line_and_never_quotes_a_token() {
        let secret = "s3cret-s3cret-s3cret";
        for (text, line) in [
            (format!("alice {secret} extra\n"), Some(1)),
            (format!("# c\nalice\n{secret}\n"), Some(2)),
            ("alice short\n".to_owned(), Some(1)),
            (format!("alice {secret}\nbob {secret}\n"), Some(2)),
            // Columns swapped, or written as one: the token is in the
            // principal's place.
            (format!("{secret} alice\n"), Some(1)),
            (format!("alice={secret} x\n"), Some(1)),
            (
                format!("{secret} alice-the-long-name\nbob alice-the-long-name\n"),
                Some(2),
            ),
            ("# nothing\n\n".to_owned(), None),
        ] {
            let error = Tokens::parse(&text).unwrap_err();
            assert_eq!(error.line, line, "{text}");
            let shown = error.to_string();
            assert!(!shown.contains(secret), "{shown}");
            assert!(!shown.contains("short"), "{shown}");
            assert!(!shown.contains('\n'), "{shown}");
        }
        assert!(!format!("{:?}", tokens()).contains(A));
    }
}
