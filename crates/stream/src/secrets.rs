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
    // A URL with no host (`user:pw@h/v1` without its `//`, a scheme
    // misspelled `htps:/…`) keeps any credentials in its path.
    let Some(mut parsed) = reqwest::Url::parse(url).ok().filter(|u| u.host().is_some()) else {
        return masked_text(url);
    };
    if parsed.password().is_some() && parsed.set_password(Some(MASK)).is_err() {
        return masked_text(url);
    }
    // A user without a password is a key (`https://KEY@host`).
    if parsed.password().is_none()
        && !parsed.username().is_empty()
        && parsed.set_username(MASK).is_err()
    {
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
    /// base URL's password and query values, as given and percent-decoded,
    /// and its `user:password` as the `Basic` credential the client sends
    /// (a user without a password is a key, scrubbed as itself too).
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
            found.extend(basic_credential(&url));
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
/// What the client sends for a URL's `user:password@`: the `Basic`
/// credential, `base64(user:password)` of the decoded values (a server may
/// echo the header it refused); and a user without a password, a key
/// (`https://KEY@host`), as given and decoded.
fn basic_credential(url: &reqwest::Url) -> Vec<String> {
    use base64::Engine as _;
    let user = url.username();
    let Some(password) = url.password() else {
        if user.is_empty() {
            return Vec::new();
        }
        let plain = decoded(user).unwrap_or_else(|| user.to_owned());
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{plain}:"));
        return [Some(user.to_owned()), decoded(user), Some(basic)]
            .into_iter()
            .flatten()
            .collect();
    };
    let user = decoded(user).unwrap_or_else(|| user.to_owned());
    let password = decoded(password).unwrap_or_else(|| password.to_owned());
    vec![base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))]
}

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
        // With no `//`, the credentials are in the path.
        assert_eq!(shown_url("user:PwSecret4@h:8080/v1"), "***@h:8080/v1");
        assert_eq!(shown_url("htps:/user:PwSecret5@h/v1"), "***@h/v1");
        // A user without a password is a token (`https://KEY@host`).
        assert_eq!(shown_url("http://sk-TokenAsUser@h/v1"), "http://***@h/v1");
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
    #[test]
    fn a_base_urls_credentials_are_scrubbed_as_the_basic_header_carries_them() {
        // What the client sends for `http://u:p%40ss-w0rd@h/v1`:
        // `Authorization: Basic base64("u:p@ss-w0rd")`, which a server may
        // echo in its error.
        let config = OpenAiConfig::new("http://u:p%40ss-w0rd@h/v1", "m");
        let secrets = Secrets::of(&config);
        let basic = "dTpwQHNzLXcwcmQ=";
        assert_eq!(
            secrets.scrub(&format!("Invalid API key: Basic {basic}")),
            "Invalid API key: Basic ***"
        );
        // A user alone is a token: scrubbed as itself and as its header.
        let config = OpenAiConfig::new("http://sk-TokenAsUser7777@h/v1", "m");
        let secrets = Secrets::of(&config);
        assert_eq!(
            secrets.scrub("sk-TokenAsUser7777 c2stVG9rZW5Bc1VzZXI3Nzc3Og=="),
            "*** ***"
        );
    }
}
