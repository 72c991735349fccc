//! Keeping a PostgreSQL URL's password out of every message.
//!
//! A URL is named in messages as [`redact`] shows it. What the client
//! library says about a URL it could not use may quote the URL back, or the
//! part of it it misread as a host; [`scrub`] takes out of such a message
//! the URL as given and every form of its password, before the message is
//! kept in an error.

/// What a masked password reads as.
const MASK: &str = "***";

/// `postgres://user:secret@host/db?password=secret` →
/// `postgres://user:***@host/db?password=***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = authority_end(rest);
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:{MASK}@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{}", redact_query(tail))
}

/// Where the authority of `rest` (a URL after its `://`) ends: at its
/// first `/`, as a URL parser reads it; or, when an `@` comes after that
/// `/` before the query, past the path segment that `@` is in: a password
/// with an unencoded `/` (as base64 ones have) puts the end of the user
/// info there, and all of it up to that `@` is masked.
fn authority_end(rest: &str) -> usize {
    let slash = rest.find('/').unwrap_or(rest.len());
    let before_query = rest.find('?').unwrap_or(rest.len());
    match rest[..before_query].rfind('@') {
        Some(at) if at > slash => rest[at..].find('/').map_or(rest.len(), |i| at + i),
        _ => slash,
    }
}

/// The path and query of a URL with the value of every `password`
/// parameter masked.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if is_password_key(key) => format!("{key}={MASK}"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

fn is_password_key(key: &str) -> bool {
    percent_decode(key).eq_ignore_ascii_case("password")
}

/// Every way the password of `url` may be spelled in a message: as given
/// and percent-decoded, read up to the last `@` of the authority (as
/// [`redact`] reads it) or to the first (as libpq does), each `@`-separated
/// piece of it (libpq may take a piece for the host), and the value of any
/// `password` parameter. Longest first, so that a longer form is masked
/// whole before a piece of it.
fn secrets(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Some((_, rest)) = url.split_once("://") else {
        return found;
    };
    let authority_end = authority_end(rest);
    let authority = &rest[..authority_end];
    let mut raw = Vec::new();
    for userinfo in [
        authority.rsplit_once('@').map(|(u, _)| u),
        authority.split_once('@').map(|(u, _)| u),
    ]
    .into_iter()
    .flatten()
    {
        if let Some((_, password)) = userinfo.split_once(':') {
            raw.push(password.to_owned());
            // The pieces libpq may take for a host, a port or a path.
            raw.extend(password.split(['@', ':', '/']).map(str::to_owned));
        }
    }
    if let Some((_, query)) = rest[authority_end..].split_once('?') {
        for param in query.split('&') {
            if let Some((key, value)) = param.split_once('=') {
                if is_password_key(key) {
                    raw.push(value.to_owned());
                }
            }
        }
    }
    for secret in raw {
        let decoded = percent_decode(&secret);
        found.push(secret);
        found.push(decoded);
    }
    found.retain(|s| !s.is_empty());
    found.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    found.dedup();
    found
}

/// `message` with `url` (as given, and as `sent` to the client library)
/// replaced by its redacted form, and every spelling of its password masked.
pub(crate) fn scrub(message: &str, url: &str, sent: &str) -> String {
    let shown = redact(url);
    let mut message = message.replace(sent, &shown);
    if url != shown {
        message = message.replace(url, &shown);
    }
    for secret in secrets(url) {
        if secret != MASK {
            message = message.replace(&secret, MASK);
        }
    }
    message
}

/// `%XX` escapes decoded; anything that is not one, or decodes to
/// something that is not UTF-8, is kept as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                // Two hex digits: at most 255.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redacted_url_keeps_everything_but_the_password() {
        assert_eq!(
            redact("postgres://u:pw@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://u:p@w@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=off&password=pw&Password=x"),
            "postgres://u@h/db?sslmode=off&password=***&Password=***"
        );
        assert_eq!(
            redact("postgresql://u:pw@[::1/db"),
            "postgresql://u:***@[::1/db"
        );
        assert_eq!(redact("settle.db"), "settle.db");
    }

    #[test]
    fn a_scrubbed_message_has_no_spelling_of_the_password() {
        let url = "postgres://u:SE%43RET@PW@h/db?password=QP";
        let sent = format!("{url}&connect_timeout=10");
        let message =
            format!("bad URI: \"{sent}\"; also {url}; host \"PW@h\"; SECRET, SE%43RET, QP");
        let clean = scrub(&message, url, &sent);
        for secret in ["SECRET", "SE%43RET", "QP", "PW@"] {
            assert!(!clean.contains(secret), "{secret} in {clean}");
        }
        assert!(
            clean.contains("postgres://u:***@h/db?password=***"),
            "{clean}"
        );
    }

    #[test]
    fn a_password_with_an_unencoded_slash_or_colon_is_masked_whole() {
        // A `/` ends the authority where a URL parser reads it: the `@`
        // after it is taken as the end of the user info all the same.
        let url = "postgres://u:Pa/TailSecret3@h:5/db";
        assert_eq!(redact(url), "postgres://u:***@h:5/db");
        let clean = scrub(&format!("invalid URL {url}"), url, url);
        assert!(!clean.contains("TailSecret3"), "{clean}");
        // libpq reads `u:Pa` as a host and its port.
        let said = "invalid integer value \"Pa\" for connection option \"port\"";
        assert!(!scrub(said, url, url).contains("\"Pa\""));
        // libpq reads `u:Pa@ss:TailSecret2@h` as host `ss` and port
        // `TailSecret2@h`, and says so.
        let url = "postgres://u:Pa@ss:TailSecret2@h:5/db";
        let said = "invalid integer value \"TailSecret2@h:5\" for connection option \"port\"";
        let clean = scrub(said, url, url);
        assert!(!clean.contains("TailSecret2"), "{clean}");
    }

    #[test]
    fn percent_escapes_decode_and_bad_ones_stay() {
        assert_eq!(percent_decode("a%40b"), "a@b");
        assert_eq!(percent_decode("a%4"), "a%4");
        assert_eq!(percent_decode("%zz%"), "%zz%");
        assert_eq!(percent_decode("%ff"), "%ff");
    }
}
