//! The `fleet restart` row (SPEC §12, G12): a rolling restart of a fleet of
//! three `settle serve` processes on one PostgreSQL with [`SESSIONS`]
//! connected sessions, a third on each at first.
//!
//! The processes are the real `settle` binary (next to this one, as `cargo
//! build --release -p settle-cli` leaves it, or `SETTLE_BIN`), each a
//! process with its own lease, on the server of the `fleet appends` rows.
//! One process at a time gets SIGTERM; its clients see `server.shutdown
//! {handoff: true}`, the connection close, and follow it to the next
//! process: connect, `session.attach` (retried while the session is not yet
//! released), done. The figure of a move is the time from the SIGTERM until
//! every client of that process is attached on the next one; each move
//! carries the sessions the moving process had adopted, so the three moves
//! carry a third, two thirds and all of them. The process is then started
//! again, and after the last move the bench checks in the database that no
//! session was finalized (none lost).
//!
//! There is no baseline: nothing else hands sessions over. The row says the
//! time a user waits through a redeploy.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::pg::PgConnection;
use diesel::prelude::*;
use futures_util::{SinkExt, StreamExt};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::report::{Row, Target};
use crate::{fleet, progress, Result};

/// Sessions of the fleet, a third on each process at first.
pub const SESSIONS: usize = 300;

/// Processes of the fleet.
const PROCESSES: usize = 3;

/// How long a node may take to say it listens, or to exit after SIGTERM.
const PATIENCE: Duration = Duration::from_secs(60);

/// The rows: one per move of the rolling restart, or one that says why it
/// was skipped.
pub fn rows(sessions: usize) -> Result<Vec<Row>> {
    let skipped = |why: String| {
        progress(&format!("fleet restart: skipped: {why}"));
        Ok(vec![Row::ours_only(
            "fleet restart",
            "skipped",
            "ms",
            f64::NAN,
            Target::none(),
            0,
        )
        .with_note(format!("not run: {why}"))])
    };
    let Some(settle) = settle_bin() else {
        return skipped(
            "no `settle` binary next to this one (`cargo build --release -p settle-cli`) and \
             SETTLE_BIN is unset"
                .to_owned(),
        );
    };
    let server = match fleet::server("restart")? {
        Ok(server) => server,
        Err(why) => return skipped(why),
    };
    progress(&format!(
        "fleet restart: {PROCESSES} processes, {sessions} sessions, one rolling restart"
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let moves = runtime.block_on(rolling_restart(&settle, server.url(), sessions))?;
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let rows = moves
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let phases = format!(
                "the last client told at {}, the last connection closed (handed off) at {}, \
                 the last attach at {}; {} attaches answered elsewhere (not released yet) first",
                ms(m.last_told),
                ms(m.last_closed),
                ms(m.took),
                m.retries
            );
            Row::ours_only(
                "fleet restart",
                format!("move {} of {PROCESSES}: {} sessions", i + 1, m.carried),
                "ms",
                m.took.as_secs_f64() * 1e3,
                Target::none(),
                1,
            )
            .with_note(if i == 0 {
                format!(
                    "SIGTERM of one `settle serve` of {PROCESSES} on one PostgreSQL ({}) until \
                     every one of its clients, following `server.shutdown {{handoff}}`, is \
                     attached on the next process; each move carries the sessions the \
                     process had adopted; {sessions} sessions in all, none lost (checked in \
                     the database after the last move); {phases}",
                    server.from()
                )
            } else {
                format!("as move 1; {phases}")
            })
        })
        .collect();
    Ok(rows)
}

/// The `settle` binary: `SETTLE_BIN`, else the one next to this binary.
fn settle_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SETTLE_BIN") {
        return Some(PathBuf::from(path));
    }
    let here = std::env::current_exe().ok()?;
    let next_to = here.parent()?.join("settle");
    next_to.is_file().then_some(next_to)
}

/// One `settle serve` of the fleet.
struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(settle: &PathBuf, db: &str) -> Result<Node> {
        let mut child = Command::new(settle)
            .args(["--db", db, "serve", "--listen", "127.0.0.1:0"])
            // No turn runs in this row; the model is never called.
            .args(["--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
            .args(["--drain-timeout", "20s", "--lease-ttl", "30s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", settle.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            // Read to the end so the process never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if !sent && line.contains("listening on ") {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let line = match rx.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("a `settle serve` did not say where it listens".into());
            }
        };
        let addr = line
            .split("://")
            .nth(1)
            .map(|a| a.trim_end_matches("/ws").to_owned())
            .ok_or_else(|| format!("no address in {line:?}"))?;
        Ok(Node { child, addr })
    }

    fn terminate(&self) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        kill(Pid::from_raw(pid), Signal::SIGTERM)?;
        Ok(())
    }

    /// Waits for the process to exit after its SIGTERM: 143 is a handoff
    /// that went as it should.
    fn exited(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                use std::os::unix::process::ExitStatusExt as _;
                let code = status.code().or(status.signal().map(|s| 128 + s));
                return match code {
                    Some(143) => Ok(()),
                    other => Err(format!("a node exited {other:?} after SIGTERM, not 143").into()),
                };
            }
            if started.elapsed() > PATIENCE {
                return Err("a node did not exit after SIGTERM".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.terminate();
            let started = Instant::now();
            while started.elapsed() < PATIENCE {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A client of one session.
struct Client {
    ws: Ws,
    session: u64,
    next_id: u64,
}

impl Client {
    async fn connect(addr: &str) -> Result<Ws> {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
        Ok(ws)
    }

    /// Calls `method`: its result, or its error object.
    async fn call(
        ws: &mut Ws,
        id: u64,
        method: &str,
        params: Value,
    ) -> Result<std::result::Result<Value, Value>> {
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        ws.send(Message::text(request.to_string())).await?;
        while let Some(frame) = ws.next().await {
            let Message::Text(text) = frame? else {
                continue;
            };
            let message: Value = serde_json::from_str(&text)?;
            if message["id"] != id {
                continue;
            }
            if let Some(error) = message.get("error") {
                return Ok(Err(error.clone()));
            }
            return Ok(Ok(message["result"].clone()));
        }
        Err(format!("the connection closed before the answer to {method}").into())
    }

    async fn create(addr: &str, name: &str) -> Result<Client> {
        let mut ws = Self::connect(addr).await?;
        let created = Self::call(&mut ws, 1, "session.create", json!({ "name": name }))
            .await?
            .map_err(|e| format!("session.create: {e}"))?;
        let session = created["id"].as_u64().ok_or("session.create gave no id")?;
        Ok(Client {
            ws,
            session,
            next_id: 1,
        })
    }

    /// Follows a handoff: reads until the process closes the connection
    /// (`server.shutdown {handoff: true}` first), then attaches on `next`.
    /// When each step happened.
    async fn follow(&mut self, next: &str) -> Result<Steps> {
        let mut told = None;
        while let Some(frame) = self.ws.next().await {
            let Ok(Message::Text(text)) = frame else {
                break;
            };
            let message: Value = serde_json::from_str(&text)?;
            if message["method"] == "server.shutdown" {
                if message["params"]["handoff"] != true {
                    return Err(format!("a shutdown that is no handoff: {message}").into());
                }
                told = Some(Instant::now());
            }
        }
        let Some(told) = told else {
            return Err("the connection closed without server.shutdown".into());
        };
        let closed = Instant::now();
        self.ws = Self::connect(next).await?;
        let mut retries = 0;
        loop {
            self.next_id += 1;
            let params = json!({ "id": self.session });
            match Self::call(&mut self.ws, self.next_id, "session.attach", params).await? {
                Ok(_) => {
                    return Ok(Steps {
                        told,
                        closed,
                        attached: Instant::now(),
                        retries,
                    })
                }
                // Not released yet: its process is still handing off.
                Err(e) if e["data"]["kind"] == "elsewhere" => {
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(format!("session {} lost: {e}", self.session).into()),
            }
        }
    }
}

/// When a client saw each step of its move.
struct Steps {
    told: Instant,
    closed: Instant,
    attached: Instant,
    /// Attaches answered `elsewhere` (not released yet) before the one that
    /// adopted it.
    retries: u32,
}

/// One move of the rolling restart, from its SIGTERM.
pub struct Move {
    /// Sessions it carried.
    pub carried: usize,
    /// Until every one was attached on the next process.
    pub took: Duration,
    /// Until the last client was told `server.shutdown`.
    pub last_told: Duration,
    /// Until the last connection closed (its sessions handed off).
    pub last_closed: Duration,
    /// Attaches answered `elsewhere` in all.
    pub retries: u32,
}

/// The rolling restart: per move, how many sessions moved and how long it
/// took from the SIGTERM until every one was attached on the next process.
async fn rolling_restart(settle: &PathBuf, db: &str, sessions: usize) -> Result<Vec<Move>> {
    let mut nodes = Vec::with_capacity(PROCESSES);
    for _ in 0..PROCESSES {
        nodes.push(Node::start(settle, db)?);
    }
    // (the process it is on, its client)
    let mut clients = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let at = i % PROCESSES;
        clients.push((at, Client::create(&nodes[at].addr, &format!("c{i}")).await?));
    }
    let mut moves = Vec::with_capacity(PROCESSES);
    for going in 0..PROCESSES {
        let next = (going + 1) % PROCESSES;
        let addr = nodes[next].addr.clone();
        let started = Instant::now();
        nodes[going].terminate()?;
        let moving: Vec<_> = clients
            .iter_mut()
            .filter(|(at, _)| *at == going)
            .map(|(at, client)| {
                let addr = addr.clone();
                async move {
                    let steps = client.follow(&addr).await?;
                    *at = next;
                    Ok::<Steps, crate::Error>(steps)
                }
            })
            .collect();
        let carried = moving.len();
        let mut steps = Vec::with_capacity(carried);
        for done in futures_util::future::join_all(moving).await {
            steps.push(done?);
        }
        let last = |f: fn(&Steps) -> Instant| {
            steps
                .iter()
                .map(|s| f(s).duration_since(started))
                .max()
                .unwrap_or_default()
        };
        moves.push(Move {
            carried,
            took: last(|s| s.attached),
            last_told: last(|s| s.told),
            last_closed: last(|s| s.closed),
            retries: steps.iter().map(|s| s.retries).sum(),
        });
        nodes[going].exited()?;
        nodes[going] = Node::start(settle, db)?;
    }
    // Checked while every client is still connected: none was finalized.
    let lost = tokio::task::block_in_place(|| finalized_sessions(db))?;
    if lost != 0 {
        return Err(format!("fleet restart: {lost} sessions were finalized (lost)").into());
    }
    drop(clients);
    drop(nodes);
    Ok(moves)
}

/// Sessions of the fleet's database that were finalized.
fn finalized_sessions(db: &str) -> Result<i64> {
    use diesel::sql_types::BigInt;
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = PgConnection::establish(db)?;
    let count: Count =
        diesel::sql_query("SELECT count(*) AS n FROM sessions WHERE end_reason IS NOT NULL")
            .get_result(&mut conn)?;
    Ok(count.n)
}
