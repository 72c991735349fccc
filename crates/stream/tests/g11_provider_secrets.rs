//! No provider error shows a secret: the base URL's password and query
//! values, the API key and the extra headers' values are kept out of every
//! message an OpenAI-compatible provider's failure makes (a client of the
//! gateway reads these messages, and the store keeps them), even when the
//! server echoes them back; and a base URL with a query string still sends
//! to `…/chat/completions` with its query kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::error::Error as _;

use settle_stream::{OpenAiConfig, OpenAiProvider, Provider, Request, StreamError};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

#[path = "support/http.rs"]
#[allow(dead_code)]
mod http;

const PASSWORD: &str = "hunter2-pass";
const KEY: &str = "sk-secret-key-0123";
const QUERY_KEY: &str = "query-key-4567";
const HEADER: &str = "header-value-89ab";

/// Every line an error gives: its message and its sources'.
fn told(error: &StreamError) -> String {
    let mut all = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        all.push_str(" / ");
        all.push_str(&e.to_string());
        next = e.source();
    }
    all.push_str(&format!(" / {error:?}"));
    all
}

fn assert_no_secret(text: &str) {
    for secret in [PASSWORD, KEY, QUERY_KEY, HEADER] {
        assert!(!text.contains(secret), "{secret} shown in: {text}");
    }
}

/// A config of `base_url` with every kind of secret: the key as the API
/// key, or, when the URL carries credentials (which an API key may not
/// join: both would be sent as `Authorization`), as an extra header.
fn config(base_url: &str) -> OpenAiConfig {
    let mut config = OpenAiConfig::new(base_url, "m");
    match base_url.contains('@') {
        false => config.api_key = Some(KEY.to_owned()),
        true => config
            .headers
            .push(("x-api-key".to_owned(), KEY.to_owned())),
    }
    config
        .headers
        .push(("x-routing".to_owned(), HEADER.to_owned()));
    config
}

async fn open_error(provider: &OpenAiProvider) -> StreamError {
    match provider.open(&Request::prompt("hi")).await {
        Err(error) => error,
        Ok(_) => panic!("the request opened a stream"),
    }
}

#[tokio::test]
async fn g11_a_status_error_names_the_url_without_its_password_or_query_values() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A server that echoes what it was sent, headers included, in its 401.
    let connection = http::serve_one(listener, |mut wr| async move {
        let body = format!(
            "{{\"error\":\"bad credentials: Bearer {KEY}, x-routing {HEADER}, \
             user operator:{PASSWORD}, api-key={QUERY_KEY}\"}}"
        );
        let response = format!(
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        wr.write_all(response.as_bytes()).await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    let base = format!("http://operator:{PASSWORD}@{addr}/v1?api-key={QUERY_KEY}");
    let provider = OpenAiProvider::new(config(&base)).unwrap();
    let error = open_error(&provider).await;
    let text = told(&error);
    assert!(text.contains("401"), "{text}");
    assert!(text.contains(&addr.to_string()), "the URL is named: {text}");
    assert_no_secret(&text);
    // The request went to the path with the query kept after it.
    let request = connection.request.await.unwrap();
    let line = request.lines().next().unwrap();
    assert_eq!(
        line,
        format!("POST /v1/chat/completions?api-key={QUERY_KEY} HTTP/1.1")
    );
}

#[tokio::test]
async fn g11_a_connect_error_names_the_url_without_its_password() {
    // A port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let base = format!("http://operator:{PASSWORD}@{addr}/v1?api-key={QUERY_KEY}");
    let provider = OpenAiProvider::new(config(&base)).unwrap();
    let error = open_error(&provider).await;
    let text = told(&error);
    assert!(text.contains(&addr.to_string()), "the URL is named: {text}");
    assert_no_secret(&text);
}

#[test]
fn g11_a_base_url_with_credentials_and_an_api_key_too_is_refused() {
    // The client would send both as `Authorization` (`Basic` and
    // `Bearer`), and the server take either.
    let mut config = OpenAiConfig::new(format!("http://operator:{PASSWORD}@127.0.0.1/v1"), "m");
    config.api_key = Some(KEY.to_owned());
    let error = OpenAiProvider::new(config).unwrap_err();
    let text = told(&error);
    assert!(text.contains("credentials"), "{text}");
    assert_no_secret(&text);
}

#[test]
fn g11_an_invalid_base_url_is_refused_without_showing_its_password() {
    let base = format!("ftp://operator:{PASSWORD}@127.0.0.1/v1?api-key={QUERY_KEY}");
    let error = OpenAiProvider::new(config(&base)).unwrap_err();
    let text = told(&error);
    assert!(text.contains("ftp"), "{text}");
    assert_no_secret(&text);
}

/// The error a reply streaming `event` fails with.
async fn streamed_error(event: String) -> StreamError {
    use futures_util::StreamExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _connection = http::serve_one(listener, move |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        wr.write_all(&http::chunked(&format!("data: {event}\n\n")))
            .await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    let base = format!("http://operator:{PASSWORD}@{addr}/v1?api-key={QUERY_KEY}");
    let provider = OpenAiProvider::new(config(&base)).unwrap();
    let mut stream = provider.open(&Request::prompt("hi")).await.unwrap();
    loop {
        match stream.next().await {
            Some(Err(error)) => return error,
            Some(Ok(_)) => continue,
            None => panic!("the stream ended without its error"),
        }
    }
}

#[tokio::test]
async fn g11_an_error_inside_the_stream_does_not_show_a_secret_the_server_echoed() {
    let echoed = format!("Bearer {KEY} {HEADER} operator:{PASSWORD} api-key={QUERY_KEY}");
    let cases = [
        format!("{{\"error\":{{\"message\":\"refused: {echoed}\"}}}}"),
        format!("{{\"error\":{{\"code\":\"{echoed}\"}}}}"),
        format!("not json {echoed}"),
    ];
    for event in cases {
        let error = streamed_error(event.clone()).await;
        let text = told(&error);
        assert!(text.contains("***"), "{event}: {text}");
        assert_no_secret(&text);
    }
}

/// `text` with every character written as a JSON `\u` escape.
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect()
}

/// The error of a turn whose server answers 401 with `body`.
async fn status_error(body: String) -> StreamError {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let json = "content-type: application/json\r\n";
    let _connection = http::answer_once(listener, "401 Unauthorized", json, &body);
    let provider = OpenAiProvider::new(config(&format!("http://{addr}/v1"))).unwrap();
    open_error(&provider).await
}

/// What the server echoes is shown once decoded (a JSON body's escapes,
/// a body too long to read whole), so it is scrubbed once decoded; and a
/// secret the read of the body cut in two shows no part of itself.
#[tokio::test]
async fn g11_a_secret_a_status_body_escapes_or_cuts_in_two_is_not_shown() {
    let key = escaped(&format!("Bearer {KEY}"));
    let long = "x".repeat(4000);
    let cases = [
        // The whole body JSON, the key written in escapes.
        format!("{{\"error\":{{\"message\":\"invalid key: {key}\"}}}}"),
        // Too long to be read whole: not JSON once cut, escapes and all.
        format!("{{\"error\":{{\"message\":\"invalid key: {key} {long}\"}}}}"),
    ];
    for body in cases {
        let text = told(&status_error(body.clone()).await);
        assert!(text.contains("401"), "{text}");
        assert!(text.contains("***"), "{text}");
        assert_no_secret(&text);
        assert!(
            !text.contains("\\u0073\\u006b"),
            "escaped and shown: {text}"
        );
    }
    // A key where the read of the body stops: none of it is shown.
    for pad in [2030, 2033, 2036, 2040, 2046] {
        let body = format!("{}Bearer {KEY}", " ".repeat(pad));
        let text = told(&status_error(body).await);
        for cut in 4..KEY.len() {
            assert!(
                !text.contains(&KEY[..cut]),
                "{pad}: {} shown in: {text}",
                &KEY[..cut]
            );
        }
    }
}

#[tokio::test]
async fn g11_a_secret_escaped_in_an_event_that_is_not_json_is_not_shown() {
    let key = escaped(KEY);
    let error = streamed_error(format!("{{\"broken\": \"{key}\"")).await;
    let text = told(&error);
    assert_no_secret(&text);
    assert!(
        !text.contains("\\u0073\\u006b"),
        "escaped and shown: {text}"
    );
}

/// A redirect's `Location` is quoted in the turn's error: what it carries
/// of a secret (in its path, its fragment, percent-encoded) is masked as
/// in a body.
#[tokio::test]
async fn g11_a_redirect_that_carries_a_secret_in_its_location_does_not_show_it() {
    let encoded = KEY.replace('-', "%2D");
    for location in [
        format!("http://h/k/{KEY}/chat"),
        format!("http://h/v1#frag={KEY}"),
        format!("http://h/k/{encoded}/chat"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let header = format!("location: {location}\r\n");
        let _connection = http::answer_once(listener, "307 Temporary Redirect", &header, "");
        let provider = OpenAiProvider::new(config(&format!("http://{addr}/v1"))).unwrap();
        let text = told(&open_error(&provider).await);
        assert!(text.contains("redirected"), "{text}");
        assert_no_secret(&text);
        assert!(!text.contains(&encoded), "{location}: {text}");
    }
}

/// A body that echoes the key percent-encoded shows it masked too.
#[tokio::test]
async fn g11_a_secret_a_status_body_percent_encodes_is_not_shown() {
    let encoded = KEY.replace('-', "%2D");
    let text = told(&status_error(format!("{{\"error\":\"bad key {encoded}\"}}")).await);
    assert!(!text.contains(&encoded), "{text}");
    assert!(text.contains("***"), "{text}");
}

/// Found from outside: a 200 whose `Content-Type` is not an event stream
/// is named in the turn's error, and a server that echoed the key into
/// that header showed it there.
#[tokio::test]
async fn g11_a_content_type_that_echoes_a_secret_does_not_show_it() {
    use futures_util::StreamExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let header = format!("content-type: text/html; charset={KEY}\r\n");
    let _connection = http::answer_once(listener, "200 OK", &header, "<html></html>");
    let provider = OpenAiProvider::new(config(&format!("http://{addr}/v1"))).unwrap();
    let mut stream = provider.open(&Request::prompt("hi")).await.unwrap();
    let error = loop {
        match stream.next().await {
            Some(Err(error)) => break error,
            Some(Ok(_)) => continue,
            None => panic!("the stream ended without its error"),
        }
    };
    let text = told(&error);
    assert!(text.contains("not an event stream"), "{text}");
    assert!(text.contains("text/html; charset=***"), "{text}");
    assert_no_secret(&text);
}
