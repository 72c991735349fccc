//! Keeping a provider's secrets out of its errors. A provider's failure
//! becomes a turn's error, which the gateway sends to its clients and the
//! store keeps, so what it says of the request names the URL as
//! [`shown_url`] shows it (no password, no query value), and the start of an
//! error body a server sent back is [`Secrets::scrub`]bed of the API key, the
//! extra headers' values and the URL's password and query values, which a
//! server may echo (a 401 quoting the `Authorization` it refused).

use std::borrow::Cow;

use crate::OpenAiConfig;

/// What a masked secret reads as.
const MASK: &str = "***";

/// Secrets shorter than this are not scrubbed out of text: a one- or
/// two-character value would take every such letter out of a message.
const SHORTEST_SCRUBBED: usize = 4;

/// A URL as messages name it: `http://user:secret@host/v1?api-key=k` →
/// `http://user:***@host/v1?api-key=***`.
/// A URL that does not parse loses everything between its scheme and its
/// last `@` (or everything up to it, without a scheme), and its whole
/// query.
pub fn shown_url(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        return masked_text(url);
    };
    if parsed.password().is_some() && parsed.set_password(Some(MASK)).is_err() {
        return masked_text(url);
    }
    if parsed.query().is_some() {
        let names: Vec<String> = parsed.query_pairs().map(|(k, _)| k.into_owned()).collect();
        parsed
            .query_pairs_mut()
            .clear()
            .extend_pairs(names.iter().map(|name| (name.as_str(), MASK)));
    }
    parsed.to_string()
}

/// [`shown_url`] for text that is not a URL.
fn masked_text(url: &str) -> String {
    let (head, had_query) = match url.split_once('?') {
        Some((head, _)) => (head, true),
        None => (url, false),
    };
    let head = match head.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{MASK}@{host}"),
            None => head.to_owned(),
        },
        None => match head.rsplit_once('@') {
            Some((_, host)) => format!("{MASK}@{host}"),
            None => head.to_owned(),
        },
    };
    match had_query {
        true => format!("{head}?{MASK}"),
        false => head,
    }
}

/// The secret values of a provider's config, longest first.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// The API key, the extra headers' and query parameters' values, and the
    /// base URL's password and query values, as given and percent-decoded.
    pub fn of(config: &OpenAiConfig) -> Self {
        let mut found: Vec<String> = Vec::new();
        found.extend(config.api_key.iter().cloned());
        found.extend(config.headers.iter().map(|(_, value)| value.clone()));
        found.extend(config.query.iter().map(|(_, value)| value.clone()));
        if let Ok(url) = reqwest::Url::parse(&config.base_url) {
            if let Some(password) = url.password() {
                found.push(password.to_owned());
                found.extend(decoded(password));
            }
            for (_, value) in url.query_pairs() {
                found.push(value.into_owned());
            }
            if let Some(query) = url.query() {
                found.extend(
                    query
                        .split('&')
                        .filter_map(|p| p.split_once('='))
                        .map(|(_, v)| v.to_owned()),
                );
            }
        }
        // As a URL or a form would carry them: percent-encoded, with
        // upper- or lower-case hex.
        let encoded: Vec<String> = found.iter().flat_map(|s| encoded(s)).collect();
        found.extend(encoded);
        found.retain(|s| s.chars().count() >= SHORTEST_SCRUBBED);
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found.dedup();
        Secrets(found)
    }

    /// The start of an error body as a status error keeps it: the body
    /// itself, its secrets masked, when what it says once decoded shows
    /// none either (so a caller can still read its JSON); else what it says
    /// ([`shown`](Self::shown)). `cut`: the body was read only in part.
    pub fn kept(&self, body: &str, cut: bool) -> String {
        let raw = self.masked(self.scrub(body), cut);
        let said = crate::error::said(&raw);
        match self.masked(self.scrub(&said), cut) == said {
            true => raw,
            false => self.shown(body, cut),
        }
    }

    /// `text`, and when `cut`, without the start of a secret at its end.
    fn masked(&self, text: String, cut: bool) -> String {
        match cut {
            true => self.mask_cut(text),
            false => text,
        }
    }

    /// What an error body says, as messages quote it (decoded, then
    /// shortened: [`excerpt`](crate::error::excerpt)), with no secret in
    /// it: scrubbed once decoded, since a server's JSON may write the key
    /// in escapes; and, when `cut` (the body was read only in part), with
    /// no start of a secret at its end either. A status error quotes its
    /// body through `excerpt` again, so only text that reads the same
    /// through it is kept.
    pub fn shown(&self, body: &str, cut: bool) -> String {
        let said = self.masked(self.scrub(&crate::error::said(body)), cut);
        let mut shown = crate::error::shorten(&said);
        for _ in 0..4 {
            let again = self.scrub(&crate::error::excerpt(&shown));
            if again == shown {
                return shown;
            }
            shown = again;
        }
        "(not quoted: it could not be told apart from the provider's secrets)".to_owned()
    }

    /// `text` cut where a body's read stopped, without the start of a
    /// secret it may end with (the rest of it was never read).
    fn mask_cut(&self, mut text: String) -> String {
        for secret in &self.0 {
            let starts: Vec<usize> = secret.char_indices().map(|(at, _)| at).skip(1).collect();
            let longest = starts
                .into_iter()
                .rev()
                .find(|&at| text.ends_with(&secret[..at]));
            if let Some(at) = longest {
                text.truncate(text.len() - at);
                text.push_str(MASK);
                return text;
            }
        }
        text
    }

    /// `text` with every secret masked.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = Cow::Borrowed(text);
        for secret in &self.0 {
            if text.contains(secret.as_str()) {
                text = Cow::Owned(text.replace(secret.as_str(), MASK));
            }
        }
        text.into_owned()
    }
}

/// `value` percent-encoded (every byte but letters and digits), in upper-
/// and lower-case hex, when that changes it.
fn encoded(value: &str) -> Vec<String> {
    let upper = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    if upper == value {
        return Vec::new();
    }
    // Only the hex digits after a `%` change case.
    let mut lower = String::with_capacity(upper.len());
    let mut left = 0;
    for c in upper.chars() {
        match c {
            '%' => {
                left = 2;
                lower.push(c);
            }
            _ if left > 0 => {
                left -= 1;
                lower.push(c.to_ascii_lowercase());
            }
            _ => lower.push(c),
        }
    }
    match lower == upper {
        true => vec![upper],
        false => vec![upper, lower],
    }
}

/// A percent-encoded value decoded, when that changes it.
fn decoded(value: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .ok()?;
    (decoded != value).then(|| decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password_or_query_values() {
        assert_eq!(
            shown_url("http://op:pw@h:8/v1/chat/completions?api-key=k&v=2"),
            "http://op:***@h:8/v1/chat/completions?api-key=***&v=***"
        );
        assert_eq!(shown_url("http://h/v1"), "http://h/v1");
        assert_eq!(shown_url("not a url op:pw@h?k=v"), "***@h?***");
        assert_eq!(shown_url("ht tp://op:pw@h/v1?k=v"), "ht tp://***@h/v1?***");
    }

    #[test]
    fn every_form_of_a_secret_is_scrubbed_and_short_values_are_left() {
        let mut config = OpenAiConfig::new("http://op:p%40ssword@h/v1?key=abcd1234&v=1", "m");
        config.api_key = Some("sk-0123".to_owned());
        let secrets = Secrets::of(&config);
        assert_eq!(
            secrets.scrub("sk-0123 p@ssword p%40ssword abcd1234 v=1"),
            "*** *** *** *** v=1"
        );
    }
}
