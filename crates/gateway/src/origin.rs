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

impl Origins {
    /// Allows `origin` (`https://app.example.com`, `http://localhost:3000`).
    pub fn allow(&mut self, origin: &str) {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
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
                .filter(|c| !c.is_control())
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
    }
}
