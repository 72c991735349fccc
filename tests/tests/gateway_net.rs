//! `settle serve` facing a network: a half-sent request and a slowloris
//! client do not hold it (G9's exit bound, the header timeout); bearer
//! tokens, and one principal's sessions out of another's reach; the Origin
//! allow-list; no open port without tokens; `wss://`; the limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_support::{connect, connect_as, connect_with, Client};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use settle_tests::{Running, Sandbox, PATIENCE};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789ab";

/// A token file for alice and bob; its path.
fn token_file(sandbox: &Sandbox) -> String {
    let text = format!("# who may connect\nalice {ALICE}\n\nbob {BOB}\n");
    sandbox
        .write("tokens", &text)
        .to_string_lossy()
        .into_owned()
}

/// A script book replying "ok" to everything, written into `sandbox`; its path.
fn ok_book(sandbox: &Sandbox) -> String {
    sandbox
        .write("book.toml", "[default]\nchunks = [\"ok\"]\n")
        .to_string_lossy()
        .into_owned()
}

/// Starts `settle serve` on a free port with a one-reply script book; its address.
fn serve(sandbox: &Sandbox, extra: &[&str]) -> (Running, String) {
    let book = ok_book(sandbox);
    let mut args = vec!["serve", "--scripted", &book];
    if !extra.contains(&"--listen") {
        args.extend_from_slice(&["--listen", "127.0.0.1:0"]);
    }
    args.extend_from_slice(extra);
    let mut serving = sandbox.spawn(&args);
    let addr = serving.listening_address();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_needs_a_known_bearer_token_and_is_refused_401_before_the_upgrade() {
    let sandbox = Sandbox::new();
    let tokens = token_file(&sandbox);
    let (mut serving, addr) = serve(&sandbox, &["--token-file", &tokens]);
    assert_eq!(connect_with(&addr, &[]).await.err(), Some(401));
    assert_eq!(
        connect_with(&addr, &[("authorization", "Bearer not-a-token-of-anyone")])
            .await
            .err(),
        Some(401)
    );
    assert_eq!(
        connect_with(&addr, &[("authorization", &format!("Basic {ALICE}"))])
            .await
            .err(),
        Some(401)
    );
    let mut alice = connect_as(&addr, ALICE).await;
    alice.ok("sessions.list", json!({})).await;
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let stderr = serving.stderr_text();
    assert!(stderr.contains("not authenticated"), "{stderr}");
    assert!(
        !stderr.contains(ALICE) && !stderr.contains("not-a-token"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_can_neither_see_attach_prompt_cancel_hold_nor_close_a_session() {
    let sandbox = Sandbox::new();
    let tokens = token_file(&sandbox);
    let (mut serving, addr) = serve(&sandbox, &["--token-file", &tokens]);
    let mut alice = connect_as(&addr, ALICE).await;
    let mut bob = connect_as(&addr, BOB).await;
    let hers = alice.ok("session.create", json!({ "name": "hers" })).await["id"]
        .as_u64()
        .unwrap();
    alice
        .ok("turn.start", json!({ "id": hers, "prompt": "hi" }))
        .await;
    assert_eq!(alice.turn(hers).await.0, ["ok"]);
    let his = bob.ok("session.create", json!({ "name": "his" })).await["id"]
        .as_u64()
        .unwrap();

    let ids = |page: &Value| -> Vec<u64> {
        assert_eq!(page["next_cursor"], Value::Null);
        page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids(&bob.ok("sessions.list", json!({})).await), [his]);
    assert_eq!(ids(&alice.ok("sessions.list", json!({})).await), [hers]);
    for (method, params) in [
        ("session.attach", json!({ "id": hers })),
        ("session.detach", json!({ "id": hers })),
        ("turn.start", json!({ "id": hers, "prompt": "mine now" })),
        ("turn.cancel", json!({ "id": hers })),
        ("session.hold", json!({ "id": hers, "hold": "input" })),
        ("session.release", json!({ "id": hers, "hold": "input" })),
        ("session.close", json!({ "id": hers })),
        ("session.create", json!({ "name": "child", "parent": hers })),
    ] {
        let error = bob.call(method, params.clone()).await.unwrap_err();
        assert_eq!(error["data"]["kind"], "not_found", "{method}: {error}");
        // The same answer as for a session that does not exist.
        let mut absent = params;
        absent["id"] = json!(9999);
        if method == "session.create" {
            absent = json!({ "name": "child", "parent": 9999 });
        }
        let other = bob.call(method, absent).await.unwrap_err();
        assert_eq!(
            error["message"]
                .as_str()
                .unwrap()
                .replace(&hers.to_string(), "N"),
            other["message"].as_str().unwrap().replace("9999", "N"),
            "{method}"
        );
    }
    // Untouched: alice's session is still hers, open, and takes turns; bob got no notification of it.
    alice
        .ok("turn.start", json!({ "id": hers, "prompt": "again" }))
        .await;
    assert_eq!(alice.turn(hers).await.0, ["ok"]);
    assert!(bob.held().is_empty(), "{:?}", bob.held());
    let end = alice.ok("session.close", json!({ "id": hers })).await;
    assert_eq!(end["end_reason"], "user_close");
    // Finalized, it is still not bob's to see.
    assert_eq!(
        bob.refused("session.close", json!({ "id": hers })).await,
        "not_found"
    );
    assert_eq!(
        ids(&bob
            .ok("sessions.list", json!({ "state": "finalized" }))
            .await),
        Vec::<u64>::new()
    );
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let sessions = sandbox.sessions();
    let row = settle_tests::by_name(&sessions, "hers");
    assert_eq!(row["end_reason"], "user_close");
    assert_eq!(row["turns"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_not_allowed_is_refused_403_and_a_client_without_one_is_not() {
    let sandbox = Sandbox::new();
    let (mut serving, addr) = serve(&sandbox, &["--allow-origin", "https://app.example"]);
    assert_eq!(
        connect_with(&addr, &[("origin", "http://evil.example")])
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        connect_with(&addr, &[("origin", "null")]).await.err(),
        Some(403)
    );
    let mut page = connect_with(&addr, &[("origin", "https://app.example")])
        .await
        .unwrap();
    page.ok("sessions.list", json!({})).await;
    let mut script = connect_with(&addr, &[]).await.unwrap();
    script.ok("sessions.list", json!({})).await;
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let stderr = serving.stderr_text();
    let refused = stderr
        .lines()
        .find(|l| l.contains("origin is not allowed"))
        .unwrap_or_else(|| panic!("no log line of the refusal: {stderr}"));
    // It names who was refused, for an operator to trace or block.
    assert!(refused.contains("peer=127.0.0.1:"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_allow_list_a_web_page_is_refused() {
    let sandbox = Sandbox::new();
    let (_serving, addr) = serve(&sandbox, &[]);
    assert_eq!(
        connect_with(&addr, &[("origin", "http://localhost:3000")])
            .await
            .err(),
        Some(403)
    );
}

#[test]
fn g11_a_public_address_without_tokens_and_a_bad_token_file_are_refused_with_exit_2() {
    let sandbox = Sandbox::new();
    let book = sandbox
        .write("book.toml", "[default]\nchunks = [\"ok\"]\n")
        .to_string_lossy()
        .into_owned();
    let secret = "a-secret-that-must-not-show";
    let bad = sandbox
        .write("bad-tokens", &format!("alice {secret} extra\n"))
        .to_string_lossy()
        .into_owned();
    let short = sandbox
        .write("short-tokens", "alice tiny\n")
        .to_string_lossy()
        .into_owned();
    let empty = sandbox
        .write("empty-tokens", "# nobody\n")
        .to_string_lossy()
        .into_owned();
    let not_pem = sandbox
        .write("cert.pem", &format!("{secret}\n"))
        .to_string_lossy()
        .into_owned();
    // Columns swapped: the token where the principal goes.
    let swapped = sandbox
        .write("swapped-tokens", &format!("{secret} tui\n"))
        .to_string_lossy()
        .into_owned();
    let open_to_all = sandbox
        .write("open-tokens", &format!("alice {secret}\n"))
        .to_string_lossy()
        .into_owned();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    for (args, says) in [
        (vec!["--listen", "0.0.0.0:0"], "without --token-file"),
        (vec!["--listen", "[::]:0"], "without --token-file"),
        (vec!["--token-file", &bad], "line 1"),
        (vec!["--token-file", &short], "line 1"),
        (vec!["--token-file", &empty], "no `PRINCIPAL TOKEN`"),
        (vec!["--token-file", "missing-tokens"], "cannot read"),
        (
            vec!["--token-file", &swapped],
            "line 1: the token (the second field)",
        ),
        (vec!["--token-file", &open_to_all], "chmod o-w"),
        // `null` would let every sandboxed page in; the others never match.
        (vec!["--allow-origin", "null"], "any web page"),
        (vec!["--allow-origin", "*"], "not an origin"),
        (vec!["--allow-origin", "https://app.example/ui"], "no path"),
        (
            vec!["--tls-cert", &not_pem, "--tls-key", &not_pem],
            "cert.pem",
        ),
        (vec!["--tls-cert", &not_pem], "--tls-key"),
    ] {
        let mut all = vec!["serve", "--scripted", &book];
        if !args.contains(&"--listen") {
            all.extend_from_slice(&["--listen", "127.0.0.1:0"]);
        }
        all.extend_from_slice(&args);
        let out = sandbox.run(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains(secret), "{args:?}: {stderr}");
        assert!(!sandbox.db().exists(), "{args:?} created the database");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_with_tokens_is_served() {
    let sandbox = Sandbox::new();
    let tokens = token_file(&sandbox);
    let (_serving, addr) = serve(
        &sandbox,
        &["--listen", "0.0.0.0:0", "--token-file", &tokens],
    );
    let port = addr.rsplit(':').next().unwrap();
    let mut alice = connect_as(&format!("127.0.0.1:{port}"), ALICE).await;
    alice.ok("sessions.list", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_round_trip_with_a_certificate_the_client_trusts() {
    let sandbox = Sandbox::new();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = sandbox.write("cert.pem", &made.cert.pem());
    let key = sandbox.write("key.pem", &made.signing_key.serialize_pem());
    let tokens = token_file(&sandbox);
    let (mut serving, addr) = serve(
        &sandbox,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--token-file",
            &tokens,
        ],
    );
    assert!(
        serving.output().contains("listening on wss://"),
        "{}",
        serving.output()
    );

    let mut roots = rustls::RootCertStore::empty();
    roots.add(made.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let port = addr.rsplit(':').next().unwrap();
    let mut request = format!("wss://localhost:{port}/ws")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {ALICE}")).unwrap(),
    );
    let (ws, _) = tokio_tungstenite::client_async(request, tls).await.unwrap();
    let mut client = Client::new(ws);
    let id = client
        .ok("session.create", json!({ "name": "secure" }))
        .await["id"]
        .as_u64()
        .unwrap();
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    assert_eq!(client.turn(id).await.0, ["ok"]);

    // Plain text to the TLS port is no WebSocket.
    let plain = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await;
    assert!(plain.is_err());
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    assert_eq!(sandbox.sessions()[0]["chunks"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_refuses_with_its_documented_answer_and_a_log_line() {
    let sandbox = Sandbox::new();
    let tokens = token_file(&sandbox);
    let (mut serving, addr) = serve(
        &sandbox,
        &[
            "--token-file",
            &tokens,
            "--max-sessions-per-principal",
            "2",
            "--max-connections-per-principal",
            "2",
            "--requests-per-second",
            "5",
        ],
    );
    // Sessions per principal: over_capacity, nothing written; bob has his own count.
    let mut alice = connect_as(&addr, ALICE).await;
    let first = alice.ok("session.create", json!({ "name": "a1" })).await["id"]
        .as_u64()
        .unwrap();
    alice.ok("session.create", json!({ "name": "a2" })).await;
    let error = alice
        .call("session.create", json!({ "name": "a3" }))
        .await
        .unwrap_err();
    assert_eq!(error["data"]["kind"], "over_capacity", "{error}");
    assert_eq!(error["code"], -32005);
    let mut bob = connect_as(&addr, BOB).await;
    bob.ok("session.create", json!({ "name": "b1" })).await;

    // Requests per second: a burst past five is answered rate_limited, in order.
    let mut kinds = Vec::new();
    for _ in 0..10 {
        kinds.push(match bob.call("sessions.list", json!({})).await {
            Ok(_) => "ok".to_owned(),
            Err(e) => e["data"]["kind"].as_str().unwrap().to_owned(),
        });
    }
    assert!(kinds.contains(&"rate_limited".to_owned()), "{kinds:?}");
    assert_eq!(kinds[0], "ok", "{kinds:?}");
    // And it refills.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    bob.ok("sessions.list", json!({})).await;

    // A closed session gives its place back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    alice.ok("session.close", json!({ "id": first })).await;
    alice.ok("session.create", json!({ "name": "a3" })).await;

    // Connections per principal: a third of alice's is refused 429; bob's is not.
    let _second = connect_as(&addr, ALICE).await;
    let third = connect_with(&addr, &[("authorization", &format!("Bearer {ALICE}"))]).await;
    assert_eq!(third.err(), Some(429));
    let _bobs = connect_as(&addr, BOB).await;
    // Once one of hers ends, she may connect again.
    drop(alice);
    gateway_support::eventually("alice's place back", Duration::from_millis(50), || async {
        connect_with(&addr, &[("authorization", &format!("Bearer {ALICE}"))])
            .await
            .is_ok()
    })
    .await;

    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let sessions = sandbox.sessions();
    assert_eq!(sessions.len(), 4, "the refused create wrote nothing");
    let stderr = serving.stderr_text();
    for line in [
        "maximum of live sessions",
        "over the connection's rate",
        "maximum of connections",
    ] {
        assert!(stderr.contains(line), "no line with {line:?}: {stderr}");
    }
}

/// A gateway on in-memory pipes (for the paused clock), replying "ok".
async fn piped(
    options: impl FnOnce(settle_gateway::GatewayBuilder) -> settle_gateway::GatewayBuilder,
) -> gateway_support::Served {
    let provider = Arc::new(
        settle_gateway::ScriptBook::new().otherwise(settle_stream::TurnScript::new(["ok"])),
    );
    gateway_support::Served::pipes(provider, |k| k, options).await
}

#[tokio::test(start_paused = true)]
async fn a_connection_attached_to_nothing_is_closed_after_the_idle_timeout_and_a_watcher_is_not() {
    let idle = Duration::from_secs(30);
    let served = piped(|g| g.connection_idle_timeout(Some(idle))).await;
    let mut idler = served.client().await;
    let mut watcher = served.client().await;
    let id = watcher
        .ok("session.create", json!({ "name": "watched" }))
        .await["id"]
        .as_u64()
        .unwrap();
    let start = tokio::time::Instant::now();
    idler.ok("sessions.list", json!({})).await;
    assert!(idler.until_closed().await.is_empty());
    let closed = start.elapsed();
    assert!(closed >= idle && closed < idle * 2, "{closed:?}");
    // Ten idle timeouts later, the attached one still serves.
    tokio::time::sleep(idle * 10).await;
    watcher
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    assert_eq!(watcher.turn(id).await.0, ["ok"]);
}

#[tokio::test(start_paused = true)]
async fn a_request_head_not_finished_within_the_header_timeout_is_dropped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let served = piped(|g| g.header_timeout(Duration::from_secs(10))).await;
    let gateway_support::Address::Pipes(pipes) = &served.address else {
        unreachable!()
    };
    let (mut ours, theirs) = tokio::io::duplex(4096);
    pipes.send(theirs).unwrap();
    let start = tokio::time::Instant::now();
    ours.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, ours.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "still open after {PATIENCE:?}");
    let dropped = start.elapsed();
    assert!(
        dropped >= Duration::from_secs(10) && dropped < Duration::from_secs(11),
        "{dropped:?}"
    );
    // A whole request on a fresh connection is still answered.
    let mut client = served.client().await;
    client.ok("sessions.list", json!({})).await;
}

/// Under a low open-file limit (the 1,024 most hosts start a process with,
/// here 200), `--max-connections` is lowered to what fits, with one line
/// saying so: each connection may hold a turn's model connection too, and
/// past the limit every client would fail at once. The connections over
/// it are refused one by one, and a client of the connections that fit
/// still runs a turn. The refusals are logged as a run (anyone can make
/// them): the first one's line, and how many more came, said as the
/// gateway stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_open_file_limit_only_the_connections_that_fit_are_served_and_it_is_said() {
    let sandbox = Sandbox::new();
    let book = ok_book(&sandbox);
    let settle = sandbox.command(&["serve", "--scripted", &book, "--listen", "127.0.0.1:0"]);
    // The shell's `ulimit -n` lowers the hard limit too: nothing can raise it.
    let mut limited = std::process::Command::new("sh");
    limited
        .arg("-c")
        .arg("ulimit -n 200 && exec \"$@\"")
        .arg("sh")
        .arg(settle.get_program())
        .args(settle.get_args());
    for (key, value) in settle.get_envs() {
        match value {
            Some(value) => limited.env(key, value),
            None => limited.env_remove(key),
        };
    }
    let mut serving = sandbox.spawn_command(limited);
    let addr = serving.listening_address();
    // (200 - 64 kept for the store and the log) / 2 per connection.
    let fit = 68;
    let mut client = connect(&addr).await;
    let id = client.ok("session.create", json!({ "name": "s" })).await["id"]
        .as_u64()
        .unwrap();
    // The client holds one place; twelve more than the rest are refused,
    // closed at once (the others wait for the 10 s header timeout).
    let mut idle: Vec<TcpStream> = (0..fit - 1 + 12)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let closed = idle
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(20)))
        .filter(|&closed| closed)
        .count();
    assert_eq!(closed, 12);
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    let (chunks, end) = client.turn(id).await;
    assert_eq!(chunks, ["ok"], "{end}");
    drop(idle);
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
    let stderr = serving.stderr_text();
    assert!(
        stderr.contains(&format!("serving at most {fit} connections")),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("refused a connection").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("11 more connections refused at the gateway's maximum"),
        "{stderr}"
    );
}

/// A principal's sessions stay its own across a restart of the gateway:
/// listed to it and to nobody else, readable and closable (how it ended)
/// by it, `not_found` to another, as before the restart. (The store keeps
/// who created each session; the process's memory is only a cache of it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principals_finalized_sessions_stay_its_own_after_a_restart() {
    let sandbox = Sandbox::new();
    let tokens = token_file(&sandbox);
    let (mut serving, addr) = serve(&sandbox, &["--token-file", &tokens]);
    let mut alice = connect_as(&addr, ALICE).await;
    let hers = alice.ok("session.create", json!({ "name": "hers" })).await["id"]
        .as_u64()
        .unwrap();
    alice
        .ok("turn.start", json!({ "id": hers, "prompt": "hi" }))
        .await;
    assert_eq!(alice.turn(hers).await.0, ["ok"]);
    let end = alice.ok("session.close", json!({ "id": hers })).await;
    assert_eq!(end["end_reason"], "user_close");
    let mut bob = connect_as(&addr, BOB).await;
    let his = bob.ok("session.create", json!({ "name": "his" })).await["id"]
        .as_u64()
        .unwrap();
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );

    let (mut serving, addr) = serve(&sandbox, &["--token-file", &tokens]);
    let mut alice = connect_as(&addr, ALICE).await;
    let mut bob = connect_as(&addr, BOB).await;
    let ids = gateway_support::listed_ids;
    assert_eq!(ids(&alice.ok("sessions.list", json!({})).await), [hers]);
    assert_eq!(ids(&bob.ok("sessions.list", json!({})).await), [his]);
    let page = alice.ok("session.read", json!({ "id": hers })).await;
    assert_eq!(page["chunks"][0]["text"], "ok", "{page}");
    let end = alice.ok("session.close", json!({ "id": hers })).await;
    assert_eq!(end["end_reason"], "user_close");
    for (method, params) in [
        ("session.read", json!({ "id": hers })),
        ("session.close", json!({ "id": hers })),
        ("session.attach", json!({ "id": hers })),
    ] {
        assert_eq!(bob.refused(method, params).await, "not_found", "{method}");
    }
    assert_eq!(
        alice.refused("session.read", json!({ "id": his })).await,
        "not_found"
    );
    serving.signal(Signal::SIGTERM);
    assert_eq!(
        serving.exited_within(PATIENCE).and_then(|s| s.code()),
        Some(143)
    );
}
