//! A turn over a Python async iterator: the [`Provider`] the kernel opens,
//! and the pump on the caller's loop that feeds it.
//!
//! `open` asks the caller's loop (through its mailbox) to start the pump,
//! an asyncio task of `settle/_bridge.py`: it calls the caller's source
//! (awaiting it if it returns an awaitable, as `openai`'s `create()` does),
//! iterates what it got and hands each item to a [`PumpSink`]. Closing the
//! Rust stream (on end, error, idle timeout, cancel, drop, and a cancel that
//! lands while `open` waits) asks the loop to cancel the pump; the pump's
//! `finally` closes the Python stream (`aclose()`, else `close()`), so it is
//! closed once on every path (G4), whichever comes first. A pump that goes
//! on after its stream was dropped (an iterator that swallows its cancel,
//! detached at the settle deadline, G5) is refused at its next item and
//! closes its stream then.
//!
//! Back-pressure: the pump stops pulling its stream once [`PUMP_ROOM`]
//! chunks, or [`PUMP_ROOM_BYTES`] bytes of them, wait for the kernel, and
//! goes on once half of them were taken.
//! The kernel takes them only as fast as the turn's reader reads (its
//! `chunk_buffer`), so a slow reader slows its source, as for a Rust
//! provider, and memory never grows with what a fast source could give.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::Stream;
use pyo3::prelude::*;
use pyo3::types::PyString;
use settle_stream::{
    Chunk, Close, CloseError, Provider, ProviderStream, Request, StreamError, StreamErrorKind,
    StreamEvent,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::awaitable::bridge;
use crate::deliver::{Landing, Mailbox};
use crate::secrets::Secrets;
use crate::stranded::Stranded;

/// What the caller gave for one turn.
pub(crate) struct Source {
    /// The mailbox of the loop the pump runs on: the caller's.
    pub mailbox: Arc<Mailbox>,
    /// A callable returning an async iterable (or an awaitable of one), or
    /// an async iterable.
    pub source: Py<PyAny>,
    /// The caller's item-to-chunk function, if any.
    pub to_chunk: Option<Py<PyAny>>,
    /// The copy of the caller's `contextvars` context taken at `turn()`,
    /// which the pump runs in (as an asyncio task runs in a copy of its
    /// creator's), so that the source sees the caller's request ids and
    /// tracing spans. Taken by the pump's start: from then on its asyncio
    /// task holds it, where the collector sees it.
    pub caller_context: Mutex<Option<Py<PyAny>>>,
    /// The turn's watch on its pump.
    pub watch: Arc<PumpWatch>,
    /// The kernel's secrets, masked wherever the turn's error is made from
    /// what its source said (`PumpSink::fail`, and a chunk's `error` in
    /// `PumpSink::push`).
    pub secrets: Arc<Secrets>,
    /// How long the pump waits for its stream's close once its loop is
    /// closing (its task cancelled by another than the kernel): the
    /// kernel's settle timeout (G5).
    pub close_bound: Duration,
}

/// What a turn's reader keeps of its pump: the pump's loop, and the pump
/// of the stream the kernel opened, once it did. Neither keeps the source
/// or the pump alive.
pub(crate) struct PumpWatch {
    mailbox: Arc<Mailbox>,
    pump: Mutex<Weak<Shared>>,
}

impl PumpWatch {
    /// A watch on the pumps that will run on `mailbox`'s loop.
    pub fn new(mailbox: Arc<Mailbox>) -> Arc<Self> {
        let watch = Arc::new(PumpWatch {
            mailbox,
            pump: Mutex::new(Weak::new()),
        });
        let stranded: Weak<dyn Stranded> = Arc::downgrade(&watch) as Weak<PumpWatch>;
        watch.mailbox.watch(stranded);
        watch
    }

    /// The kernel detached the turn (G5): its pump, if it still runs, is
    /// let go of on its loop (see [`crate::let_go`]). Posted before the
    /// turn's end reaches its reader, so that a program that returns on
    /// that end finds its loop no longer waiting for the pump.
    pub fn let_go(&self) {
        if let Some(shared) = self.pump.lock().ok().and_then(|p| p.upgrade()) {
            crate::let_go::let_go(shared);
        }
    }
}

impl Stranded for PumpWatch {
    /// Ends the turn's stream as cancelled when its pump's loop closed with
    /// the pump still pending: it will never run again, so nothing else
    /// would end it (see [`Mailbox::loop_closed`]). The Python stream is
    /// left to the collector; its loop cannot close it any more.
    fn end_if_loop_closed(&self, py: Python<'_>) {
        let Some(shared) = self.pump.lock().ok().and_then(|p| p.upgrade()) else {
            return;
        };
        if shared.closed.is_cancelled() || !self.mailbox.loop_closed(py) {
            return;
        }
        if !shared.send_opened(Err("the turn's event loop closed".into())) {
            let _ = shared.items.send(Item::Cancelled);
        }
        shared.abandon();
    }
}

/// The provider of one Python turn.
pub(crate) struct PyProvider {
    pub source: Arc<Source>,
    /// Whether the kernel ever opened it.
    pub opened: std::sync::atomic::AtomicBool,
}

impl Drop for PyProvider {
    /// A turn cancelled before its stream was opened: a source that is
    /// already a stream (not a callable that makes one) was handed to the
    /// kernel, so it is closed all the same (G4).
    fn drop(&mut self) {
        if self.opened.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let source = self.source.clone();
        self.source.mailbox.post(move |py, landing| {
            let event_loop = match landing {
                Landing::Loop(event_loop) => Some(event_loop),
                Landing::Closed => None,
            };
            // Its close runs in the caller's context too, as its pump would.
            let caller_context = source.caller_context.lock().ok().and_then(|mut c| c.take());
            if let Ok(bridge) = bridge(py) {
                let _ = bridge.call_method1(
                    "close_unopened",
                    (event_loop, source.source.bind(py), caller_context),
                );
            }
        });
    }
}

enum Item {
    Chunk(Chunk),
    End,
    Failed(String),
    /// An OpenAI-shaped chunk ended the stream (its `error`, a reply cut
    /// short), after its own chunks.
    Ended(StreamError),
    /// An OpenAI-shaped chunk said the reply is done (whole, or cut).
    Finished(Option<settle_stream::Truncation>),
    /// The pump was cancelled by someone else (its loop is shutting down).
    Cancelled,
}

/// How many chunks may wait for the kernel before the pump stops pulling
/// its stream; it goes on once half of them were taken.
pub(crate) const PUMP_ROOM: usize = 64;

/// How many bytes of chunks (their payloads) may wait for the kernel before
/// the pump stops pulling its stream; it goes on once half of them were
/// taken. A larger chunk still goes, alone.
pub(crate) const PUMP_ROOM_BYTES: usize = 4 << 20;

/// The pump's wait for room: how many chunks wait for the kernel, and the
/// asyncio future the pump awaits while too many do.
#[derive(Default)]
struct Room {
    /// Chunks sent to the Rust stream and not yet taken by it.
    waiting: AtomicUsize,
    /// Their payloads' bytes.
    bytes: AtomicUsize,
    /// Set while the pump waits (or is about to): the stream then hands
    /// `future` back once enough were taken.
    wanted: AtomicBool,
    future: Mutex<Option<Py<PyAny>>>,
}

impl Room {
    /// `count` more chunks of `bytes` wait; whether the pump must wait for room.
    fn add(&self, count: usize, bytes: usize) -> bool {
        let bytes = self
            .bytes
            .fetch_add(bytes, Ordering::SeqCst)
            .saturating_add(bytes);
        let count = self
            .waiting
            .fetch_add(count, Ordering::SeqCst)
            .saturating_add(count);
        count >= PUMP_ROOM || bytes >= PUMP_ROOM_BYTES
    }

    /// Whether few enough chunks wait for the pump to go on.
    fn roomy(chunks: usize, bytes: usize) -> bool {
        chunks <= PUMP_ROOM / 2 && bytes <= PUMP_ROOM_BYTES / 2
    }

    /// The pump's `future` to await for room, kept unless room was made
    /// meanwhile (then `false`: go on). The flag is set before the count is
    /// read, and the stream reads the flag after it took a chunk, so one of
    /// the two always sees the other.
    fn wait(&self, future: Py<PyAny>) -> bool {
        let Ok(mut slot) = self.future.lock() else {
            return false;
        };
        self.wanted.store(true, Ordering::SeqCst);
        let (chunks, bytes) = (
            self.waiting.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        );
        if Room::roomy(chunks, bytes) {
            self.wanted.store(false, Ordering::SeqCst);
            return false;
        }
        *slot = Some(future);
        true
    }

    /// The stream took one chunk of `bytes`: the pump's future, when it
    /// waits and there is room again.
    fn take(&self, bytes: usize) -> Option<Py<PyAny>> {
        // Never below zero: a chunk is counted before it is sent.
        let bytes = self
            .bytes
            .fetch_sub(bytes, Ordering::SeqCst)
            .saturating_sub(bytes);
        let left = self
            .waiting
            .fetch_sub(1, Ordering::SeqCst)
            .saturating_sub(1);
        if !Room::roomy(left, bytes) || !self.wanted.load(Ordering::SeqCst) {
            return None;
        }
        let future = self.future.lock().ok()?.take()?;
        self.wanted.store(false, Ordering::SeqCst);
        Some(future)
    }
}

#[derive(Default)]
struct Control {
    task: Option<Py<PyAny>>,
    close_requested: bool,
    /// The pump is in its `finally`, closing the source: a close asked for
    /// now waits for it instead of cancelling it half way (G4).
    closing: bool,
}

/// What the pump and the Rust stream share.
struct Shared {
    items: mpsc::UnboundedSender<Item>,
    opened: Mutex<Option<oneshot::Sender<Result<(), String>>>>,
    control: Mutex<Control>,
    /// Cancelled once the pump's `finally` ran (the Python stream is closed).
    closed: CancellationToken,
    room: Room,
    source: Arc<Source>,
    /// The turn's OpenAI-shaped chunks, read as the Rust provider reads
    /// them, and a character split across two of its strings.
    reply: Mutex<crate::chunk::Reading>,
}

impl crate::let_go::HoldsTask for Shared {
    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.source.mailbox
    }

    fn task<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        let control = self.control.lock().ok()?;
        control.task.as_ref().map(|t| t.bind(py).clone())
    }
}

impl Shared {
    /// Asks for the pump's end (idempotent): cancels its task on its loop,
    /// or has it cancel itself as soon as it exists.
    fn request_close(self: &Arc<Self>) {
        match self.control.lock() {
            Ok(mut control) if !control.close_requested => control.close_requested = true,
            _ => return,
        }
        let shared = self.clone();
        self.source.mailbox.post(move |py, landing| {
            if let Landing::Closed = landing {
                // Its loop is closed: the pump will never run again.
                shared.abandon();
                return;
            }
            // A pump closing its source already (its stream ended or
            // failed on its own) is left to finish that close: cancelling
            // it would cut the source's `aclose()` short.
            let task = match shared.control.lock() {
                Ok(control) if !control.closing => {
                    control.task.as_ref().map(|t| t.bind(py).clone())
                }
                _ => None,
            };
            // Not attached yet: the pump sees the request when it does.
            if let Some(task) = task {
                // With the bridge's word for it: a cancel of the pump
                // that does not say so is the loop's (it is closing).
                let said = bridge(py).and_then(|b| b.getattr(pyo3::intern!(py, "KERNEL_CLOSE")));
                let cancelled = match said {
                    Ok(said) => task.call_method1(pyo3::intern!(py, "cancel"), (said,)),
                    Err(_) => task.call_method0(pyo3::intern!(py, "cancel")),
                };
                if cancelled.is_err() {
                    shared.closed.cancel();
                }
            }
        });
    }

    fn close_requested(&self) -> bool {
        self.control.lock().map_or(true, |c| c.close_requested)
    }

    /// The pump's loop closed with the pump pending: it will never run
    /// again, and counts as closed. Its task is let go of: it holds this
    /// (through its sink), so kept here it made a cycle through Rust that
    /// the collector cannot see, and the pump, its stream and the
    /// stream's connection stayed until the process exited. Let go of,
    /// they are freed at the next collection (a closed loop cannot run
    /// the stream's `aclose()`).
    fn abandon(&self) {
        let task = self.control.lock().ok().and_then(|mut c| c.task.take());
        drop(task);
        self.closed.cancel();
    }

    /// The stream took a chunk of `bytes`: the pump goes on if it waited
    /// for room.
    fn took_chunk(&self, bytes: usize) {
        let Some(future) = self.room.take(bytes) else {
            return;
        };
        self.source.mailbox.post(move |py, landing| {
            if let Landing::Loop(_) = landing {
                let future = future.bind(py);
                // Done already when the pump was cancelled meanwhile.
                let done = future.call_method0(pyo3::intern!(py, "done"));
                if done.is_ok_and(|done| !done.is_truthy().unwrap_or(true)) {
                    let _ = future.call_method1(pyo3::intern!(py, "set_result"), (py.None(),));
                }
            }
        });
    }

    fn send_opened(&self, result: Result<(), String>) -> bool {
        let sender = self.opened.lock().ok().and_then(|mut o| o.take());
        match sender {
            Some(sender) => {
                let _ = sender.send(result);
                true
            }
            None => false,
        }
    }
}

/// The pump's way into the kernel: one per turn.
#[pyclass(module = "settle._settle", frozen)]
pub(crate) struct PumpSink {
    shared: Arc<Shared>,
}

#[pymethods]
impl PumpSink {
    /// The pump's task runs its first step: a close asked for from now on
    /// cancels it. Returns whether one was asked for already (the turn was
    /// cancelled before the pump ran): the pump then closes the source and
    /// ends. Only the task itself attaches, once it runs: cancelled before
    /// its first step, it would run neither its body nor its `finally`.
    fn attach(&self, task: Py<PyAny>) -> bool {
        match self.shared.control.lock() {
            Ok(mut control) => {
                control.task = Some(task);
                control.close_requested
            }
            Err(_) => true,
        }
    }

    /// Whether the turn asked for the stream's close.
    fn close_requested(&self) -> bool {
        self.shared.close_requested()
    }

    /// How long, in seconds, the pump waits for its stream's close when
    /// its task was cancelled by another than the kernel (the loop is
    /// closing): the kernel's settle timeout (G5). Past it the close is
    /// left, so an `aclose()` that never returns does not keep the loop
    /// from closing.
    fn close_bound(&self) -> f64 {
        self.shared.source.close_bound.as_secs_f64()
    }

    /// The source gave its stream.
    fn opened(&self) {
        self.shared.send_opened(Ok(()));
    }

    /// One item of the stream; `False` once the turn no longer takes any
    /// (it ended, was cancelled or detached): the pump stops; `None` when
    /// enough chunks wait for the kernel: the pump waits for room
    /// ([`PumpSink::wait_for_room`]) before it pulls the next item.
    fn push(&self, item: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
        if self.shared.close_requested() {
            return Ok(Some(false));
        }
        let mut events = Vec::new();
        let quote = |text: &str| self.shared.source.secrets.quote(text);
        let ends = match self.shared.reply.lock() {
            Ok(mut reply) => crate::chunk::chunks_of(item, &mut events, &mut reply, &quote)?,
            Err(_) => return Ok(Some(false)),
        };
        // Counted before they are sent: the stream may take them (and
        // count them off) as soon as they are.
        let chunks = events.iter().filter_map(|e| match e {
            StreamEvent::Chunk(chunk) => Some(chunk.payload().len()),
            _ => None,
        });
        let (count, bytes) = chunks.fold((0, 0), |(n, b), len| (n + 1, b + len));
        let full = count > 0 && self.shared.room.add(count, bytes);
        for event in events {
            let item = match event {
                StreamEvent::Chunk(chunk) => Item::Chunk(chunk),
                StreamEvent::Finished(cut) => Item::Finished(cut),
                StreamEvent::KeepAlive => continue,
            };
            if self.shared.items.send(item).is_err() {
                return Ok(Some(false));
            }
        }
        if let Some(end) = ends {
            // The turn is over: the pump stops pulling, and closes its source.
            let _ = self.shared.items.send(Item::Ended(end));
            return Ok(Some(false));
        }
        if self.shared.items.is_closed() {
            return Ok(Some(false));
        }
        Ok(if full { None } else { Some(true) })
    }

    /// Keeps `future` (made on the pump's loop) to be resolved once the
    /// kernel took enough of the waiting chunks; `False` when it already
    /// did (the pump goes on without waiting).
    fn wait_for_room(&self, future: Py<PyAny>) -> bool {
        self.shared.room.wait(future)
    }

    /// The stream ended normally: as its OpenAI-shaped chunks said, a cut
    /// reply with its truncation; one that none of them said was done
    /// fails `protocol`, as the Rust provider fails a stream that ends
    /// before `data: [DONE]` (the `openai` package ends its stream quietly
    /// when the connection closes mid-reply).
    fn end(&self) {
        let end = self.shared.reply.lock().ok().and_then(|mut reply| {
            // Said as the same string refused mid-stream is: bad input
            // from the source.
            let split = reply.split.left().map(|left| {
                let message = format!("BadInput: {left}");
                StreamError::from(StreamErrorKind::Provider { message })
            });
            let reply = &mut reply.chunks;
            split.or_else(|| reply.end()).or_else(|| {
                reply.is_unfinished().then(|| {
                    StreamError::from(StreamErrorKind::Protocol(
                        "the stream ended before a chunk's `finish_reason` said the reply was \
                         done; the reply may be cut short (a connection closed mid-reply ends \
                         the `openai` package's stream as if the reply were whole)"
                            .to_owned(),
                    ))
                })
            })
        });
        let _ = self.shared.items.send(match end {
            Some(end) => Item::Ended(end),
            None => Item::End,
        });
    }

    /// The source or the stream raised `message` (the exception's type and
    /// text). An exception's text is the source's own, not the caller's
    /// input: one that is not UTF-8 (a lone surrogate) still fails the
    /// turn, the character written as its escape (`\udc80`). This is where
    /// every exception of the source (the `BadInput` of an item that
    /// cannot be read among them) becomes the turn's error, which the
    /// turn tells and the store keeps: the kernel's secrets are masked here
    /// (a client's key that its server echoed in a 401).
    fn fail(&self, message: &Bound<'_, PyString>) {
        // Quoted as the provider's server is: one line, bounded.
        let message = self
            .shared
            .source
            .secrets
            .quote(&crate::convert::utf8_escaped(message));
        if !self.shared.send_opened(Err(message.clone())) {
            let _ = self.shared.items.send(Item::Failed(message));
        }
    }

    /// The pump was cancelled: by the kernel closing its stream (which
    /// needs to hear nothing more than `closed()`), or by someone else (its
    /// loop shutting down), which ends the turn.
    fn cancelled(&self) {
        if self
            .shared
            .send_opened(Err("the turn's task was cancelled".into()))
            || self.shared.close_requested()
        {
            return;
        }
        let _ = self.shared.items.send(Item::Cancelled);
    }

    /// The pump's `finally` begins closing the Python stream: from now on
    /// the kernel's close waits for it rather than cancelling the pump.
    fn closing(&self) {
        if let Ok(mut control) = self.shared.control.lock() {
            control.closing = true;
        }
    }

    /// The pump's `finally` ran: the Python stream is closed. The kernel
    /// hears it at the next iteration of the loop, with the other pumps
    /// that ended in this one.
    fn closed(&self, py: Python<'_>) {
        // The task is done: nothing will cancel it any more.
        let task = self
            .shared
            .control
            .lock()
            .ok()
            .and_then(|mut c| c.task.take());
        drop(task);
        let token = self.shared.closed.clone();
        self.shared.source.mailbox.cancel_soon(py, token);
    }
}

/// Closes the pump if `open` is dropped before its stream is handed over:
/// the cancel that lands while the stream is being opened (G4).
struct CloseUnlessOpened {
    shared: Option<Arc<Shared>>,
}

impl Drop for CloseUnlessOpened {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.request_close();
        }
    }
}

#[async_trait]
impl Provider for PyProvider {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        self.opened
            .store(true, std::sync::atomic::Ordering::Release);
        let (items_tx, items) = mpsc::unbounded_channel();
        let (opened_tx, opened) = oneshot::channel();
        let shared = Arc::new(Shared {
            items: items_tx,
            opened: Mutex::new(Some(opened_tx)),
            control: Mutex::new(Control::default()),
            closed: CancellationToken::new(),
            room: Room::default(),
            source: self.source.clone(),
            reply: Mutex::new(crate::chunk::Reading::default()),
        });
        if let Ok(mut pump) = self.source.watch.pump.lock() {
            *pump = Arc::downgrade(&shared);
        }
        let mut guard = CloseUnlessOpened {
            shared: Some(shared.clone()),
        };
        let starting = shared.clone();
        self.source.mailbox.post(move |py, landing| {
            let started = match landing {
                Landing::Loop(event_loop) => start_pump(py, event_loop, &starting),
                Landing::Closed => Err(crate::errors::error("its event loop is closed")),
            };
            if let Err(error) = started {
                starting.send_opened(Err(format!(
                    "the turn's stream could not be started on its event loop: {}",
                    starting.source.secrets.scrub(&error.to_string())
                )));
                starting.closed.cancel();
            }
        });
        let provider_error =
            |message: String| StreamError::from(StreamErrorKind::Provider { message });
        match opened.await {
            Ok(Ok(())) => {
                guard.shared = None;
                Ok(Box::new(PyStream {
                    items,
                    shared,
                    done: false,
                }))
            }
            Ok(Err(message)) => Err(provider_error(message)),
            Err(_) => Err(provider_error(
                "the turn's stream was dropped while opening".into(),
            )),
        }
    }

    /// The pump of an open the kernel dropped (the turn cancelled while
    /// the source was being opened) was asked to close as the open was
    /// dropped; its work ends once the pump has, so that the turn is not
    /// over while its source still runs (a coroutine that finishes its
    /// connect despite the cancel): the kernel detaches it at the settle
    /// deadline otherwise (G5).
    async fn open_released(&self) {
        let pump = self.source.watch.pump.lock().ok().and_then(|p| p.upgrade());
        if let Some(shared) = pump {
            shared.closed.cancelled().await;
        }
    }
}

fn start_pump(py: Python<'_>, event_loop: &Bound<'_, PyAny>, shared: &Arc<Shared>) -> PyResult<()> {
    let sink = Py::new(
        py,
        PumpSink {
            shared: shared.clone(),
        },
    )?;
    let source = &shared.source;
    let to_chunk = source.to_chunk.as_ref().map(|f| f.bind(py).clone());
    // The kernel opens a turn's source once.
    let caller_context = source
        .caller_context
        .lock()
        .ok()
        .and_then(|mut c| c.take())
        .ok_or_else(|| crate::errors::error("the turn's stream was started already"))?;
    bridge(py)?.call_method1(
        "start_pump",
        (
            event_loop,
            source.source.bind(py),
            to_chunk,
            sink,
            caller_context,
        ),
    )?;
    Ok(())
}

/// The Rust side of a Python turn's stream.
struct PyStream {
    items: mpsc::UnboundedReceiver<Item>,
    shared: Arc<Shared>,
    done: bool,
}

impl Stream for PyStream {
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.items.poll_recv(cx);
        Poll::Ready(match polled {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Item::Chunk(chunk))) => {
                self.shared.took_chunk(chunk.payload().len());
                Some(Ok(StreamEvent::Chunk(chunk)))
            }
            Poll::Ready(Some(Item::End)) | Poll::Ready(None) => {
                self.done = true;
                None
            }
            Poll::Ready(Some(Item::Failed(message))) => {
                self.done = true;
                Some(Err(StreamErrorKind::Provider { message }.into()))
            }
            Poll::Ready(Some(Item::Ended(error))) => {
                self.done = true;
                Some(Err(error))
            }
            Poll::Ready(Some(Item::Finished(cut))) => Some(Ok(StreamEvent::Finished(cut))),
            Poll::Ready(Some(Item::Cancelled)) => {
                self.done = true;
                Some(Err(StreamErrorKind::SelfCancelled.into()))
            }
        })
    }
}

#[async_trait]
impl Close for PyStream {
    async fn close(&mut self) -> Result<(), CloseError> {
        self.shared.request_close();
        // The pump's `finally` closes the Python stream; the kernel bounds
        // this wait by the settle timeout.
        self.shared.closed.cancelled().await;
        Ok(())
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.shared.request_close();
        Ok(())
    }
}

impl Drop for PyStream {
    fn drop(&mut self) {
        self.shared.request_close();
    }
}
