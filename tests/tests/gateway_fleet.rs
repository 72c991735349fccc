//! A fleet of `settle serve` processes on one PostgreSQL on 127.0.0.1 (SPEC
//! §12, G12), with real WebSocket clients and a tiny OpenAI-compatible model
//! server that records every request: a method on another process's session
//! answers `elsewhere` with its URL; a rolling restart loses no session (the
//! running turn drains, every session is released, adopted elsewhere and
//! goes on with its whole history, as the model server sees it, and ends
//! once, `user_close`); two processes racing to adopt a released session
//! adopt it once; and after a SIGKILL mid-turn a live peer releases the
//! dead one's sessions once its lease expired, the interrupted turn marked
//! `interrupted` with its acknowledged chunks (G7, G8).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod gateway_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateway_support::{connect, connect_as, Client};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use settle_tests::{Running, Sandbox, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// --- the model server ---------------------------------------------------------------------

/// An OpenAI-compatible server on 127.0.0.1 that keeps every request's
/// messages. It answers a prompt `p` with `re:` and `p`; `slow` with ten
/// chunks 150 ms apart; `hang` with three chunks, then nothing until the
/// client goes away.
struct ModelServer {
    base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl ModelServer {
    async fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(answer(socket, seen.clone()));
            }
        });
        ModelServer {
            base_url: format!("http://{addr}/v1"),
            requests,
        }
    }

    /// The messages of every request whose last message is `prompt`.
    fn sent_with(&self, prompt: &str) -> Vec<Vec<(String, String)>> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|body| {
                body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        let role = m["role"].as_str().unwrap_or_default().to_owned();
                        let content = m["content"].as_str().unwrap_or_default().to_owned();
                        (role, content)
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|messages| messages.last().is_some_and(|(_, c)| c == prompt))
            .collect()
    }
}

fn event(piece: &str) -> String {
    let data = json!({ "choices": [{ "delta": { "content": piece } }] });
    format!("data: {data}\n\n")
}

async fn answer(mut socket: TcpStream, seen: Arc<Mutex<Vec<Value>>>) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let read = socket.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        bytes.extend_from_slice(&buf[..read]);
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while bytes.len() < head_end + length {
        let read = socket.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        bytes.extend_from_slice(&buf[..read]);
    }
    let body: Value =
        serde_json::from_slice(&bytes[head_end..head_end + length]).unwrap_or(Value::Null);
    let prompt = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    seen.lock().unwrap().push(body);
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
              Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
        )
        .await?;
    match prompt.as_str() {
        "slow" => {
            for i in 0..10 {
                socket
                    .write_all(event(&format!("s{i} ")).as_bytes())
                    .await?;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }
        "hang" => {
            for piece in ["h1 ", "h2 ", "h3 "] {
                socket.write_all(event(piece).as_bytes()).await?;
            }
            // Until the client goes away.
            let _ = socket.read(&mut buf).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            return Ok(());
        }
        _ => {
            socket.write_all(event("re:").as_bytes()).await?;
            socket.write_all(event(&prompt).as_bytes()).await?;
        }
    }
    socket.write_all(b"data: [DONE]\n\n").await?;
    socket.shutdown().await
}

// --- the fleet ----------------------------------------------------------------------------

/// One `settle serve` of the fleet.
struct Node {
    running: Running,
    addr: String,
}

impl Node {
    fn start(sandbox: &Sandbox, db: &str, model: &ModelServer, lease: &str) -> Node {
        Node::start_with(sandbox, db, model, lease, &[])
    }

    /// [`Node::start`] with more arguments for `settle serve`.
    fn start_with(
        sandbox: &Sandbox,
        db: &str,
        model: &ModelServer,
        lease: &str,
        extra: &[&str],
    ) -> Node {
        let mut args = vec![
            "--db",
            db,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--base-url",
            &model.base_url,
            "--model",
            "m",
            "--drain-timeout",
            "20s",
            "--lease-ttl",
            lease,
        ];
        args.extend_from_slice(extra);
        let mut running = sandbox.spawn_command(sandbox.command_default_db(&args));
        let addr = running.listening_address();
        Node { running, addr }
    }

    fn url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// SIGTERM, and its exit status within a generous bound.
    fn stop(&mut self) -> i32 {
        self.running.signal(Signal::SIGTERM);
        let status = self
            .running
            .exited_within(PATIENCE)
            .expect("the node exits after SIGTERM");
        status_code(status)
    }
}

fn status_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A database of its own on the test's PostgreSQL, or `None` (said) without one.
fn fleet_db() -> Option<common::PgDb> {
    common::pg_admin_url().map(|admin| common::PgDb::new(&admin))
}

/// `settle sessions --json` of the fleet's database.
fn rows(db: &str) -> Vec<Value> {
    common::sessions(db).expect("settle sessions --json")
}

fn row(db: &str, id: u64) -> Value {
    rows(db)
        .into_iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no session {id}"))
}

async fn create(client: &mut Client, name: &str) -> u64 {
    client.ok("session.create", json!({ "name": name })).await["id"]
        .as_u64()
        .unwrap()
}

/// Runs a turn of `id` with `prompt` to its end: its chunks, its outcome.
async fn turn(client: &mut Client, id: u64, prompt: &str) -> (String, String) {
    client
        .ok("turn.start", json!({ "id": id, "prompt": prompt }))
        .await;
    let (chunks, ended) = client.turn(id).await;
    (
        chunks.concat(),
        ended["outcome"].as_str().unwrap().to_owned(),
    )
}

fn pair(role: &str, content: &str) -> (String, String) {
    (role.to_owned(), content.to_owned())
}

/// The error a refused call answered.
async fn refusal(client: &mut Client, method: &str, params: Value) -> Value {
    client
        .call(method, params)
        .await
        .expect_err("the call is refused")
}

/// Session `id`'s timeline in `db` has one adoption.
fn assert_adopted_once(db: &str, id: u64) {
    let show = common::show(db, i64::try_from(id).unwrap()).unwrap();
    let adopted = show["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["cause"] == "adopted")
        .count();
    assert_eq!(adopted, 1, "{show}");
}

// --- the tests ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_a_method_on_another_processs_session_answers_elsewhere_with_its_url() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut on_a = connect(&a.addr).await;
    let id = create(&mut on_a, "chat").await;
    assert_eq!(
        turn(&mut on_a, id, "hello").await,
        ("re:hello".into(), "completed".into())
    );

    let mut on_b = connect(&b.addr).await;
    for (method, params) in [
        ("session.attach", json!({ "id": id })),
        ("turn.start", json!({ "id": id, "prompt": "hi" })),
        ("session.close", json!({ "id": id })),
    ] {
        let error = refusal(&mut on_b, method, params).await;
        assert_eq!(error["data"]["kind"], "elsewhere", "{method}: {error}");
        assert_eq!(error["data"]["owner"], a.url(), "{method}: {error}");
    }
    // The fleet's sessions, each with its owner's URL.
    let listed = on_b.ok("sessions.list", json!({})).await;
    let sessions = listed["sessions"]
        .as_array()
        .or(listed.as_array())
        .cloned()
        .unwrap();
    let listed_row = sessions
        .iter()
        .find(|r| r["id"] == id)
        .expect("listed on B");
    assert_eq!(listed_row["owner"], a.url());
    assert_eq!(row(&pg.url, id)["owner"], a.url());
    // Still A's, and untouched.
    assert_eq!(turn(&mut on_a, id, "again").await.1, "completed");
    assert_eq!(a.stop(), 143);
    assert_eq!(b.stop(), 143);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_a_rolling_restart_of_the_fleet_loses_no_session() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");

    // Ten clients on A, a completed turn each.
    let mut clients = Vec::new();
    for i in 0..10 {
        let mut client = connect(&a.addr).await;
        let id = create(&mut client, &format!("chat-{i}")).await;
        let prompt = format!("hello {i}");
        assert_eq!(turn(&mut client, id, &prompt).await.1, "completed");
        clients.push((client, id));
    }
    // One of them mid-turn when A is told to go.
    let (busy, busy_id) = &mut clients[0];
    busy.ok("turn.start", json!({ "id": *busy_id, "prompt": "slow" }))
        .await;
    assert_eq!(busy.expect("turn.chunk").await["text"], "s0 ");
    a.running.signal(Signal::SIGTERM);
    let seen = busy.until_closed().await;
    let notice = seen
        .iter()
        .find(|m| m["method"] == "server.shutdown")
        .unwrap_or_else(|| panic!("no server.shutdown: {seen:#?}"));
    assert_eq!(notice["params"]["handoff"], true, "{notice}");
    let ended = seen
        .iter()
        .find(|m| m["method"] == "turn.ended")
        .unwrap_or_else(|| panic!("the running turn did not end: {seen:#?}"));
    assert_eq!(ended["params"]["outcome"], "completed", "the turn drained");
    assert!(
        !seen.iter().any(|m| m["method"] == "session.finalized"),
        "{seen:#?}"
    );
    let status = a.running.exited_within(PATIENCE).expect("A exits");
    assert_eq!(status_code(status), 143);
    for (_, id) in &clients {
        let r = row(&pg.url, *id);
        assert_eq!(r["state"], "registered", "{r}");
        assert_eq!(r["end_reason"], Value::Null, "no session finalized: {r}");
        assert_eq!(r["owner"], Value::Null, "released: {r}");
    }

    // Each client follows the handoff to B, attaches and goes on.
    let mut expected_history: Vec<Vec<(String, String)>> = (0..10)
        .map(|i| {
            vec![
                pair("user", &format!("hello {i}")),
                pair("assistant", &format!("re:hello {i}")),
            ]
        })
        .collect();
    expected_history[0].extend([
        pair("user", "slow"),
        pair("assistant", "s0 s1 s2 s3 s4 s5 s6 s7 s8 s9 "),
    ]);
    round(&mut clients, &b.addr, "again", &mut expected_history).await;
    for i in 0..10 {
        let sent = model.sent_with(&format!("again {i}"));
        let expected = expected_history[i][..expected_history[i].len() - 1].to_vec();
        assert_eq!(
            sent,
            vec![expected],
            "client {i}: the whole earlier conversation"
        );
    }

    // Restart A, redeploy B: the same back again.
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    assert_eq!(b.stop(), 143);
    round(&mut clients, &a.addr, "back", &mut expected_history).await;
    for i in 0..10 {
        let sent = model.sent_with(&format!("back {i}"));
        let expected = expected_history[i][..expected_history[i].len() - 1].to_vec();
        assert_eq!(
            sent,
            vec![expected],
            "client {i}: the whole conversation, twice moved"
        );
    }

    // Every session ends exactly once, when its client closes it.
    for (client, id) in &mut clients {
        let closed = client.ok("session.close", json!({ "id": *id })).await;
        assert_eq!(closed["end_reason"], "user_close");
    }
    for (_, id) in &clients {
        let shown = common::show(&pg.url, i64::try_from(*id).unwrap()).unwrap();
        assert_eq!(shown["session"]["end_reason"], "user_close", "{shown}");
        let finalizes = shown["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["to"] == "finalized")
            .count();
        assert_eq!(finalizes, 1, "finalized once: {shown}");
        let turns = if *id == clients_first(&clients) { 4 } else { 3 };
        assert_eq!(shown["turns"].as_array().unwrap().len(), turns, "{shown}");
    }
    assert_eq!(a.stop(), 143);
}

fn clients_first(clients: &[(Client, u64)]) -> u64 {
    clients[0].1
}

/// Every client reconnects to `node`, attaches its session (adopting it
/// there) and runs a turn `WORD i`, which `history` records.
async fn round(
    clients: &mut [(Client, u64)],
    node: &str,
    word: &str,
    history: &mut [Vec<(String, String)>],
) {
    for (i, (client, id)) in clients.iter_mut().enumerate() {
        *client = connect(node).await;
        let attached = client.ok("session.attach", json!({ "id": *id })).await;
        assert_eq!(attached["state"], "registered");
        let prompt = format!("{word} {i}");
        assert_eq!(
            turn(client, *id, &prompt).await,
            (format!("re:{prompt}"), "completed".into())
        );
        history[i].push(pair("user", &prompt));
        history[i].push(pair("assistant", &format!("re:{prompt}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_two_processes_racing_to_adopt_a_released_session_adopt_it_once() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut c = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut on_a = connect(&a.addr).await;
    let id = create(&mut on_a, "contended").await;
    assert_eq!(turn(&mut on_a, id, "hello").await.1, "completed");
    assert_eq!(a.stop(), 143);
    assert_eq!(row(&pg.url, id)["owner"], Value::Null);

    let (mut on_b, mut on_c) = (connect(&b.addr).await, connect(&c.addr).await);
    let (at_b, at_c) = tokio::join!(
        on_b.call("session.attach", json!({ "id": id })),
        on_c.call("session.attach", json!({ "id": id }))
    );
    let (winner, loser) = match (&at_b, &at_c) {
        (Ok(_), Err(lost)) => (b.url(), lost),
        (Err(lost), Ok(_)) => (c.url(), lost),
        other => panic!("exactly one adoption wins: {other:?}"),
    };
    assert_eq!(loser["data"]["kind"], "elsewhere", "{loser}");
    assert_eq!(loser["data"]["owner"], winner, "the loser names the winner");
    assert_eq!(row(&pg.url, id)["owner"], winner);
    assert_adopted_once(&pg.url, id);
    assert_eq!(b.stop(), 143);
    assert_eq!(c.stop(), 143);
}

/// On one process, attaches race per session: four of one released
/// session all attach it (adopted once; none is told the session is not
/// found while another's adoption of it is under way), while released
/// sessions of other clients are adopted beside them, not one after another
/// behind a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_attaches_racing_on_one_process_adopt_each_session_once() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut on_a = connect(&a.addr).await;
    let ids = [
        create(&mut on_a, "one").await,
        create(&mut on_a, "two").await,
        create(&mut on_a, "three").await,
    ];
    assert_eq!(a.stop(), 143);
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(connect(&b.addr).await);
    }
    // Four clients per session, all at once.
    let attaches = clients.iter_mut().enumerate().map(|(i, client)| {
        let id = ids[i % ids.len()];
        async move { client.call("session.attach", json!({ "id": id })).await }
    });
    for answer in futures_util::future::join_all(attaches).await {
        assert!(answer.is_ok(), "{answer:?}");
    }
    for id in ids {
        assert_eq!(row(&pg.url, id)["owner"], b.url());
        assert_adopted_once(&pg.url, id);
    }
    assert_eq!(b.stop(), 143);
}

/// Members of one released tree attached at once on one process (a
/// parent's client and its child's reconnecting together after a
/// redeploy): whichever attach adopts the tree first, the other is served
/// the same adoption. It was answered `internal` ("not released by any
/// process") or `not_found`, found owned by its own process in the store
/// before its kernel had it, in every tree tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_members_of_one_tree_attached_at_once_on_one_process_are_each_served() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut on_a = connect(&a.addr).await;
    let mut trees = Vec::new();
    for i in 0..6 {
        let parent = create(&mut on_a, &format!("parent-{i}")).await;
        let child = on_a
            .ok(
                "session.create",
                json!({ "name": format!("child-{i}"), "parent": parent }),
            )
            .await["id"]
            .as_u64()
            .unwrap();
        trees.push((parent, child));
    }
    assert_eq!(a.stop(), 143);
    let (mut x, mut y) = (connect(&b.addr).await, connect(&b.addr).await);
    for (parent, child) in trees.iter().copied() {
        let (p, c) = tokio::join!(
            x.call("session.attach", json!({ "id": parent })),
            y.call("session.attach", json!({ "id": child })),
        );
        assert!(p.is_ok(), "the parent {parent}: {p:?}");
        assert!(c.is_ok(), "the child {child}: {c:?}");
        for id in [parent, child] {
            assert_eq!(row(&pg.url, id)["owner"], b.url());
            assert_adopted_once(&pg.url, id);
        }
    }
    assert_eq!(b.stop(), 143);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_g8_after_a_sigkill_mid_turn_a_live_peer_releases_the_sessions_for_adoption() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "2s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "2s");
    let mut on_a = connect(&a.addr).await;
    let idle = create(&mut on_a, "idle").await;
    assert_eq!(turn(&mut on_a, idle, "hello").await.1, "completed");
    let busy = create(&mut on_a, "busy").await;
    on_a.ok("turn.start", json!({ "id": busy, "prompt": "hang" }))
        .await;
    // Three chunks reached the client: the store has them (G7).
    let mut acknowledged = Vec::new();
    for _ in 0..3 {
        acknowledged.push(on_a.expect("turn.chunk").await["text"].clone());
    }
    a.running.signal(Signal::SIGKILL);
    let _ = a.running.exited_within(PATIENCE);
    assert_eq!(row(&pg.url, busy)["state"], "running");

    // Once A's lease expired, B's sweep releases its sessions, nobody asking.
    let start = Instant::now();
    loop {
        let released = [idle, busy].iter().all(|id| {
            let r = row(&pg.url, *id);
            r["state"] == "registered" && r["owner"] == Value::Null
        });
        if released {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "B never released A's sessions");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = common::show(&pg.url, i64::try_from(busy).unwrap()).unwrap();
    let interrupted = &shown["turns"][0];
    assert_eq!(interrupted["outcome"], "interrupted", "{shown}");
    assert_eq!(interrupted["chunks"], json!(acknowledged), "{shown}");

    // A client adopts it on B and goes on.
    let mut on_b = connect(&b.addr).await;
    let attached = on_b.ok("session.attach", json!({ "id": busy })).await;
    assert_eq!(attached["state"], "registered");
    assert_eq!(
        turn(&mut on_b, busy, "go on").await,
        ("re:go on".into(), "completed".into())
    );
    let sent = model.sent_with("go on");
    assert_eq!(
        sent,
        vec![vec![
            pair("user", "hang"),
            pair("assistant", "h1 h2 h3 "),
            pair("user", "go on"),
        ]],
        "the interrupted turn's acknowledged reply is part of the history"
    );
    assert_eq!(row(&pg.url, busy)["owner"], b.url());
    assert_eq!(b.stop(), 143);
}

/// Found from outside (G8, SPEC §12): a process stopped past its lease
/// (SIGSTOP), whose sessions a live peer released and a client adopted
/// there, answered its own client's next request `internal` ("not owned by
/// this process") once it ran again. It answers as the fleet does for a
/// session another process owns: `elsewhere` with that process's URL, or
/// `shutting_down` once it has seen its lease lost; never `internal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_g12_a_process_back_after_its_lease_ran_out_sends_its_clients_where_their_session_went()
{
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "2s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "2s");
    let mut on_a = connect(&a.addr).await;
    let id = create(&mut on_a, "chat").await;
    assert_eq!(turn(&mut on_a, id, "hello").await.1, "completed");
    a.running.signal(Signal::SIGSTOP);
    let start = Instant::now();
    while row(&pg.url, id)["owner"] != Value::Null {
        assert!(start.elapsed() < PATIENCE, "B never released A's session");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut on_b = connect(&b.addr).await;
    on_b.ok("session.attach", json!({ "id": id })).await;
    assert_eq!(row(&pg.url, id)["owner"], b.url());
    // Sent while A is stopped: read as soon as it runs again.
    on_a.send_raw(
        &json!({"jsonrpc": "2.0", "id": 99, "method": "turn.start",
        "params": { "id": id, "prompt": "mine?" }})
        .to_string(),
    )
    .await;
    a.running.signal(Signal::SIGCONT);
    // A stops on its lost lease and closes its connections: what it said
    // before, the answer among it if it gave one.
    let said = on_a.until_closed().await;
    if let Some(answer) = said.iter().find(|m| m["id"] == 99) {
        let error = &answer["error"];
        match error["data"]["kind"].as_str() {
            Some("elsewhere") => assert_eq!(error["data"]["owner"], b.url(), "{error}"),
            Some("shutting_down") => {}
            _ => panic!("neither elsewhere nor shutting_down: {answer}"),
        }
    }
    let shutdown = said
        .iter()
        .find(|m| m["method"] == "server.shutdown")
        .unwrap_or_else(|| panic!("no server.shutdown: {said:?}"));
    assert_eq!(shutdown["params"]["reason"], "lease_lost", "{shutdown}");
    assert_eq!(shutdown["params"]["drain_ms"], 0, "{shutdown}");
    // B's, and untouched by A.
    assert_eq!(turn(&mut on_b, id, "go on").await.1, "completed");
    let _ = a.running.exited_within(PATIENCE);
    assert_eq!(b.stop(), 143);
}

/// Found from outside (SPEC §12): a process of a fleet listening on every
/// interface (`--listen 0.0.0.0:PORT`) advertised `ws://0.0.0.0:PORT/ws`,
/// which `elsewhere` then sent to clients on other machines, silently. It
/// says so when it starts, with the option that fixes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_process_listening_everywhere_without_advertise_warns_that_nobody_can_reach_it() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    // Listening beyond this machine asks for tokens.
    let tokens = sandbox.write("tokens", &format!("alice {ALICE}\n"));
    let tokens = tokens.to_string_lossy().into_owned();
    let warned = |listen: &str, extra: &[&str]| {
        let mut args = vec![
            "--db",
            pg.url.as_str(),
            "serve",
            "--listen",
            listen,
            "--base-url",
            model.base_url.as_str(),
            "--model",
            "m",
            "--token-file",
            tokens.as_str(),
        ];
        args.extend_from_slice(extra);
        let mut running = sandbox.spawn_command(sandbox.command_default_db(&args));
        let _ = running.listening_address();
        running.signal(Signal::SIGTERM);
        let _ = running.exited_within(PATIENCE);
        running.stderr_text()
    };
    let said = warned("0.0.0.0:0", &[]);
    assert!(
        said.contains("warning: advertising ws://0.0.0.0:") && said.contains("--advertise"),
        "{said}"
    );
    assert!(!warned("127.0.0.1:0", &[]).contains("warning"));
    assert!(!warned("0.0.0.0:0", &["--advertise", "ws://host.example:1/ws"]).contains("warning"));
}

const ALICE: &str = "alice-token-0123456789";
const MALLORY: &str = "mallory-token-0123456789";

/// G12 with principals: another principal's session is `not_found` on
/// every process of the fleet, as on its own, never `elsewhere` with its
/// owner's URL (which would say it exists, and where), and an attach of it
/// after a handoff does not adopt it (which would move it, and its
/// history, to a process its owner never asked for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_another_principals_session_is_not_found_on_every_process_and_never_adopted_by_it() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let tokens = sandbox.write("tokens", &format!("alice {ALICE}\nmallory {MALLORY}\n"));
    let tokens = tokens.to_string_lossy().into_owned();
    let model = ModelServer::start().await;
    let extra = ["--token-file", tokens.as_str()];
    let mut a = Node::start_with(&sandbox, &pg.url, &model, "30s", &extra);
    let mut b = Node::start_with(&sandbox, &pg.url, &model, "30s", &extra);
    let mut alice = connect_as(&a.addr, ALICE).await;
    let id = create(&mut alice, "alices").await;
    assert_eq!(turn(&mut alice, id, "mine").await.1, "completed");

    let mut mallory = connect_as(&b.addr, MALLORY).await;
    for (method, params) in [
        ("session.attach", json!({ "id": id })),
        ("session.read", json!({ "id": id })),
        ("turn.start", json!({ "id": id, "prompt": "theirs" })),
        ("session.close", json!({ "id": id })),
    ] {
        let error = refusal(&mut mallory, method, params).await;
        assert_eq!(error["data"]["kind"], "not_found", "{method} on B: {error}");
    }
    // Listed on B to alice, with A's URL, and to nobody else.
    let listed_ids = gateway_support::listed_ids;
    let mut alice_on_b = connect_as(&b.addr, ALICE).await;
    let page = alice_on_b.ok("sessions.list", json!({})).await;
    assert_eq!(listed_ids(&page), vec![id], "{page}");
    assert_eq!(page["sessions"][0]["owner"], a.url(), "{page}");
    let page = mallory.ok("sessions.list", json!({})).await;
    assert!(listed_ids(&page).is_empty(), "{page}");
    drop(alice_on_b);
    // A hands its sessions off; mallory's attach on B does not adopt alice's.
    a.running.signal(Signal::SIGTERM);
    alice.until_closed().await;
    assert_eq!(
        status_code(a.running.exited_within(PATIENCE).expect("A exits")),
        143
    );
    let error = refusal(&mut mallory, "session.attach", json!({ "id": id })).await;
    assert_eq!(error["data"]["kind"], "not_found", "{error}");
    assert_eq!(row(&pg.url, id)["owner"], Value::Null, "still released");
    // Alice's attach on B adopts it, with its history.
    let mut alice = connect_as(&b.addr, ALICE).await;
    alice.ok("session.attach", json!({ "id": id })).await;
    assert_eq!(turn(&mut alice, id, "again").await.1, "completed");
    assert_eq!(
        model.sent_with("again"),
        vec![vec![
            pair("user", "mine"),
            pair("assistant", "re:mine"),
            pair("user", "again"),
        ]]
    );
    assert_eq!(b.stop(), 143);
}

/// The fleet client of the README (`examples/python/fleet_client.py`), run
/// with the interpreter `SETTLE_TEST_PYTHON` names (which needs the
/// `websockets` package): a turn on A; A is redeployed (SIGTERM); the client
/// sees the handoff, attaches on B and runs a turn there with the whole
/// conversation behind it, and closes the session once (`user_close`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_the_readmes_python_client_follows_a_handoff_to_another_process() {
    let Some(pg) = fleet_db() else { return };
    let Some(python) = std::env::var_os("SETTLE_TEST_PYTHON").filter(|p| !p.is_empty()) else {
        eprintln!("skipped: SETTLE_TEST_PYTHON is not set (see tests/tests/python.rs)");
        return;
    };
    let has_websockets = std::process::Command::new(&python)
        .args(["-c", "import websockets"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_websockets,
        "the fleet client needs `pip install websockets` in SETTLE_TEST_PYTHON's environment"
    );
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/python/fleet_client.py"
    );
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(script).arg(a.url()).arg(b.url());
    let mut client = sandbox.spawn_command(cmd);
    client.wait_for("the first turn", |out| out.contains("ready\n"));
    a.running.signal(Signal::SIGTERM);
    let status = client.exited_within(PATIENCE).expect("the client ends");
    let out = client.output().to_owned();
    assert!(status.success(), "the client failed: {out}");
    assert!(out.contains("re:first [completed]"), "{out}");
    assert!(out.contains("handoff: True"), "{out}");
    assert!(out.contains("re:second [completed]"), "{out}");
    assert!(out.trim_end().ends_with("user_close"), "{out}");
    assert_eq!(
        model.sent_with("second"),
        vec![vec![
            pair("user", "first"),
            pair("assistant", "re:first"),
            pair("user", "second"),
        ]],
        "the turn on B sends the conversation begun on A"
    );
    assert_eq!(
        status_code(a.running.exited_within(PATIENCE).expect("A exits")),
        143
    );
    let rows = rows(&pg.url);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["end_reason"], "user_close");
    assert_eq!(b.stop(), 143);
}

/// The README shows the fleet client in full, as the example file has it.
#[test]
fn g12_the_readme_shows_the_fleet_client_the_test_runs() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let client =
        std::fs::read_to_string(format!("{root}/examples/python/fleet_client.py")).unwrap();
    let (_, body) = client
        .split_once("\n\"\"\"\n")
        .expect("the example's code after its docstring");
    // Inside a list item of the README: two spaces in.
    let shown: Vec<String> = body
        .trim()
        .lines()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                format!("  {l}")
            }
        })
        .collect();
    assert!(
        readme.contains(&shown.join("\n")),
        "README.md's fleet client differs from examples/python/fleet_client.py"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_g12_a_tree_moves_whole_so_no_process_closes_a_parent_whose_child_runs_elsewhere() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut b = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut c = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut on_a = connect(&a.addr).await;
    let parent = create(&mut on_a, "parent").await;
    let child = on_a
        .ok(
            "session.create",
            json!({ "name": "child", "parent": parent }),
        )
        .await["id"]
        .as_u64()
        .unwrap();
    assert_eq!(a.stop(), 143);

    // Attaching the child at B adopts the parent with it.
    let mut on_b = connect(&b.addr).await;
    let attached = on_b.ok("session.attach", json!({ "id": child })).await;
    assert_eq!(attached["state"], "registered");
    assert_eq!(row(&pg.url, parent)["owner"], b.url());
    let mut on_c = connect(&c.addr).await;
    for method in ["session.attach", "session.close"] {
        let error = refusal(&mut on_c, method, json!({ "id": parent })).await;
        assert_eq!(error["data"]["kind"], "elsewhere", "{method}: {error}");
        assert_eq!(error["data"]["owner"], b.url(), "{method}: {error}");
    }
    // At B the parent is served, and closing it winds the child down first.
    on_b.ok("session.attach", json!({ "id": parent })).await;
    let closed = on_b.ok("session.close", json!({ "id": parent })).await;
    assert_eq!(closed["end_reason"], "user_close", "{closed}");
    let (p, k) = (row(&pg.url, parent), row(&pg.url, child));
    assert_eq!(p["state"], "finalized", "{p}");
    assert_eq!(k["state"], "finalized", "{k}");
    assert_eq!(k["end_reason"], "cancelled", "{k}");
    assert!(
        settle_tests::time(&k["finalized_at"]) <= settle_tests::time(&p["finalized_at"]),
        "{k} {p}"
    );
    assert_eq!(b.stop(), 143);
    assert_eq!(c.stop(), 143);
}

/// G12 with holds (SPEC §5): a hold a client was answered is one the fleet
/// keeps, even when its process is killed the moment after. Once the
/// killed process's lease expired, the peer's sweep releases its sessions;
/// past the idle TTL it reaps the one nobody held, and never the held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_g3_a_hold_answered_just_before_a_sigkill_is_kept_by_the_fleet() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let mut a = Node::start(&sandbox, &pg.url, &model, "2s");
    let mut b = Node::start_with(&sandbox, &pg.url, &model, "2s", &["--idle-ttl", "2s"]);
    let mut on_a = connect(&a.addr).await;
    let free = create(&mut on_a, "free").await;
    let held = create(&mut on_a, "held").await;
    on_a.ok("session.hold", json!({ "id": held, "hold": "input" }))
        .await;
    a.running.signal(Signal::SIGKILL);
    let _ = a.running.exited_within(PATIENCE);

    // B's sweep releases both, then reaps the one nobody holds.
    let start = Instant::now();
    while row(&pg.url, free)["state"] != "finalized" {
        assert!(
            start.elapsed() < PATIENCE,
            "B never reaped the free session"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(row(&pg.url, free)["end_reason"], "idle_reap");
    // Two more idle TTLs: the held one is still live, and adoptable.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        row(&pg.url, held)["state"],
        "registered",
        "{:?}",
        rows(&pg.url)
    );
    let mut on_b = connect(&b.addr).await;
    let attached = on_b.ok("session.attach", json!({ "id": held })).await;
    assert_eq!(attached["state"], "registered");
    on_b.ok("session.release", json!({ "id": held, "hold": "input" }))
        .await;
    assert_eq!(b.stop(), 143);
}

/// G12 with principals, once finalized: a principal's session closed on
/// one process is read and closed (how it ended) by it on every process,
/// a restarted one included, as it is listed to it there; another
/// principal is told `not_found` everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_a_principals_finalized_session_answers_it_on_every_process() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let tokens = sandbox.write("tokens", &format!("alice {ALICE}\nmallory {MALLORY}\n"));
    let tokens = tokens.to_string_lossy().into_owned();
    let model = ModelServer::start().await;
    let extra = ["--token-file", tokens.as_str()];
    let mut a = Node::start_with(&sandbox, &pg.url, &model, "30s", &extra);
    let mut b = Node::start_with(&sandbox, &pg.url, &model, "30s", &extra);
    let mut alice = connect_as(&a.addr, ALICE).await;
    let id = create(&mut alice, "alices").await;
    assert_eq!(turn(&mut alice, id, "mine").await.1, "completed");
    let end = alice.ok("session.close", json!({ "id": id })).await;
    assert_eq!(end["end_reason"], "user_close");
    drop(alice);
    assert_eq!(a.stop(), 143);
    let mut a = Node::start_with(&sandbox, &pg.url, &model, "30s", &extra);

    for node in [&a, &b] {
        let mut alice = connect_as(&node.addr, ALICE).await;
        let page = alice.ok("sessions.list", json!({})).await;
        assert_eq!(page["sessions"][0]["id"], id, "{page}");
        let read = alice.ok("session.read", json!({ "id": id })).await;
        let text: String = read["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "re:mine", "{read}");
        let end = alice.ok("session.close", json!({ "id": id })).await;
        assert_eq!(end["end_reason"], "user_close");
        let mut mallory = connect_as(&node.addr, MALLORY).await;
        for method in ["session.read", "session.close", "session.attach"] {
            let error = refusal(&mut mallory, method, json!({ "id": id })).await;
            assert_eq!(error["data"]["kind"], "not_found", "{method}: {error}");
        }
    }
    assert_eq!(a.stop(), 143);
    assert_eq!(b.stop(), 143);
}

/// G12 with the orphan reap (SPEC §10): the members of a tree adopted with
/// the session a client attached had their transport on the process that
/// handed them off; it went with that process. They are orphans from
/// their adoption, reaped once the grace has passed unless a client
/// attaches them, as the same tree is without a handoff, not kept for the
/// idle TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_g3_tree_members_adopted_unattached_are_orphans_reaped_after_the_grace() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let grace = ["--orphan-grace", "1s"];
    let mut a = Node::start_with(&sandbox, &pg.url, &model, "30s", &grace);
    let mut b = Node::start_with(&sandbox, &pg.url, &model, "30s", &grace);
    let mut on_a = connect(&a.addr).await;
    let parent = create(&mut on_a, "parent").await;
    let child = on_a
        .ok(
            "session.create",
            json!({ "name": "child", "parent": parent }),
        )
        .await["id"]
        .as_u64()
        .unwrap();
    a.running.signal(Signal::SIGTERM);
    on_a.until_closed().await;
    assert_eq!(
        status_code(a.running.exited_within(PATIENCE).expect("A exits")),
        143
    );

    let mut on_b = connect(&b.addr).await;
    on_b.ok("session.attach", json!({ "id": parent })).await;
    drop(on_b);
    let start = Instant::now();
    while [parent, child]
        .iter()
        .any(|id| row(&pg.url, *id)["state"] != "finalized")
    {
        assert!(
            start.elapsed() < PATIENCE,
            "never reaped: {:?}",
            rows(&pg.url)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in [parent, child] {
        assert_eq!(row(&pg.url, id)["end_reason"], "orphan_reap", "{id}");
    }
    assert_eq!(b.stop(), 143);
}

/// G8, G12: a session a live program owns that advertises no address (one
/// embedding the kernel, the Python package) cannot be reached through the
/// fleet's gateways, and they say so: `left_for_recovery` (no process
/// serves it here; `session.read` reads it), never `elsewhere` with no
/// owner, which tells a client it was handed off and that
/// `session.attach` adopts it (a client following that retried the attach
/// for as long as the program ran). The program keeps its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_g12_a_session_a_live_program_owns_without_an_address_is_not_said_handed_off() {
    let Some(pg) = fleet_db() else { return };
    let sandbox = Sandbox::new();
    let model = ModelServer::start().await;
    let store: Arc<dyn settle_store::SessionStore> =
        Arc::new(settle_store::Store::open(&pg.url).unwrap());
    let program = settle_runtime::Kernel::builder(store)
        .start()
        .await
        .unwrap();
    let session = program.register("embedded", None).await.unwrap();
    let id = session.id().get();
    let mut a = Node::start(&sandbox, &pg.url, &model, "30s");
    let mut client = connect(&a.addr).await;
    for (method, params) in [
        ("session.attach", json!({ "id": id })),
        ("turn.start", json!({ "id": id, "prompt": "hi" })),
        ("session.close", json!({ "id": id })),
    ] {
        let error = refusal(&mut client, method, params).await;
        assert_eq!(
            error["data"]["kind"], "left_for_recovery",
            "{method}: {error}"
        );
    }
    client.ok("session.read", json!({ "id": id })).await;
    assert_eq!(row(&pg.url, id)["state"], "registered", "untouched");
    assert_eq!(a.stop(), 143);
    drop(session);
    program.shutdown(Duration::from_secs(5)).await;
}
