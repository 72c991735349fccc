//! `settle serve` facing a network: a half-sent request and a slowloris
//! client do not hold it (G9's exit bound, the header timeout).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gateway_support::connect;
use nix::sys::signal::Signal;
use serde_json::json;
use settle_tests::{Running, Sandbox, PATIENCE};

/// Starts `settle serve` on a free port with a one-reply script book; its address.
fn serve(sandbox: &Sandbox, extra: &[&str]) -> (Running, String) {
    let book = sandbox
        .write("book.toml", "[default]\nchunks = [\"ok\"]\n")
        .to_string_lossy()
        .into_owned();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--scripted", &book];
    args.extend_from_slice(extra);
    let mut serving = sandbox.spawn(&args);
    serving.wait_for("the listening line", |out| out.contains("/ws\n"));
    let line = serving
        .output()
        .lines()
        .find(|l| l.contains("listening on "))
        .unwrap()
        .to_owned();
    let addr = line
        .split("://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/ws")
        .to_owned();
    (serving, addr)
}

/// Whether the server has closed `stream` (a read gives end of file or a
/// reset), waiting at most `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    while start.elapsed() < limit {
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_half_sent_request_does_not_hold_the_gateway_past_sigterm() {
    let sandbox = Sandbox::new();
    // The header timeout is far longer than the exit bound: only the
    // shutdown may end this connection in time.
    let (mut serving, addr) = serve(
        &sandbox,
        &["--drain-timeout", "1s", "--header-timeout", "5m"],
    );
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\n").unwrap();
    // A connection that sent nothing at all, and a WebSocket client, too.
    let _silent = TcpStream::connect(&addr).unwrap();
    let mut client = connect(&addr).await;
    client.ok("sessions.list", json!({})).await;
    std::thread::sleep(Duration::from_millis(200));

    let start = Instant::now();
    serving.signal(Signal::SIGTERM);
    // Drain 1 s + settle timeout 1 s + flush budget and margin.
    let status = serving
        .exited_within(Duration::from_secs(6))
        .unwrap_or_else(|| panic!("still running {:?} after SIGTERM", start.elapsed()));
    assert_eq!(status.code(), Some(143), "{}", serving.stderr_text());
    assert!(closed_within(&mut half, Duration::from_secs(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_dropped_after_the_header_timeout() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &["--header-timeout", "1s"]);
    let request = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut slow: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let start = Instant::now();
    let mut dropped = vec![None; slow.len()];
    // One byte every 50 ms on each connection, never the end of the head:
    // a trickle does not hold the connection past the timeout.
    'trickle: for byte in request.iter().cycle() {
        for (i, stream) in slow.iter_mut().enumerate() {
            if dropped[i].is_none() && stream.write_all(&[*byte]).is_err() {
                dropped[i] = Some(start.elapsed());
            }
        }
        if dropped.iter().all(Option::is_some) || start.elapsed() > Duration::from_secs(10) {
            break 'trickle;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, stream) in slow.iter_mut().enumerate() {
        if dropped[i].is_none() && closed_within(stream, Duration::from_millis(200)) {
            dropped[i] = Some(start.elapsed());
        }
    }
    for (i, when) in dropped.iter().enumerate() {
        let when = when.unwrap_or_else(|| panic!("connection {i} still open after 10 s"));
        assert!(
            when >= Duration::from_millis(900),
            "dropped too early: {when:?}"
        );
        assert!(when < Duration::from_secs(5), "dropped late: {when:?}");
    }
    // The gateway still serves.
    let mut client = connect(&addr).await;
    client.ok("sessions.list", json!({})).await;
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let stderr = serving.stderr_text();
    assert!(
        stderr.contains("header"),
        "no line about the dropped connections: {stderr}"
    );
}
