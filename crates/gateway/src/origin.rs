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
/// drive the gateway), `*`, a path, a query, user info, no `scheme://`, or
/// a port that is not a number from 1 to 65535 (none of which a browser's
/// `Origin` ever carries, so it would never match). The scheme's default
/// port (`https://a.example:443`), which a browser leaves out, is dropped.
///
/// ```
/// use settle_gateway::parse_origin;
///
/// assert_eq!(parse_origin("https://App.example.com/").unwrap(), "https://app.example.com");
/// assert!(parse_origin("null").is_err());
/// assert!(parse_origin("app.example.com").is_err());
/// assert_eq!(parse_origin("https://app.example.com:443").unwrap(), "https://app.example.com");
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
    // A port is a number a browser can send: 1 to 65535, and never its
    // scheme's default, which a browser leaves out (so it is dropped here).
    let (name, port) = split_port(host);
    let Some(port) = port else {
        return Ok(origin);
    };
    match port.parse::<u16>() {
        Ok(port) if port > 0 && Some(port) == default_port(scheme) => {
            Ok(format!("{scheme}://{name}"))
        }
        Ok(port) if port > 0 => Ok(origin),
        _ => Err(format!(
            "`{}` is not an origin: its port is not a number from 1 to 65535",
            shown(text)
        )),
    }
}

/// A host and its port (`[::1]:8080` → `[::1]`, `8080`; `a.example` → no
/// port).
fn split_port(host: &str) -> (&str, Option<&str>) {
    let after_address = match host.starts_with('[') {
        true => host.find(']').map_or(host.len(), |end| end + 1),
        false => 0,
    };
    match host[after_address..].rfind(':') {
        Some(colon) => {
            let colon = after_address + colon;
            (&host[..colon], Some(&host[colon + 1..]))
        }
        None => (host, None),
    }
}

/// The port a browser leaves out of an origin of `scheme`.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
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

    /// The origin of a request to refuse, if it has one not listed. A
    /// request with several `Origin` headers (a browser sends one; a proxy
    /// may add its own) is refused whatever they say: which one the page
    /// sent cannot be told.
    pub fn refused(&self, headers: &HeaderMap) -> Option<String> {
        let mut all = headers.get_all(ORIGIN).iter();
        let origin = all.next()?;
        let said = shown(&String::from_utf8_lossy(origin.as_bytes()));
        if all.next().is_some() {
            return Some(format!("{said} (one of several Origin headers)"));
        }
        let allowed = self
            .allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(origin.as_bytes()));
        (!allowed).then_some(said)
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

    /// Found from outside: with a second `Origin` header after a listed
    /// one, the upgrade was let through, only the first being read.
    #[test]
    fn a_request_with_two_origins_is_refused_whatever_they_say() {
        let mut origins = Origins::default();
        origins.allow("http://localhost:3000");
        for pair in [
            ["http://localhost:3000", "https://evil.example"],
            ["https://evil.example", "http://localhost:3000"],
            ["http://localhost:3000", "http://localhost:3000"],
        ] {
            let mut headers = HeaderMap::new();
            for origin in pair {
                headers.append(ORIGIN, HeaderValue::from_str(origin).unwrap());
            }
            assert!(origins.refused(&headers).is_some(), "{pair:?}");
        }
        assert_eq!(origins.refused(&from("http://localhost:3000")), None);
    }

    /// Found from outside: `https://d.example:443` was taken and never
    /// matched (a browser leaves the default port out), and a port past
    /// 65535 was taken too.
    #[test]
    fn a_default_port_is_dropped_and_a_port_no_browser_can_send_is_refused() {
        assert_eq!(
            parse_origin("https://D.example:443").unwrap(),
            "https://d.example"
        );
        assert_eq!(
            parse_origin("http://a.example:80/").unwrap(),
            "http://a.example"
        );
        assert_eq!(
            parse_origin("http://a.example:443").unwrap(),
            "http://a.example:443"
        );
        assert_eq!(parse_origin("http://[::1]:80").unwrap(), "http://[::1]");
        assert_eq!(
            parse_origin("http://[::1]:8080").unwrap(),
            "http://[::1]:8080"
        );
        assert_eq!(parse_origin("http://[::1]").unwrap(), "http://[::1]");
        for bad in [
            "https://b.example:99999",
            "https://b.example:0",
            "https://b.example:",
            "https://b.example:8o",
            "http://[::1]:65536",
        ] {
            let why = parse_origin(bad).unwrap_err();
            assert!(why.contains("port"), "{bad}: {why}");
        }
        let mut origins = Origins::default();
        origins.allow("https://d.example:443");
        assert_eq!(origins.refused(&from("https://d.example")), None);
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
