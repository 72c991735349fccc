//! The gateway rows (SPEC §10, issue 16): `CLIENTS` concurrent WebSocket
//! clients, each attached to its own session, each running a turn that
//! streams `CHUNKS` chunks from a provider; the latency of each chunk from
//! the moment it was due to the moment its client has parsed its
//! `turn.chunk`, against the same chunks, due at the same times, sent as the
//! same notification frames by a bare axum WebSocket server (the same stack:
//! axum, hyper, tungstenite, with the gateway's buffer sizes) with no kernel,
//! no store and no fan-out.
//!
//! Both sides run one fixed-deadline [`Schedule`] per round: the stream
//! opened `i`-th is due its chunk `k` at `origin + phase(i) + k × delay`,
//! the phases spread evenly over one delay, and a chunk is stamped with the
//! time it was due, not the time its task happened to run. A stream that
//! sleeps its delay from its own last poll drifts by however late it was
//! woken, and the two sides then drift apart (the bare side's chunks bunch
//! more): the figures compare pacing, not paths.
//!
//! And the heap bytes per connected idle session, counted in this process
//! while the clients run in a child process (this binary again, with
//! `--gateway-clients`), so that only the server's side is counted; the bare
//! server's bytes per connection, with the same buffer sizes, are in the
//! note.
//!
//! The gateway runs over a store that writes nothing (as the teardown row
//! does): the store rows measure the store.

use std::io::{BufRead, BufReader, Write as _};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::ws::{Message as AxumMessage, WebSocket, WebSocketUpgrade};
use futures_util::{FutureExt, SinkExt, Stream, StreamExt};
use serde_json::{json, Value};
use settle_gateway::Gateway;
use settle_runtime::Kernel;
use settle_stream::{
    Close, CloseError, Provider, ProviderStream, Request, StreamError, StreamEvent,
};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::measure::{quantile, spread, Plan};
use crate::null_store::NullStore;
use crate::report::{grouped, num, Row, Target};
use crate::{alloc, child, progress, Result};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The sizes of one run of the gateway rows.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Concurrent clients, one session each.
    pub clients: usize,
    /// Chunks per turn.
    pub chunks: usize,
    /// The provider's pause before each chunk.
    pub delay: Duration,
    /// Rounds (one turn per client each).
    pub plan: Plan,
}

/// When the process started: chunk stamps are nanoseconds since it.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// `at` as the text of a chunk: nanoseconds since [`base`].
fn stamp(at: Instant) -> String {
    at.saturating_duration_since(base()).as_nanos().to_string()
}

fn latency(text: &str) -> Option<Duration> {
    let due = Duration::from_nanos(text.parse().ok()?);
    Some(base().elapsed().saturating_sub(due))
}

/// The gateway's read and write buffer sizes (`crates/gateway/src/upgrade.rs`),
/// which the bare server uses too: with tungstenite's defaults (128 KiB of
/// read buffer) the bare connection's memory is mostly its buffer.
const READ_BUFFER: usize = 2 * 1024;
const WRITE_BUFFER: usize = 8 * 1024;

/// How long after a round starts its first chunks are due: room for every
/// client's `turn.start` to reach its provider, on either side.
fn lead(delay: Duration) -> Duration {
    (4 * delay).max(Duration::from_millis(100))
}

/// One round's fixed deadlines, shared by every stream of a side.
struct Schedule {
    /// When the phase-0 stream's first chunk is due, minus one delay.
    origin: Mutex<Instant>,
    /// Streams opened this round: the next one's phase.
    opened: AtomicUsize,
    /// Phases per delay: one per client.
    clients: usize,
    delay: Duration,
}

impl Schedule {
    fn new(clients: usize, delay: Duration) -> Arc<Schedule> {
        Arc::new(Schedule {
            origin: Mutex::new(Instant::now()),
            opened: AtomicUsize::new(0),
            clients: clients.max(1),
            delay,
        })
    }

    /// A new round whose first chunks are due after [`lead`].
    fn restart(&self) {
        let origin = Instant::now() + lead(self.delay);
        *self.origin.lock().unwrap_or_else(|e| e.into_inner()) = origin;
        self.opened.store(0, Ordering::SeqCst);
    }

    /// When the next stream opened is due its first chunk.
    fn first_due(&self) -> Instant {
        let i = self.opened.fetch_add(1, Ordering::SeqCst) % self.clients;
        let origin = *self.origin.lock().unwrap_or_else(|e| e.into_inner());
        let phase = self.delay.mul_f64(i as f64 / self.clients as f64);
        origin + phase + self.delay
    }
}

/// A provider whose chunks are due on the [`Schedule`], each stamped with
/// the time it was due.
struct Stamping {
    chunks: usize,
    schedule: Arc<Schedule>,
}

struct StampStream {
    left: usize,
    due: Instant,
    delay: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stream for StampStream {
    type Item = std::result::Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let due = self.due;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due.into())));
        ready!(sleep.poll_unpin(cx));
        self.sleep = None;
        self.left -= 1;
        self.due = due + self.delay;
        Poll::Ready(Some(Ok(StreamEvent::Chunk(settle_stream::Chunk::text(
            stamp(due),
        )))))
    }
}

#[async_trait]
impl Close for StampStream {
    fn close_now(&mut self) -> std::result::Result<(), CloseError> {
        self.left = 0;
        Ok(())
    }
}

#[async_trait]
impl Provider for Stamping {
    async fn open(&self, _: &Request) -> std::result::Result<ProviderStream, StreamError> {
        Ok(Box::new(self.stream()))
    }
}

impl Stamping {
    fn stream(&self) -> StampStream {
        StampStream {
            left: self.chunks,
            due: self.schedule.first_due(),
            delay: self.schedule.delay,
            sleep: None,
        }
    }
}

fn request(id: u64, method: &str, params: Value) -> Message {
    Message::text(
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
    )
}

async fn connect(addr: std::net::SocketAddr) -> Result<Ws> {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
    Ok(ws)
}

/// Waits for the answer to request `id`.
async fn answer(ws: &mut Ws, id: u64) -> Result<Value> {
    while let Some(frame) = ws.next().await {
        if let Message::Text(text) = frame? {
            let value: Value = serde_json::from_str(text.as_str())?;
            if value["id"] == id {
                return Ok(value);
            }
        }
    }
    Err("the connection closed before the answer".into())
}

/// One client's turn: sends `start`, then reads its chunks until the turn's
/// end, each chunk's latency.
async fn turn(mut ws: Ws, start: Message) -> Result<(Ws, Vec<Duration>)> {
    ws.send(start).await?;
    let mut latencies = Vec::new();
    while let Some(frame) = ws.next().await {
        let Message::Text(text) = frame? else {
            continue;
        };
        let value: Value = serde_json::from_str(text.as_str())?;
        match value["method"].as_str() {
            Some("turn.chunk") => {
                if let Some(l) = value["params"]["text"].as_str().and_then(latency) {
                    latencies.push(l);
                }
            }
            Some("turn.ended") => return Ok((ws, latencies)),
            _ => {}
        }
    }
    Err("the connection closed mid-turn".into())
}

/// The clients of one side and how each starts a turn.
struct Side {
    clients: Vec<(Ws, Message)>,
    schedule: Arc<Schedule>,
}

impl Side {
    /// Every client runs one turn at once, on a fresh schedule; every
    /// chunk's latency, sorted.
    async fn round(&mut self) -> Result<Vec<Duration>> {
        self.schedule.restart();
        let turns: Vec<_> = self
            .clients
            .drain(..)
            .map(|(ws, start)| {
                tokio::spawn(turn(ws, start.clone()).map(|r| r.map(|(ws, l)| (ws, start, l))))
            })
            .collect();
        let mut all = Vec::new();
        for t in turns {
            let (ws, start, latencies) = t.await??;
            all.extend(latencies);
            self.clients.push((ws, start));
        }
        if all.is_empty() {
            return Err("no chunk latency was measured (the chunks carried no stamp)".into());
        }
        all.sort_unstable();
        Ok(all)
    }
}

/// The gateway: a kernel over a store that writes nothing, N clients with a
/// session each.
async fn gateway_side(sizes: Sizes) -> Result<(Side, Gateway)> {
    let kernel = Kernel::builder(Arc::new(NullStore::expecting(usize::MAX)))
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await?;
    let schedule = Schedule::new(sizes.clients, sizes.delay);
    let provider = Arc::new(Stamping {
        chunks: sizes.chunks,
        schedule: schedule.clone(),
    });
    let gateway = Gateway::builder(kernel, provider).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.serve(listener).await }
    });
    let mut clients = Vec::with_capacity(sizes.clients);
    for i in 0..sizes.clients {
        let mut ws = connect(addr).await?;
        ws.send(request(
            1,
            "session.create",
            json!({ "name": format!("client {i}") }),
        ))
        .await?;
        let id = answer(&mut ws, 1).await?["result"]["id"]
            .as_u64()
            .ok_or("session.create gave no id")?;
        clients.push((
            ws,
            request(2, "turn.start", json!({ "id": id, "prompt": "go" })),
        ));
    }
    Ok((Side { clients, schedule }, gateway))
}

/// The bare path: each text frame starts the same stamped stream, sent as
/// the same notifications.
async fn bare_connection(mut socket: WebSocket, provider: Arc<Stamping>) {
    while let Some(Ok(frame)) = socket.recv().await {
        if !matches!(frame, AxumMessage::Text(_)) {
            continue;
        }
        let mut stream = provider.stream();
        while let Some(Ok(StreamEvent::Chunk(chunk))) = stream.next().await {
            let text = chunk.into_payload();
            let note = json!({"jsonrpc": "2.0", "method": "turn.chunk", "params": {"id": 1, "turn": 1, "text": text}});
            if socket
                .send(AxumMessage::Text(note.to_string().into()))
                .await
                .is_err()
            {
                return;
            }
        }
        let end = json!({"jsonrpc": "2.0", "method": "turn.ended", "params": {"id": 1, "turn": 1, "outcome": "completed", "error": null}});
        if socket
            .send(AxumMessage::Text(end.to_string().into()))
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn bare_server(sizes: Sizes, schedule: Arc<Schedule>) -> Result<std::net::SocketAddr> {
    let provider = Arc::new(Stamping {
        chunks: sizes.chunks,
        schedule,
    });
    let router = axum::Router::new().route(
        "/ws",
        axum::routing::get(move |upgrade: WebSocketUpgrade| {
            let provider = provider.clone();
            async move {
                upgrade
                    .read_buffer_size(READ_BUFFER)
                    .write_buffer_size(WRITE_BUFFER)
                    .on_upgrade(move |socket| bare_connection(socket, provider))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Nagle's algorithm off, as the gateway serves its connections.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

async fn bare_side(sizes: Sizes) -> Result<Side> {
    let schedule = Schedule::new(sizes.clients, sizes.delay);
    let addr = bare_server(sizes, schedule.clone()).await?;
    let mut clients = Vec::with_capacity(sizes.clients);
    for _ in 0..sizes.clients {
        clients.push((connect(addr).await?, Message::text("start")));
    }
    Ok(Side { clients, schedule })
}

/// The latency rows: p50 and p99, ours against the bare path, interleaved.
pub fn latency_rows(sizes: Sizes) -> Result<Vec<Row>> {
    base();
    progress(&format!(
        "gateway {} clients × {} chunks: {} + {} rounds",
        grouped(sizes.clients as i64),
        sizes.chunks,
        sizes.plan.warmup,
        sizes.plan.rounds
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (mut ours, gateway) = rt.block_on(gateway_side(sizes))?;
    let mut bare = rt.block_on(bare_side(sizes))?;
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for round in 0..sizes.plan.warmup + sizes.plan.rounds {
        let (o, b) = if round % 2 == 0 {
            let o = rt.block_on(ours.round())?;
            (o, rt.block_on(bare.round())?)
        } else {
            let b = rt.block_on(bare.round())?;
            (rt.block_on(ours.round())?, b)
        };
        if round >= sizes.plan.warmup {
            p50.push((quantile(&o, 0.5), quantile(&b, 0.5)));
            p99.push((quantile(&o, 0.99), quantile(&b, 0.99)));
        }
    }
    gateway.shutdown();
    drop(ours);
    drop(bare);
    rt.shutdown_timeout(Duration::from_secs(5));
    let size = format!(
        "{} clients × {} chunks",
        grouped(sizes.clients as i64),
        sizes.chunks
    );
    let row = |name: &str, pairs: &[(Duration, Duration)], target: f64| {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let median = |pick: fn(&(Duration, Duration)) -> Duration| {
            let mut v: Vec<f64> = pairs.iter().map(|p| ms(pick(p))).collect();
            v.sort_by(f64::total_cmp);
            spread(v).median
        };
        let ratios = spread(
            pairs
                .iter()
                .map(|(o, b)| o.as_secs_f64() / b.as_secs_f64().max(1e-9))
                .collect(),
        );
        Row::compared(
            format!("gateway {name}"),
            size.clone(),
            "ms",
            median(|p| p.0),
            median(|p| p.1),
            ratios,
            Target::ratio_at_most(target),
            pairs.len(),
        )
    };
    Ok(vec![
        row("latency p50", &p50, 2.0),
        row("latency p99", &p99, 2.0).with_note(format!(
            "due → parsed by the client, per chunk, a chunk due every {} ms per session on one \
             fixed schedule per round (phases spread evenly over the interval, the same on both \
             sides), stamped with the time it was due; baseline = the same chunks on the same \
             schedule as the same frames from a bare axum WebSocket handler with the gateway's \
             buffer sizes (no kernel, store or fan-out); ours over a store that writes nothing",
            num(sizes.delay.as_secs_f64() * 1e3)
        )),
    ])
}

/// The memory row: heap bytes per connected idle session, the clients in a
/// child process; the bare server's bytes per connection in the note. The
/// servers run in a process of their own too ([`memory_process`], see
/// [`crate::child`]).
pub fn memory_row(clients: usize) -> Result<Row> {
    progress(&format!(
        "gateway memory: {} connected idle sessions",
        grouped(clients as i64)
    ));
    let clients_arg = clients.to_string();
    let words = child::figures(&["--gateway-memory-child", &clients_arg], "gateway memory")?;
    let (Some(Ok(ours)), Some(Ok(bare))) = (
        words.first().map(|w| w.parse::<f64>()),
        words.get(1).map(|w| w.parse::<f64>()),
    ) else {
        return Err(format!("the gateway memory process printed {words:?}").into());
    };
    Ok(Row::absolute(
        "gateway memory",
        format!("{} connected idle sessions", grouped(clients as i64)),
        "B/session",
        ours,
        Target::ours_at_most(16.0 * 1024.0),
        1,
    )
    .with_note(format!(
        "heap bytes per connected client with its session (gateway entry, connection, queue, \
         core and driver records), the servers in a process of their own and the clients in \
         another; a bare axum WebSocket connection alone, with the same read and write buffer \
         sizes (2 KiB, 8 KiB): {} B",
        num(bare)
    )))
}

/// The memory row's own process: heap bytes per connected idle client, ours
/// (with its session) and the bare server's.
pub fn memory_process(clients: usize) -> Result<(f64, f64)> {
    let sizes = Sizes {
        clients,
        chunks: 1,
        delay: Duration::ZERO,
        plan: Plan {
            warmup: 0,
            rounds: 0,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Ours.
    let kernel = rt.block_on(
        Kernel::builder(Arc::new(NullStore::expecting(usize::MAX)))
            .idle_ttl(None)
            .lru_cap(None)
            .start(),
    )?;
    let schedule = Schedule::new(clients, Duration::ZERO);
    let gateway = Gateway::builder(
        kernel,
        Arc::new(Stamping {
            chunks: 1,
            schedule: schedule.clone(),
        }),
    )
    .build();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    rt.spawn({
        let gateway = gateway.clone();
        async move { gateway.serve(listener).await }
    });
    let (child, ours) = alloc::net_bytes(|| spawn_clients(addr, clients, true));
    let mut child = child?;
    let bare_addr = rt.block_on(bare_server(sizes, schedule))?;
    let (bare_child, bare) = alloc::net_bytes(|| spawn_clients(bare_addr, clients, false));
    let mut bare_child = bare_child?;
    let connected = gateway.connections();
    for c in [&mut child, &mut bare_child] {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    gateway.shutdown();
    rt.shutdown_timeout(Duration::from_secs(5));
    if connected != clients {
        return Err(format!("{connected} of {clients} clients stayed connected").into());
    }
    let per = |bytes: isize| bytes as f64 / clients as f64;
    Ok((per(ours), per(bare)))
}

/// Starts the child process of `clients` clients and waits until all are
/// connected (and, for the gateway, have created their session).
fn spawn_clients(
    addr: std::net::SocketAddr,
    clients: usize,
    sessions: bool,
) -> Result<std::process::Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--gateway-clients", &addr.to_string(), &clients.to_string()])
        .args(sessions.then_some("--gateway-sessions"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(format!("the client process said {line:?}").into());
    }
    Ok(child)
}

/// The child process: connects `clients` clients to `addr` (each creating a
/// session when `sessions`), says `ready`, and holds them until its stdin
/// closes.
pub fn client_process(addr: &str, clients: usize, sessions: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let addr: std::net::SocketAddr = addr.parse()?;
        let mut held = Vec::with_capacity(clients);
        for i in 0..clients {
            let mut ws = connect(addr).await?;
            if sessions {
                ws.send(request(
                    1,
                    "session.create",
                    json!({ "name": format!("idle {i}") }),
                ))
                .await?;
                answer(&mut ws, 1).await?;
            }
            held.push(ws);
        }
        // Every connection is served (the last answer came back); let the
        // server settle what it allocates per connection before counting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
        drop(out);
        let mut line = String::new();
        let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
        drop(held);
        Ok(())
    })
}
