//! The gateway's answers fit its frames, whatever a client sends or a model
//! streams, over 127.0.0.1 with real WebSocket clients: an error quotes a
//! bounded excerpt of a huge request; `sessions.list` pages; a chunk larger
//! than a frame arrives in parts; a client that comes back reads what it
//! missed from the store; a cap of held sessions refuses a new one instead
//! of evicting it at birth; the per-principal and per-turn limits refuse
//! with their kinds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::sync::Arc;
use std::time::Duration;

use gateway_support::{Client, Served};
use serde_json::{json, Value};
use settle_gateway::ScriptBook;
use settle_stream::TurnScript;

fn book() -> Arc<ScriptBook> {
    Arc::new(ScriptBook::new().otherwise(TurnScript::new(["fine"])))
}

/// A reply with one chunk of `big` bytes between two small ones.
fn big_reply(big: usize) -> (Arc<ScriptBook>, Vec<String>) {
    // Quotes and newlines, escaped in JSON, make the frame larger than the text.
    let unit = "0123456789abcdé\"\n";
    let large: String = unit.repeat(big / unit.len());
    let chunks = vec!["head".to_owned(), large, "tail".to_owned()];
    let book = ScriptBook::new()
        .otherwise(TurnScript::new(["fine"]))
        .reply("big", TurnScript::new(chunks.clone()));
    (Arc::new(book), chunks)
}

/// The chunks of session `id`'s turn up to its `turn.ended`, parts joined
/// by `seq`: each chunk's text, and how many notifications carried them.
async fn joined_turn(client: &mut Client, id: u64) -> (Vec<String>, usize, Value) {
    let mut chunks: Vec<String> = Vec::new();
    let mut frames = 0;
    loop {
        let message = client.next_notification().await.expect("closed mid-turn");
        let params = message["params"].clone();
        assert_eq!(params["id"], id, "{message}");
        match message["method"].as_str() {
            Some("turn.chunk") => {
                frames += 1;
                let seq = params["seq"].as_u64().unwrap() as usize;
                let part = params["part"].as_u64().unwrap_or(0);
                let text = params["text"].as_str().unwrap();
                if part == 0 {
                    assert_eq!(seq, chunks.len(), "{}", &message.to_string()[..200]);
                    chunks.push(text.to_owned());
                } else {
                    assert_eq!(seq + 1, chunks.len());
                    chunks[seq].push_str(text);
                }
            }
            Some("turn.ended") => return (chunks, frames, params),
            _ => panic!("not a turn notification: {message}"),
        }
    }
}

async fn create(client: &mut Client, name: &str) -> u64 {
    client.ok("session.create", json!({ "name": name })).await["id"]
        .as_u64()
        .unwrap()
}

/// The longest run of a message between two quote marks (or before the
/// first, or after the last): what it quotes of a request at most.
fn longest_quote(message: &str) -> usize {
    message
        .split(['`', '"'])
        .map(|run| run.chars().count())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn an_error_quotes_a_bounded_excerpt_of_a_huge_request_and_the_connection_stays_usable() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let mut client = served.client().await;
    let id = create(&mut client, "first").await;
    // About 900 KB of quotes: each one escaped twice over in an echo.
    let huge = "\"".repeat(450_000);
    let long = "Z".repeat(100_000);
    let cases = [
        ("turn.start", json!({ "id": huge, "prompt": "hi" })),
        ("session.create", json!({ "name": "a", huge.clone(): 1 })),
        (huge.as_str(), json!({})),
        // serde's own messages, each quoting the request once.
        ("sessions.list", json!({ long.clone(): 1 })),
        ("session.hold", json!({ "id": id, "hold": long })),
        ("sessions.list", json!({ "state": long })),
        (long.as_str(), json!({})),
    ];
    for (method, params) in cases {
        let error = client.call(method, params).await.unwrap_err();
        assert_eq!(
            error["data"]["kind"],
            "bad_request",
            "{}",
            &error.to_string()[..200]
        );
        let message = error["message"].as_str().unwrap();
        let chars = message.chars().count();
        assert!(chars <= 600, "a message of {chars} characters: {message}");
        // A quote of 200 characters, and the "…" that says it was cut.
        let quoted = longest_quote(message);
        assert!(quoted <= 201, "{quoted} characters quoted: {message}");
        assert!(message.contains("characters in all"), "{message}");
    }
    // Still answered on the same connection.
    let id = create(&mut client, "after").await;
    assert!(id > 0);
    served.shut_down().await;
}

#[tokio::test]
async fn a_request_with_a_huge_id_is_answered_to_null_and_the_connection_stays_usable() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let mut client = served.client().await;
    // A request just under the 1 MiB message bound, nearly all of it its id:
    // echoed, the answer would not fit in the connection's queue.
    let id = "I".repeat(1024 * 1024 - 200);
    for method in ["no.such.method", "sessions.list"] {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}});
        client.send_raw(&request.to_string()).await;
        let error = client.answer_to(&Value::Null).await.unwrap_err();
        assert_eq!(error["data"]["kind"], "bad_request", "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("at most 256"), "{message}");
    }
    // A long id within the bound is echoed as it is.
    let fine = "i".repeat(256);
    let request = json!({"jsonrpc": "2.0", "id": fine, "method": "sessions.list", "params": {}});
    client.send_raw(&request.to_string()).await;
    assert!(client.answer_to(&json!(fine)).await.is_ok());
    assert!(create(&mut client, "after").await > 0);
    served.shut_down().await;
}

#[tokio::test]
async fn g3_a_create_over_a_cap_of_held_sessions_is_refused_over_capacity_and_writes_nothing() {
    let mut served = Served::tcp(
        book(),
        |k| k.lru_cap(Some(3)),
        |g| g.drain_timeout(std::time::Duration::from_millis(50)),
    )
    .await;
    let mut client = served.client().await;
    let mut held = Vec::new();
    for name in ["a", "b", "c"] {
        let id = create(&mut client, name).await;
        client
            .ok("session.hold", json!({ "id": id, "hold": "input" }))
            .await;
        held.push(id);
    }
    for _ in 0..3 {
        let error = client
            .call("session.create", json!({ "name": "late" }))
            .await
            .unwrap_err();
        assert_eq!(error["data"]["kind"], "over_capacity", "{error}");
        assert_eq!(error["code"], -32005);
    }
    let rows = served.kernel.list_sessions(None).await.unwrap();
    assert_eq!(rows.len(), 3, "a refused create wrote a row");
    assert!(rows.iter().all(|r| r.end_reason.is_none()), "{rows:?}");
    assert!(client.held().is_empty(), "{:?}", client.held());

    // Released, the oldest is evicted for the next one; the new one lives.
    client
        .ok("session.release", json!({ "id": held[0], "hold": "input" }))
        .await;
    let fresh = create(&mut client, "fresh").await;
    let finalized = client.expect("session.finalized").await;
    assert_eq!(
        finalized,
        json!({ "id": held[0], "end_reason": "lru_evict" })
    );
    assert_eq!(
        client.ok("session.attach", json!({ "id": fresh })).await,
        json!({ "state": "registered" })
    );
    client
        .ok("turn.start", json!({ "id": fresh, "prompt": "hi" }))
        .await;
    let (_, ended) = client.turn(fresh).await;
    assert_eq!(ended["outcome"], "completed");
    served.shut_down().await;
}

/// Clients creating sessions at once under a full `--max-sessions` cap
/// evict each other's new sessions (least recently active first), some
/// before their creator could attach: such a create is not refused (its
/// session was made), it is answered with its id and then, at once, the
/// session's `session.finalized` (`lru_evict`), as any attached session
/// the cap evicts. No create is answered `session_closed` for an id it
/// was never given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_creates_racing_under_a_full_cap_are_answered_their_id_and_then_their_eviction() {
    let mut served = Served::tcp(
        book(),
        |k| k.lru_cap(Some(2)),
        |g| g.drain_timeout(std::time::Duration::from_millis(50)),
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(served.client().await);
    }
    let runs: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..15 {
                    match client.call("session.create", json!({ "name": "r" })).await {
                        Ok(answer) => ids.push(answer["id"].as_u64().unwrap()),
                        Err(error) => panic!("a create was refused: {error}"),
                    }
                }
                (client, ids)
            })
        })
        .collect();
    let mut done = Vec::new();
    for run in runs {
        done.push(run.await.unwrap());
    }
    // Every id a client was given is either live or said to be evicted.
    let mut given = 0;
    let mut told = 0;
    for (mut client, ids) in done {
        while let Some(note) = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            client.next_notification(),
        )
        .await
        .ok()
        .flatten()
        {
            assert_eq!(note["method"], "session.finalized", "{note}");
            assert_eq!(note["params"]["end_reason"], "lru_evict", "{note}");
            let id = note["params"]["id"].as_u64().unwrap();
            assert!(
                ids.contains(&id),
                "told the end of {id}, never given: {note}"
            );
            told += 1;
        }
        given += ids.len();
    }
    assert_eq!(given, 8 * 15);
    // All but the two the cap keeps were evicted, and each creator heard it.
    assert_eq!(told, given - 2);
    served.shut_down().await;
}

/// The bytes of conversation all sessions keep in memory are bounded
/// (`--max-history-memory`): each session's history is (`max_history_bytes`)
/// and so is the number of sessions, but not their product, and a client
/// filling a thousand sessions with megabyte prompts made the gateway hold
/// about 19 GiB. A `turn.start` past the bound is refused `over_capacity`,
/// writing nothing; a finalized session gives its bytes back.
#[tokio::test]
async fn a_turn_start_past_the_conversation_memory_bound_is_refused_and_a_closed_session_gives_it_back(
) {
    let mut served = Served::tcp(
        book(),
        |k| k,
        |g| {
            g.max_history_memory(Some(1000))
                .drain_timeout(std::time::Duration::from_millis(50))
        },
    )
    .await;
    let mut client = served.client().await;
    let first = create(&mut client, "first").await;
    let second = create(&mut client, "second").await;
    let prompt = "p".repeat(600);
    client
        .ok("turn.start", json!({ "id": first, "prompt": prompt }))
        .await;
    let (_, ended) = client.turn(first).await;
    assert_eq!(ended["outcome"], "completed", "{ended}");
    let error = client
        .call("turn.start", json!({ "id": second, "prompt": prompt }))
        .await
        .unwrap_err();
    assert_eq!(error["data"]["kind"], "over_capacity", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("--max-history-memory 1000"),
        "{error}"
    );
    let rows = served.kernel.list_sessions(None).await.unwrap();
    let row = rows.iter().find(|r| r.id.get() == second).unwrap();
    assert_eq!(row.turns, 0, "the refused turn wrote something: {row:?}");
    client.ok("session.close", json!({ "id": first })).await;
    assert_eq!(client.expect("session.finalized").await["id"], first);
    client
        .ok("turn.start", json!({ "id": second, "prompt": prompt }))
        .await;
    let (_, ended) = client.turn(second).await;
    assert_eq!(ended["outcome"], "completed", "{ended}");
    served.shut_down().await;
}

/// Every page of `sessions.list` with `params`, following `next_cursor`:
/// the ids, and the size of the largest answer.
async fn all_pages(client: &mut Client, params: Value) -> (Vec<Vec<u64>>, usize) {
    let mut pages = Vec::new();
    let mut largest = 0;
    let mut params = params;
    loop {
        let page = client.ok("sessions.list", params.clone()).await;
        largest = largest.max(page.to_string().len());
        let ids = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_u64().unwrap())
            .collect();
        pages.push(ids);
        match page["next_cursor"].as_str() {
            Some(cursor) => params["cursor"] = json!(cursor),
            None => return (pages, largest),
        }
    }
}

#[tokio::test]
async fn sessions_list_pages_within_a_frame_past_thousands_of_sessions() {
    let mut served = Served::tcp(book(), |k| k.lru_cap(None).idle_ttl(None), |g| g).await;
    // 4,500 rows with the longest names: about 2 MB as one array.
    let name = "n".repeat(settle_gateway::MAX_NAME_CHARS);
    let mut all = Vec::new();
    for _ in 0..4_500 {
        all.push(
            served
                .kernel
                .register(&name, None)
                .await
                .unwrap()
                .id()
                .get(),
        );
    }
    let mut client = served.client().await;
    let watched = create(&mut client, "watched").await;
    all.push(watched);

    // The default page is 100 rows.
    let first = client.ok("sessions.list", json!({})).await;
    assert_eq!(first["sessions"].as_array().unwrap().len(), 100);
    assert!(first["next_cursor"].is_string());

    // The largest pages: each within half the 1 MiB frame, every session once, in order.
    let (pages, largest) = all_pages(&mut client, json!({ "limit": 1000 })).await;
    assert!(largest <= 512 * 1024, "a page of {largest} bytes");
    assert!(pages.len() >= 5, "{} pages", pages.len());
    let listed: Vec<u64> = pages.concat();
    assert_eq!(listed, all);
    for page in &pages[..pages.len() - 1] {
        assert!(!page.is_empty());
    }

    // Filters page too: by state, by registration time.
    let (finalized, _) = all_pages(&mut client, json!({ "state": "finalized" })).await;
    assert_eq!(finalized.concat(), Vec::<u64>::new());
    let future = humantime::format_rfc3339(
        std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
    );
    let (later, _) = all_pages(&mut client, json!({ "since": future.to_string() })).await;
    assert_eq!(later, [Vec::<u64>::new()]);
    for bad in [
        json!({ "limit": 0 }),
        json!({ "limit": 1001 }),
        json!({ "cursor": "not-a-cursor" }),
        json!({ "since": "yesterday" }),
    ] {
        assert_eq!(
            client.refused("sessions.list", bad.clone()).await,
            "bad_request",
            "{bad}"
        );
    }
    // The connection was never dropped: its session is still attached.
    assert!(client.held().is_empty());
    client
        .ok("turn.start", json!({ "id": watched, "prompt": "hi" }))
        .await;
    assert_eq!(client.turn(watched).await.0, ["fine"]);
    served.shut_down().await;
}

/// A client of the gateway at `addr` with `token`.
async fn connect_as(served: &Served, token: &str) -> Client {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let gateway_support::Address::Tcp(addr) = served.address.clone() else {
        unreachable!()
    };
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    Client::new(tokio_tungstenite::connect_async(request).await.unwrap().0)
}

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789ab";

#[tokio::test]
async fn a_principals_pages_are_full_of_its_own_sessions_only() {
    let tokens = settle_gateway::Tokens::parse(&format!("alice {ALICE}\nbob {BOB}\n")).unwrap();
    let mut served = Served::tcp(book(), |k| k.lru_cap(None), |g| g.tokens(tokens)).await;
    let mut alice = connect_as(&served, ALICE).await;
    let mut bob = connect_as(&served, BOB).await;
    let (mut hers, mut his) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        hers.push(create(&mut alice, "hers").await);
        for _ in 0..6 {
            his.push(create(&mut bob, "his").await);
        }
    }
    let (pages, _) = all_pages(&mut alice, json!({ "limit": 2 })).await;
    assert_eq!(
        pages,
        [hers[..2].to_vec(), hers[2..4].to_vec(), hers[4..].to_vec()]
    );
    assert_eq!(
        bob.refused("session.read", json!({ "id": hers[0] })).await,
        "not_found"
    );
    let (pages, _) = all_pages(&mut bob, json!({ "limit": 10 })).await;
    assert_eq!(
        pages,
        [his[..10].to_vec(), his[10..20].to_vec(), his[20..].to_vec()]
    );
    served.shut_down().await;
}

/// Found from outside: under `--max-sessions` with tokens, one principal's
/// creates evicted another principal's idle sessions. A create at the cap
/// evicts only its own principal's least recently active idle session;
/// with none of its own it is refused `over_capacity`, and the other
/// principal's sessions stay, attached and usable.
#[tokio::test]
async fn g3_a_create_at_the_cap_evicts_only_its_own_principals_idle_sessions() {
    let tokens = settle_gateway::Tokens::parse(&format!("alice {ALICE}\nbob {BOB}\n")).unwrap();
    let mut served = Served::tcp(
        book(),
        |k| k.lru_cap(Some(3)).idle_ttl(None),
        |g| g.tokens(tokens),
    )
    .await;
    let mut alice = connect_as(&served, ALICE).await;
    let mut bob = connect_as(&served, BOB).await;
    let hers = [
        create(&mut alice, "a1").await,
        create(&mut alice, "a2").await,
    ];
    let his = create(&mut bob, "b1").await;
    // Bob at the cap: his own idle session goes, though Alice's are older.
    let next = create(&mut bob, "b2").await;
    assert_eq!(
        bob.expect("session.finalized").await,
        json!({ "id": his, "end_reason": "lru_evict" })
    );
    // Bob again, his session held: Alice's idle ones are not his to end.
    bob.ok("session.hold", json!({ "id": next, "hold": "input" }))
        .await;
    for _ in 0..3 {
        let error = bob
            .call("session.create", json!({ "name": "b3" }))
            .await
            .unwrap_err();
        assert_eq!(error["data"]["kind"], "over_capacity", "{error}");
    }
    for id in hers {
        alice
            .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
            .await;
        let (_, ended) = alice.turn(id).await;
        assert_eq!(ended["outcome"], "completed", "alice's session {id}");
    }
    // Alice at the cap evicts her own least recently active one.
    let third = create(&mut alice, "a3").await;
    assert_eq!(
        alice.expect("session.finalized").await,
        json!({ "id": hers[0], "end_reason": "lru_evict" })
    );
    let live: Vec<u64> = served
        .kernel
        .list_sessions(None)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.end_reason.is_none())
        .map(|r| r.id.get())
        .collect();
    let mut want = vec![hers[1], next, third];
    want.sort_unstable();
    let mut live = live;
    live.sort_unstable();
    assert_eq!(live, want);
    served.shut_down().await;
}

#[tokio::test]
async fn a_chunk_larger_than_a_frame_reaches_every_watcher_in_parts_that_join_back() {
    let (book, chunks) = big_reply(3 * 1024 * 1024);
    let mut served = Served::tcp(book, |k| k, |g| g).await;
    let mut first = served.client().await;
    let mut second = served.client().await;
    let id = create(&mut first, "big").await;
    second.ok("session.attach", json!({ "id": id })).await;
    first
        .ok("turn.start", json!({ "id": id, "prompt": "big" }))
        .await;
    for client in [&mut first, &mut second] {
        let (got, frames, ended) = joined_turn(client, id).await;
        assert_eq!(ended["outcome"], "completed");
        assert!(got == chunks, "the chunks did not join back");
        assert!(frames > 3, "{frames} frames");
    }
    // Neither was disconnected.
    assert_eq!(served.gateway.connections(), 2);
    assert_eq!(
        second.ok("session.detach", json!({ "id": id })).await,
        json!({ "state": "registered" })
    );
    served.shut_down().await;
}

/// Every page of `session.read` from `from`: the chunks' texts joined by
/// `seq`, and the largest answer.
async fn read_all(client: &mut Client, from: Value) -> (Vec<String>, usize, Value) {
    let mut params = from;
    let mut chunks: Vec<(u64, String)> = Vec::new();
    let mut largest = 0;
    loop {
        let page = client.ok("session.read", params.clone()).await;
        largest = largest.max(page.to_string().len());
        for chunk in page["chunks"].as_array().unwrap() {
            let seq = chunk["seq"].as_u64().unwrap();
            let text = chunk["text"].as_str().unwrap();
            match chunks.last_mut() {
                Some((last, joined)) if *last == seq => joined.push_str(text),
                _ => chunks.push((seq, text.to_owned())),
            }
        }
        if page["next"].is_null() {
            return (chunks.into_iter().map(|(_, t)| t).collect(), largest, page);
        }
        for key in ["turn", "seq", "part"] {
            params[key] = page["next"][key].clone();
        }
    }
}

#[tokio::test]
async fn a_client_that_comes_back_reads_what_it_missed_from_the_store() {
    let (book, chunks) = big_reply(2 * 1024 * 1024);
    let mut served = Served::tcp(book, |k| k, |g| g).await;
    let mut gone = served.client().await;
    let id = create(&mut gone, "missed").await;
    gone.ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    gone.turn(id).await;
    gone.ok("turn.start", json!({ "id": id, "prompt": "big" }))
        .await;
    let (_, _, ended) = joined_turn(&mut gone, id).await;
    assert_eq!(ended["outcome"], "completed");
    drop(gone);

    // Another connection reads the last turn back, page by page, each within a frame.
    let mut back = served.client().await;
    let (read, largest, last) = read_all(&mut back, json!({ "id": id })).await;
    assert!(read == chunks, "the read did not join back");
    assert!(largest <= 512 * 1024, "a page of {largest} bytes");
    assert_eq!(
        (
            last["turn"].clone(),
            last["turns"].clone(),
            last["outcome"].clone()
        ),
        (json!(2), json!(2), json!("completed"))
    );
    // From a given seq; an earlier turn by its number.
    let (from_tail, _, _) = read_all(&mut back, json!({ "id": id, "turn": 2, "seq": 2 })).await;
    assert_eq!(from_tail, ["tail"]);
    let (first, _, _) = read_all(&mut back, json!({ "id": id, "turn": 1 })).await;
    assert_eq!(first, ["fine"]);
    assert_eq!(
        back.refused("session.read", json!({ "id": id, "turn": 9 }))
            .await,
        "bad_request"
    );
    assert_eq!(
        back.refused("session.read", json!({ "id": 999 })).await,
        "not_found"
    );
    served.shut_down().await;
}

#[tokio::test]
async fn a_prompt_or_a_history_past_its_bound_is_refused_too_large_and_nothing_is_written() {
    let mut served = Served::tcp(
        book(),
        |k| k.max_prompt_bytes(Some(10)).max_history_bytes(Some(30)),
        |g| g,
    )
    .await;
    let mut client = served.client().await;
    let id = create(&mut client, "bounded").await;
    let error = client
        .call("turn.start", json!({ "id": id, "prompt": "x".repeat(11) }))
        .await
        .unwrap_err();
    assert_eq!(
        (error["code"].clone(), error["data"]["kind"].clone()),
        (json!(-32007), json!("too_large"))
    );
    // 10 + 4 ("fine"), then 24 + 4: the third prompt would make 38 bytes.
    for _ in 0..2 {
        client
            .ok("turn.start", json!({ "id": id, "prompt": "y".repeat(10) }))
            .await;
        assert_eq!(client.turn(id).await.0, ["fine"]);
    }
    assert_eq!(
        client
            .refused("turn.start", json!({ "id": id, "prompt": "y".repeat(10) }))
            .await,
        "too_large"
    );
    assert_eq!(served.row(id).await.turns, 2, "a refused turn was written");
    served.shut_down().await;
}

/// The per-message limit is the caller's (a prompt, a tool's result): a
/// reply the model streamed and the kernel took goes back with the
/// history, however long, and only the whole history's limit bounds it.
#[tokio::test]
async fn a_reply_longer_than_a_prompt_may_be_does_not_refuse_the_turns_after_it() {
    let (book, chunks) = big_reply(64 * 1024);
    let mut served = Served::tcp(
        book,
        |k| {
            k.max_prompt_bytes(Some(1024))
                .max_history_bytes(Some(1024 * 1024))
        },
        |g| g,
    )
    .await;
    let mut client = served.client().await;
    let id = create(&mut client, "long reply").await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "big" }))
        .await;
    let (got, _, ended) = joined_turn(&mut client, id).await;
    assert_eq!(ended["outcome"], "completed");
    assert!(got == chunks, "the reply did not join back");
    for _ in 0..2 {
        client
            .ok("turn.start", json!({ "id": id, "prompt": "and then?" }))
            .await;
        assert_eq!(client.turn(id).await.0, ["fine"]);
    }
    // A prompt is still held to its limit.
    assert_eq!(
        client
            .refused(
                "turn.start",
                json!({ "id": id, "prompt": "y".repeat(1025) })
            )
            .await,
        "too_large"
    );
    served.shut_down().await;
}

#[tokio::test]
async fn a_turn_past_its_chunks_or_bytes_ends_too_large_and_the_store_has_what_was_sent() {
    // At a model's pace, so that the cancel lands before the reply ends.
    let pace = std::time::Duration::from_millis(20);
    let book = ScriptBook::new()
        .otherwise(TurnScript::new(["fine"]))
        .reply(
            "many",
            TurnScript::new(["a", "b", "c", "d", "e", "f", "g", "h"]).chunk_delay(pace),
        )
        .reply(
            "wide",
            TurnScript::new([
                "x".repeat(60),
                "y".repeat(60),
                "z".repeat(60),
                "w".repeat(60),
            ])
            .chunk_delay(pace),
        );
    let mut served = Served::tcp(
        Arc::new(book),
        |k| k.max_turn_chunks(Some(3)).max_turn_bytes(Some(100)),
        |g| g,
    )
    .await;
    let mut client = served.client().await;
    for (prompt, delivered) in [("many", 3), ("wide", 1)] {
        let id = create(&mut client, prompt).await;
        client
            .ok("turn.start", json!({ "id": id, "prompt": prompt }))
            .await;
        let (chunks, ended) = client.turn(id).await;
        assert_eq!(chunks.len(), delivered, "{prompt}: {chunks:?}");
        assert_eq!(ended["error"]["kind"], "too_large", "{prompt}: {ended}");
        assert_eq!(ended["outcome"], "failed", "{prompt}: {ended}");
        // The chunk past the limit was neither sent nor stored, and the
        // turn's end is stored as it was told.
        let (stored, _, last) = read_all(&mut client, json!({ "id": id, "turn": 1 })).await;
        assert_eq!(stored.len(), delivered, "{prompt}: stored {stored:?}");
        assert_eq!(last["outcome"], "failed", "{prompt}: {last}");
        assert_eq!(last["error"]["kind"], "too_large", "{prompt}: {last}");
        // The session takes the next turn.
        client
            .ok("turn.start", json!({ "id": id, "prompt": "again" }))
            .await;
        let (_, ended) = client.turn(id).await;
        assert_eq!(ended["outcome"], "completed");
    }
    served.shut_down().await;
}

#[tokio::test]
async fn a_principal_past_its_holds_is_refused_over_capacity_until_one_is_released() {
    let mut served = Served::tcp(book(), |k| k, |g| g.max_holds_per_principal(Some(2))).await;
    let mut client = served.client().await;
    let a = create(&mut client, "a").await;
    let b = create(&mut client, "b").await;
    let hold = |id: u64| json!({ "id": id, "hold": "input" });
    client.ok("session.hold", hold(a)).await;
    client.ok("session.hold", hold(b)).await;
    assert_eq!(
        client.refused("session.hold", hold(a)).await,
        "over_capacity"
    );
    // A release gives its place back; so does a finalize.
    client.ok("session.release", hold(a)).await;
    client.ok("session.hold", hold(a)).await;
    assert_eq!(
        client.refused("session.hold", hold(b)).await,
        "over_capacity"
    );
    client.ok("session.close", json!({ "id": b })).await;
    client.expect("session.finalized").await;
    client.ok("session.hold", hold(a)).await;
    // A release of no hold gives nothing back.
    let c = create(&mut client, "c").await;
    client.ok("session.release", hold(c)).await;
    assert_eq!(
        client.refused("session.hold", hold(c)).await,
        "over_capacity"
    );
    served.shut_down().await;
}

/// A provider whose every request fails with a message of `len` bytes.
struct Verbose(usize);

#[async_trait::async_trait]
impl settle_stream::Provider for Verbose {
    async fn open(
        &self,
        _: &settle_stream::Request,
    ) -> Result<settle_stream::ProviderStream, settle_stream::StreamError> {
        let message = "\"".repeat(self.0);
        Err(settle_stream::StreamErrorKind::Provider { message }.into())
    }
}

#[tokio::test]
async fn a_turn_that_fails_with_a_huge_message_ends_within_a_frame() {
    let mut served = Served::tcp(Arc::new(Verbose(900_000)), |k| k, |g| g).await;
    let mut client = served.client().await;
    let id = create(&mut client, "verbose").await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "hi" }))
        .await;
    let (_, ended) = client.turn(id).await;
    assert_eq!(ended["outcome"], "failed");
    let message = ended["error"]["message"].as_str().unwrap();
    assert!(message.chars().count() <= 700, "{}", message.len());
    assert!(message.contains("characters in all"), "{message}");
    assert!(client.held().is_empty());
    client.ok("sessions.list", json!({})).await;
    served.shut_down().await;
}

/// Pings sent by a client that reads nothing: how many pongs it finds
/// waiting for it when it starts to read, up to the answer of a request
/// sent after the pings or the end of the connection (the gateway may cut a
/// client whose write buffer is full).
async fn pongs_waiting_after_pings(addr: std::net::SocketAddr, pings: usize) -> usize {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive window, so that little of what the server sends can
    // wait in this side's kernel.
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), stream)
        .await
        .unwrap();
    let payload = vec![7u8; 125];
    for _ in 0..pings {
        if ws
            .feed(Message::Ping(payload.clone().into()))
            .await
            .is_err()
        {
            break;
        }
    }
    let last = json!({"jsonrpc": "2.0", "id": "last", "method": "sessions.list", "params": {}});
    let _ = ws.send(Message::text(last.to_string())).await;
    let mut pongs = 0;
    let ended = tokio::time::timeout(settle_tests::PATIENCE, async {
        while let Some(Ok(frame)) = ws.next().await {
            match frame {
                Message::Pong(_) => pongs += 1,
                Message::Text(text) if text.as_str().contains("\"last\"") => return,
                _ => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "neither answered nor ended after {pongs} pongs"
    );
    pongs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pings_and_never_reads_does_not_grow_the_servers_buffers() {
    let mut served = Served::tcp(book(), |k| k, |g| g).await;
    let gateway_support::Address::Tcp(addr) = served.address.clone() else {
        unreachable!("a TCP gateway")
    };
    // 200,000 pings of 125 bytes: 25 MB of pongs owed. What the server may
    // keep for a client is its write buffer (a frame and a little more) and
    // what the two kernels' socket buffers hold; the rest of a ping flood's
    // pongs are replaced, not queued.
    let pings = 200_000;
    let pongs = pongs_waiting_after_pings(addr, pings).await;
    assert!(
        pongs < pings / 2,
        "{pongs} pongs of {pings} pings were kept for a client that read nothing"
    );
    // The gateway still answers.
    let mut client = served.client().await;
    assert!(create(&mut client, "after").await > 0);
    served.shut_down().await;
}

#[tokio::test]
async fn a_client_reading_a_turn_of_many_large_chunks_is_not_cut_for_not_keeping_up() {
    // Forty chunks of 200 KB, 8 MB in all, which the provider has ready at
    // once: eight times the connection's queue. The pump must let the
    // connection's writer send between them, however fast the chunks come.
    let unit = "0123456789abcdé\"\n";
    let large: String = unit.repeat(200_000 / unit.len());
    let chunks = vec![large; 40];
    let book = ScriptBook::new()
        .otherwise(TurnScript::new(["fine"]))
        .reply("many", TurnScript::new(chunks.clone()));
    let mut served = Served::tcp(Arc::new(book), |k| k, |g| g).await;
    let mut client = served.client().await;
    let id = create(&mut client, "many").await;
    client
        .ok("turn.start", json!({ "id": id, "prompt": "many" }))
        .await;
    let (got, _, ended) = joined_turn(&mut client, id).await;
    assert_eq!(ended["outcome"], "completed", "{ended}");
    assert_eq!(got.len(), chunks.len());
    assert!(got == chunks, "the chunks did not arrive whole");
    assert_eq!(served.gateway.connections(), 1, "the reader was cut");
    served.shut_down().await;
}

/// A memory store whose reads of a session (its row, its principal) fail
/// once `down`, as a PostgreSQL server that stopped answering: everything
/// else is the memory store's.
struct Dark {
    store: settle_store::MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
    /// Once set, every lease renewal is answered `LeaseLost`, as the store
    /// does once another process may have recovered this one's sessions.
    lease_lost: Arc<std::sync::atomic::AtomicBool>,
    /// Once set, a read of a session's transcript takes half a second.
    slow_reads: Arc<std::sync::atomic::AtomicBool>,
}

impl Dark {
    fn read(&self) -> Result<(), settle_store::StoreError> {
        match self.down.load(std::sync::atomic::Ordering::SeqCst) {
            true => Err(settle_store::StoreError::Unavailable),
            false => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl settle_store::SessionStore for Dark {
    async fn register_owner(
        &self,
        owner: settle_store::OwnerInfo,
        ttl: Duration,
    ) -> Result<settle_store::OwnerId, settle_store::StoreError> {
        self.store.register_owner(owner, ttl).await
    }
    async fn renew_lease(
        &self,
        owner: settle_store::OwnerId,
        ttl: Duration,
    ) -> Result<std::time::SystemTime, settle_store::StoreError> {
        if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(settle_store::StoreError::LeaseLost(owner));
        }
        self.store.renew_lease(owner, ttl).await
    }
    async fn reserve_ids(
        &self,
        count: u32,
    ) -> Result<std::ops::Range<u64>, settle_store::StoreError> {
        self.store.reserve_ids(count).await
    }
    fn append_chunk(
        &self,
        id: settle_store::SessionId,
        turn: u32,
        chunk: settle_store::NewChunk,
    ) -> settle_store::ChunkReceipt {
        self.store.append_chunk(id, turn, chunk)
    }
    async fn flush(&self) -> Result<(), settle_store::StoreError> {
        self.store.flush().await
    }
    async fn apply(
        &self,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, settle_store::StoreError>> {
        self.store.apply(batch).await
    }
    fn applies_in_order(&self) -> bool {
        self.store.applies_in_order()
    }
    async fn recover(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<settle_store::RecoveryReport, settle_store::StoreError> {
        self.store.recover(options).await
    }
    async fn recovery_candidates(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<Vec<settle_store::RecoveryCandidate>, settle_store::StoreError> {
        self.store.recovery_candidates(options).await
    }
    async fn list_sessions(
        &self,
        filter: settle_store::SessionFilter,
    ) -> Result<Vec<settle_store::SessionRow>, settle_store::StoreError> {
        self.store.list_sessions(filter).await
    }
    async fn last_session(
        &self,
        state: Option<settle_store::State>,
    ) -> Result<Option<settle_store::SessionId>, settle_store::StoreError> {
        self.store.last_session(state).await
    }
    async fn session_detail(
        &self,
        id: settle_store::SessionId,
    ) -> Result<settle_store::SessionDetail, settle_store::StoreError> {
        self.read()?;
        if self.slow_reads.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.store.session_detail(id).await
    }
    async fn memories(
        &self,
        id: settle_store::SessionId,
    ) -> Result<Vec<settle_store::MemoryRow>, settle_store::StoreError> {
        self.store.memories(id).await
    }
    async fn principal(
        &self,
        session: settle_store::SessionId,
    ) -> Result<Option<String>, settle_store::StoreError> {
        self.read()?;
        self.store.principal(session).await
    }
}

/// Found from outside (SPEC §10): while the store did not answer reads,
/// another principal's sessions answered `not_found` at once and ids that
/// do not exist failed `internal` (after the store timeout, on a stopped
/// PostgreSQL), so any principal could list which ids were someone
/// else's. Both are now asked of the store the same way: during the outage
/// they fail alike, and once it is over both are `not_found`; the owner
/// still uses its own.
#[tokio::test]
async fn another_principals_session_answers_as_a_missing_one_even_while_the_store_is_down() {
    let tokens = settle_gateway::Tokens::parse(&format!("alice {ALICE}\nbob {BOB}\n")).unwrap();
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut served = Served::tcp_over(
        {
            let down = down.clone();
            move |store| {
                Arc::new(Dark {
                    store,
                    down,
                    lease_lost: Arc::default(),
                    slow_reads: Arc::default(),
                })
            }
        },
        book(),
        |k| k.lru_cap(None).store_timeout(Duration::from_secs(2)),
        |g| g.tokens(tokens),
    )
    .await;
    let mut alice = connect_as(&served, ALICE).await;
    let mut bob = connect_as(&served, BOB).await;
    let hers = create(&mut alice, "hers").await;
    let missing = hers + 1_000;
    let methods = [
        (
            "session.read",
            json!({ "id": hers }),
            json!({ "id": missing }),
        ),
        (
            "session.attach",
            json!({ "id": hers }),
            json!({ "id": missing }),
        ),
        (
            "session.close",
            json!({ "id": hers }),
            json!({ "id": missing }),
        ),
    ];
    for up in [false, true] {
        down.store(!up, std::sync::atomic::Ordering::SeqCst);
        for (method, theirs, none) in &methods {
            let a = bob.call(method, theirs.clone()).await;
            let b = bob.call(method, none.clone()).await;
            let said = |answer: Result<Value, Value>| match answer {
                Ok(value) => format!("ok {value}"),
                Err(error) => format!("{} {}", error["code"], error["data"]["kind"]),
            };
            let (a, b) = (said(a), said(b));
            assert_eq!(a, b, "{method}, store up: {up}");
            if up {
                assert!(a.contains("not_found"), "{method}: {a}");
            }
        }
    }
    // The owner still uses its own.
    alice.ok("session.read", json!({ "id": hers })).await;
    served.shut_down().await;
}

/// Found from outside (G8, SPEC §10): a gateway whose kernel lost its lease
/// (a lock on the database past the lease) told its clients
/// `server.shutdown` with the configured drain and no cause, while the
/// shutdown a lost lease begins has no drain: a client waited for a drain
/// that never came and could not tell a lost lease from an operator's
/// stop. It is told `drain_ms: 0` and `reason: "lease_lost"`.
#[tokio::test]
async fn g8_a_lost_lease_is_told_to_clients_as_the_shutdowns_cause_with_no_drain() {
    let lease_lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut served = Served::tcp_over(
        {
            let lease_lost = lease_lost.clone();
            move |store| {
                Arc::new(Dark {
                    store,
                    down: Arc::default(),
                    lease_lost,
                    slow_reads: Arc::default(),
                })
            }
        },
        book(),
        |k| k.lease_ttl(Duration::from_millis(300)),
        |g| g.drain_timeout(Duration::from_secs(30)),
    )
    .await;
    let mut client = served.client().await;
    let id = create(&mut client, "mine").await;
    assert!(served.kernel.lease_lost().is_none());
    lease_lost.store(true, std::sync::atomic::Ordering::SeqCst);
    let told = client.expect("server.shutdown").await;
    assert_eq!(told, json!({ "drain_ms": 0, "reason": "lease_lost" }));
    let why = served.kernel.lease_lost().unwrap_or_default().to_owned();
    assert!(why.contains("lease"), "{why}");
    assert!(id > 0);
    let report = served.finished().await;
    assert!(report.lease_lost, "{report:?}");
}

/// Found from outside (SPEC §10): a request a connection was answering when
/// the gateway closed it at the end of a shutdown (a read the store was
/// slow to answer, a request a process that lost its lease had taken) went
/// unanswered: the closing frame was queued ahead of its answer. The
/// connection now sends its closing frame once that answer is out (the
/// closing grace still bounds it).
#[tokio::test]
async fn g9_a_request_in_flight_when_the_gateway_closes_is_answered_before_the_close() {
    let slow_reads = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut served = Served::tcp_over(
        {
            let slow_reads = slow_reads.clone();
            move |store| {
                Arc::new(Dark {
                    store,
                    down: Arc::default(),
                    lease_lost: Arc::default(),
                    slow_reads,
                })
            }
        },
        book(),
        |k| k,
        |g| g.drain_timeout(Duration::ZERO),
    )
    .await;
    let mut client = served.client().await;
    let id = create(&mut client, "read me").await;
    slow_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    client
        .send_raw(
            &json!({"jsonrpc": "2.0", "id": 7, "method": "session.read", "params": {"id": id}})
                .to_string(),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    served.gateway.shutdown();
    let said = client.until_closed().await;
    let answered = said.iter().any(|m| m["id"] == 7);
    assert!(answered, "the read in flight was not answered: {said:?}");
    served.finished().await;
}
