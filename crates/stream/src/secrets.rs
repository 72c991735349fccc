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

/// The shortest piece of a key masked where a server echoes it changed
/// (cut short, or with its last characters starred): long enough that no
/// text of a message matches a key's piece by chance.
const SHORTEST_PIECE: usize = 12;

/// The secret values of a provider's config, longest first, and its keys
/// (the API key, the base URL's password or lone user): credentials a
/// server may echo in part, whose pieces are masked too.
#[derive(Clone, Default)]
pub(crate) struct Secrets {
    all: Vec<String>,
    keys: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.all.len())
    }
}

impl Secrets {
    /// The API key, the extra headers' and query parameters' values, and the
    /// base URL's password and query values, as given and percent-decoded,
    /// and its `user:password` as the `Basic` credential the client sends
    /// (a user without a password is a key, scrubbed as itself too).
    pub fn of(config: &OpenAiConfig) -> Self {
        let mut found: Vec<String> = Vec::new();
        let mut keys: Vec<String> = config.api_key.iter().cloned().collect();
        found.extend(config.api_key.iter().cloned());
        found.extend(config.headers.iter().map(|(_, value)| value.clone()));
        found.extend(config.query.iter().map(|(_, value)| value.clone()));
        if let Ok(url) = reqwest::Url::parse(&config.base_url) {
            if let Some(password) = url.password() {
                found.push(password.to_owned());
                found.extend(decoded(password));
                keys.push(decoded(password).unwrap_or_else(|| password.to_owned()));
            } else if !url.username().is_empty() {
                let user = url.username();
                keys.push(decoded(user).unwrap_or_else(|| user.to_owned()));
            }
            found.extend(basic_credential(&url));
            // The credential the client sends as `Basic`: a server may
            // echo it in part too.
            keys.extend(basic(&url));
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
        // Pieces are looked for in keys of ASCII only (what keys are): a
        // piece then never starts or ends inside a character.
        keys.retain(|k| k.is_ascii() && k.len() > SHORTEST_PIECE);
        keys.dedup();
        Secrets { all: found, keys }
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
        for secret in &self.all {
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

    /// `text` with every secret masked, in any case of its letters (a
    /// server may echo a key upper- or lower-cased), and every piece of a
    /// key at least [`SHORTEST_PIECE`] characters long (a key echoed cut
    /// short, or with its last characters starred).
    pub fn scrub(&self, text: &str) -> String {
        let mut text = Cow::Borrowed(text);
        for secret in &self.all {
            if let Some(scrubbed) = replaced(&text, secret) {
                text = Cow::Owned(scrubbed);
            }
        }
        for key in &self.keys {
            if let Some(scrubbed) = pieces_masked(&text, key) {
                text = Cow::Owned(scrubbed);
            }
        }
        text.into_owned()
    }
}

/// `text` with the API key `key` masked as `***`: wherever it occurs, in
/// any case of its letters, and each piece of it 12 characters or more
/// long (a key of ASCII characters), as a server may echo a key it
/// refused cut short or with its end starred. Short pieces (the last four
/// characters servers show) and text that merely shares a few letters with
/// it are left.
///
/// ```
/// let key = "sk-SECRETVALUE123";
/// assert_eq!(settle_stream::mask_key("bad key SK-secretValue123", key), "bad key ***");
/// assert_eq!(settle_stream::mask_key("bad key sk-SECRETVAL*****", key), "bad key ********");
/// assert_eq!(settle_stream::mask_key("bad key sk-...E123", key), "bad key sk-...E123");
/// ```
pub fn mask_key(text: &str, key: &str) -> String {
    let whole = replaced(text, key);
    let text = whole.as_deref().unwrap_or(text);
    match key.is_ascii() && key.len() > SHORTEST_PIECE {
        true => pieces_masked(text, key).unwrap_or_else(|| text.to_owned()),
        false => text.to_owned(),
    }
}

/// `text` with each occurrence of `secret`, in any case of its ASCII
/// letters, masked; `None` when it has none.
fn replaced(text: &str, secret: &str) -> Option<String> {
    if secret.is_empty() {
        return None;
    }
    // ASCII case folding keeps every byte where it was.
    let (folded, wanted) = (text.to_ascii_lowercase(), secret.to_ascii_lowercase());
    let runs: Vec<(usize, usize)> = folded
        .match_indices(wanted.as_str())
        .map(|(at, _)| (at, at + wanted.len()))
        .collect();
    masked_runs(text, &runs)
}

/// `text` with each of `runs` (byte ranges on character boundaries, in
/// order, apart) masked; `None` when there are none.
fn masked_runs(text: &str, runs: &[(usize, usize)]) -> Option<String> {
    if runs.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for &(start, end) in runs {
        out.push_str(&text[last..start]);
        out.push_str(MASK);
        last = end;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// `text` with every run of [`SHORTEST_PIECE`] characters or more that is
/// a piece of `key` (any case) masked; `None` when it has none. `key` is
/// ASCII, so every run found is ASCII, on character boundaries.
fn pieces_masked(text: &str, key: &str) -> Option<String> {
    let (folded, key) = (text.to_ascii_lowercase(), key.to_ascii_lowercase());
    let (t, k) = (folded.as_bytes(), key.as_bytes());
    // Where in the key each byte is: a piece starting at a text byte can
    // only start there (a body of megabytes is read once, not once per
    // place in the key).
    let mut places: Vec<Vec<usize>> = vec![Vec::new(); 256];
    for (at, byte) in k.iter().enumerate() {
        places[usize::from(*byte)].push(at);
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    while at + SHORTEST_PIECE <= t.len() {
        // The longest piece of the key that starts here.
        let longest = places[usize::from(t[at])]
            .iter()
            .map(|&from| {
                t[at..]
                    .iter()
                    .zip(&k[from..])
                    .take_while(|(a, b)| a == b)
                    .count()
            })
            .max()
            .unwrap_or(0);
        if longest >= SHORTEST_PIECE {
            runs.push((at, at + longest));
            at += longest;
        } else {
            at += 1;
        }
    }
    masked_runs(text, &runs)
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
    let user = url.username();
    let lone = match url.password() {
        None if !user.is_empty() => vec![user.to_owned()],
        _ => Vec::new(),
    };
    let lone_decoded = lone.iter().filter_map(|user| decoded(user));
    lone.iter()
        .cloned()
        .chain(lone_decoded)
        .chain(basic(url))
        .collect()
}

/// The `Basic` credential the client sends for a URL's `user:password@`
/// (or a lone user, a key): `base64(user:password)` of the decoded
/// values; `None` without either.
fn basic(url: &reqwest::Url) -> Option<String> {
    use base64::Engine as _;
    let user = url.username();
    if user.is_empty() && url.password().is_none() {
        return None;
    }
    let user = decoded(user).unwrap_or_else(|| user.to_owned());
    let password = url.password().unwrap_or("");
    let password = decoded(password).unwrap_or_else(|| password.to_owned());
    Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
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
    /// Found from outside: a server echoing the key it refused cut short,
    /// lower-cased, or with its end starred leaked it to every client and
    /// into the store; only the exact key was masked.
    #[test]
    fn a_key_echoed_in_another_case_or_in_part_is_masked() {
        let mut config = OpenAiConfig::new("http://h/v1", "m");
        config.api_key = Some("sk-SECRETVALUE123".to_owned());
        let secrets = Secrets::of(&config);
        assert_eq!(
            secrets.scrub(
                "prefix sk-SECRETVALUE12 lower sk-secretvalue123 upper SK-SECRETVALUE123 \
                 starred sk-SECRETVAL***** tail …ETVALUE123"
            ),
            "prefix *** lower *** upper *** starred ******** tail …ETVALUE123"
        );
        // Short pieces (a key's last four, as servers show them) and
        // words that share a few letters with it are left.
        assert_eq!(
            secrets.scrub("sk-...E123 a SECRET VALUE sk-SECRET"),
            "sk-...E123 a SECRET VALUE sk-SECRET"
        );
        // Text around a masked piece keeps its characters, however wide.
        assert_eq!(secrets.scrub("ключ sk-SECRETVALUE1 ✓"), "ключ *** ✓");
        // A password given in the base URL is a key too.
        let secrets = Secrets::of(&OpenAiConfig::new("http://u:Pw0123456789abcdef@h/v1", "m"));
        assert_eq!(secrets.scrub("pw was pw0123456789ab…"), "pw was ***…");
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

    #[test]
    fn a_basic_credential_echoed_in_part_is_masked() {
        use base64::Engine as _;
        let key = "sk-SECRETKEY1234567890abcd";
        for (url, plain) in [
            (format!("http://{key}@h/v1"), format!("{key}:")),
            (format!("http://user:{key}@h/v1"), format!("user:{key}")),
        ] {
            let secrets = Secrets::of(&OpenAiConfig::new(url, "m"));
            let basic = base64::engine::general_purpose::STANDARD.encode(plain);
            let echoed = format!(
                "cut {} starred {}****",
                &basic[..14],
                &basic[..basic.len() - 4]
            );
            let scrubbed = secrets.scrub(&echoed);
            for at in 0..=basic.len() - SHORTEST_PIECE {
                let piece = &basic[at..at + SHORTEST_PIECE];
                assert!(!scrubbed.contains(piece), "{piece} left in {scrubbed}");
            }
            assert!(scrubbed.starts_with("cut *** starred ***"), "{scrubbed}");
        }
    }
}
