//! The `Origin` allow-list: a web page must not drive a gateway, even one
//! on localhost, unless its origin is listed.
//!
//! A browser sends `Origin` with every WebSocket upgrade and a page cannot
//! leave it out; other clients (a TUI, a script) send none. So a request
//! with no `Origin` is let through, one whose origin is listed too, and any
//! other is refused (HTTP 403) before the upgrade.

use axum::http::header::ORIGIN;
use axum::http::HeaderMap;

/// The origins allowed to upgrade.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origins {
    allowed: Vec<String>,
}

/// A web origin as `--allow-origin` takes it: `scheme://host[:port]` (a
/// trailing `/` is dropped), in lower case.
///
/// # Errors
/// What is wrong with it, in one line: `null` (the origin of every
/// sandboxed frame and local file: allowing it would let any web page
/// drive the gateway), `*`, a path, a query, user info, or no `scheme://`
/// (none of which a browser's `Origin` ever carries, so it would never
/// match).
///
/// ```
/// use settle_gateway::parse_origin;
///
/// assert_eq!(parse_origin("https://App.example.com/").unwrap(), "https://app.example.com");
/// assert!(parse_origin("null").is_err());
/// assert!(parse_origin("app.example.com").is_err());
/// ```
pub fn parse_origin(text: &str) -> Result<String, String> {
    let origin = text.trim();
    let origin = origin
        .strip_suffix('/')
        .unwrap_or(origin)
        .to_ascii_lowercase();
    if origin == "null" {
        return Err(
            "`null` is the origin of every sandboxed frame and local file: allowing it \
             would let any web page drive the gateway"
                .to_owned(),
        );
    }
    let Some((scheme, host)) = origin.split_once("://") else {
        return Err(format!(
            "`{}` is not an origin: write scheme://host[:port], like https://app.example.com",
            shown(text)
        ));
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let host_ok = !host.is_empty()
        && !host.contains(['/', '?', '#', '@', '*'])
        && !host.chars().any(|c| c.is_whitespace() || c.is_control());
    if !scheme_ok || !host_ok {
        return Err(format!(
            "`{}` is not an origin: an origin is scheme://host[:port], with no path, query, \
             user or wildcard, like https://app.example.com",
            shown(text)
        ));
    }
    Ok(origin)
}

/// `text` as an error quotes it: no control characters, at most 200.
fn shown(text: &str) -> String {
    text.chars()
        .filter(|c| !settle_stream::hides(*c))
        .take(200)
        .collect()
}

impl Origins {
    /// Allows `origin` (`https://app.example.com`, `http://localhost:3000`);
    /// one [`parse_origin`] refuses is not allowed, and said so in the log
    /// (it would never match, or, for `null`, match every page).
    pub fn allow(&mut self, origin: &str) {
        let origin = match parse_origin(origin) {
            Ok(origin) => origin,
            Err(why) => {
                tracing::warn!("an origin was not allowed: {why}");
                return;
            }
        };
        if !self.allowed.contains(&origin) {
            self.allowed.push(origin);
        }
    }

    /// The origin of a request to refuse, if it has one not listed.
    pub fn refused(&self, headers: &HeaderMap) -> Option<String> {
        let origin = headers.get(ORIGIN)?;
        let shown = String::from_utf8_lossy(origin.as_bytes());
        let allowed = self
            .allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(origin.as_bytes()));
        (!allowed).then(|| {
            shown
                .chars()
                .filter(|c| !settle_stream::hides(*c))
                .take(200)
                .collect()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn from(origin: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ORIGIN, HeaderValue::from_str(origin).unwrap());
        headers
    }

    #[test]
    fn only_listed_origins_pass_and_no_origin_is_a_non_browser_client() {
        let mut origins = Origins::default();
        assert_eq!(origins.refused(&HeaderMap::new()), None);
        assert_eq!(
            origins.refused(&from("http://evil.example")).as_deref(),
            Some("http://evil.example")
        );
        origins.allow("https://App.example.com/");
        assert_eq!(origins.refused(&from("https://app.example.com")), None);
        assert!(origins
            .refused(&from("https://app.example.com.evil"))
            .is_some());
        assert!(origins.refused(&from("null")).is_some());
        // Allowing `null` would let any sandboxed page in: it is not.
        origins.allow("null");
        assert!(origins.refused(&from("null")).is_some());
    }

    #[test]
    fn an_origin_is_a_scheme_and_a_host_and_nothing_else() {
        for good in [
            "http://localhost:3000",
            "https://a.example/",
            "chrome-extension://abc",
        ] {
            assert!(parse_origin(good).is_ok(), "{good}");
        }
        for bad in [
            "null",
            "NULL",
            "*",
            "",
            "a.example",
            "https://a.example/app",
            "https://a.example?x=1",
            "https://user@a.example",
            "https://*.example",
            "://a.example",
            "1http://a.example",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
