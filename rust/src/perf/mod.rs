//! The load generator behind `tritonfast perf`: closed-loop (a fixed number of requests in
//! flight) or open-loop (requests sent on a schedule) load against a `KServe` v2 server, over
//! HTTP/1.1 or gRPC, from event-loop threads that never touch Python.
//!
//! The caller prepares the requests' bytes once ([`LoadSpec::payloads`]: whole HTTP requests,
//! or serialized `ModelInferRequest` messages); the threads send them in turn and record each
//! request's timestamps ([`Record`]). The caller reads the records out in windows
//! ([`Load::take`]) and judges them; nothing here knows about models or tensors.

mod grpc;
mod http1;
mod schedule;
mod stream;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

pub use schedule::Gaps;

/// How requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive; each payload is a whole request (head and body).
    Http,
    /// gRPC over HTTP/2; each payload is one serialized message for [`LoadSpec::path`].
    Grpc,
    /// gRPC `ModelStreamInfer`: each context keeps one stream open and sends its requests on
    /// it one after another (closed loop only); each payload a `ModelInferRequest`.
    GrpcStream,
}

/// How fast requests go out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// This many requests in flight at all times, each sent as the previous one is answered.
    Concurrency(usize),
    /// Requests sent on a schedule at this many per second, whether or not earlier ones have
    /// been answered; `poisson` draws the gaps from an exponential distribution.
    Rate { per_second: f64, poisson: bool },
}

/// What to send, where, and how.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub protocol: Protocol,
    /// `host:port`.
    pub address: String,
    /// gRPC: the method's path, e.g. `/inference.GRPCInferenceService/ModelInfer`.
    pub path: String,
    /// The requests, sent in turn (each context starts at its own offset).
    pub payloads: Vec<Vec<u8>>,
    /// When not empty, the order of the payloads (their indices), one script per context (a
    /// sequence model's requests, each context its own sequences), repeated; an open loop
    /// takes the scripts in turn.
    pub scripts: Vec<Vec<usize>>,
    /// Streams: the model is decoupled, so a request is complete at the response that says
    /// `triton_final_response` (not at its first response).
    pub decoupled: bool,
    /// An open loop over scripts sends a script's next request only once its last one is
    /// answered (`--serial-sequences`).
    pub serial: bool,
    /// Event-loop threads; the load is spread over them.
    pub threads: usize,
    /// gRPC: HTTP/2 connections per thread, the thread's requests spread over them.
    pub connections_per_thread: usize,
    pub pace: Pace,
    /// Seeds the Poisson schedule, so that a run can be repeated.
    pub seed: u64,
}

/// One answered request, in nanoseconds since the load began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The request's first byte was about to be written.
    pub start: u64,
    /// The request was handed to the socket (HTTP) or to the connection (gRPC).
    pub sent: u64,
    /// The first byte (HTTP), the headers (gRPC) or the first response (streams) arrived.
    pub first_byte: u64,
    /// The answer was complete.
    pub end: u64,
    /// Whether the server answered with success (HTTP 200, gRPC status 0).
    pub ok: bool,
    /// Responses received for the request (more than one from a decoupled model's stream).
    pub responses: u32,
    /// The payload sent (its index in [`LoadSpec::payloads`]).
    pub payload: u32,
}

/// The most error texts kept; a broken load fails every request the same way.
const KEPT_ERRORS: usize = 16;

/// What the threads and the caller share.
#[derive(Debug)]
struct Shared {
    epoch: Instant,
    stop: AtomicBool,
    records: Vec<Mutex<Vec<Record>>>,
    succeeded: AtomicU64,
    failed: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn record(&self, thread: usize, record: Record) {
        let counter = if record.ok {
            &self.succeeded
        } else {
            &self.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.records[thread].lock().push(record);
    }

    fn error(&self, text: String) {
        let mut errors = self.errors.lock();
        if errors.len() < KEPT_ERRORS && !errors.contains(&text) {
            errors.push(text);
        }
    }
}

/// A running load; dropping it stops it.
#[derive(Debug)]
pub struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Request counts so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub succeeded: u64,
    pub failed: u64,
}

impl Load {
    /// Connects every thread's connections and starts sending; fails if a connection cannot
    /// be made (stopping the threads that connected).
    pub fn start(spec: LoadSpec) -> Result<Load, String> {
        check(&spec)?;
        let threads = spec.threads.max(1);
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            records: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
        });
        let spec = Arc::new(spec);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads {
            let share = Share::of(&spec, index, threads);
            let (spec, shared, ready) = (Arc::clone(&spec), Arc::clone(&shared), ready_tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("tritonfast-perf-{index}"))
                .spawn(move || run_thread(&spec, &shared, index, share, &ready))
                .map_err(|e| format!("cannot start a load thread: {e}"))?;
            handles.push(handle);
        }
        drop(ready_tx);
        let mut load = Load {
            shared,
            threads: handles,
        };
        for _ in 0..threads {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(text)) => {
                    load.stop();
                    return Err(text);
                }
                Err(_) => {
                    load.stop();
                    return Err("a load thread ended before it connected".to_string());
                }
            }
        }
        Ok(load)
    }

    /// Nanoseconds since the load began, on the records' clock.
    pub fn now(&self) -> u64 {
        self.shared.now()
    }

    /// The records of requests answered since the last call, in no particular order.
    pub fn take(&self) -> Vec<Record> {
        let mut all = Vec::new();
        for records in &self.shared.records {
            all.append(&mut records.lock());
        }
        all
    }

    pub fn counts(&self) -> Counts {
        Counts {
            succeeded: self.shared.succeeded.load(Ordering::Relaxed),
            failed: self.shared.failed.load(Ordering::Relaxed),
        }
    }

    /// The distinct texts of the first failures (at most 16).
    pub fn errors(&self) -> Vec<String> {
        self.shared.errors.lock().clone()
    }

    /// Sends nothing more, waits for the answers of what is in flight (at most [`STOP_GRACE`], then
    /// gives those up), and joins the threads.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a stopping thread waits for the answers still in flight.
const STOP_GRACE: Duration = Duration::from_secs(10);

fn check(spec: &LoadSpec) -> Result<(), String> {
    if spec.payloads.is_empty() {
        return Err("no requests to send".to_string());
    }
    if spec
        .scripts
        .iter()
        .flatten()
        .any(|&index| index >= spec.payloads.len())
    {
        return Err("a script names a payload that is not there".to_string());
    }
    if spec.scripts.iter().any(Vec::is_empty) {
        return Err("a script is empty".to_string());
    }
    if spec.protocol == Protocol::GrpcStream && matches!(spec.pace, Pace::Rate { .. }) {
        return Err("streams are measured with a concurrency, not a request rate".to_string());
    }
    match spec.pace {
        Pace::Concurrency(0) => Err("the concurrency must be at least 1".to_string()),
        Pace::Rate { per_second, .. } if !(per_second > 0.0 && per_second.is_finite()) => Err(
            format!("the request rate must be above 0, not {per_second}"),
        ),
        _ => Ok(()),
    }
}

/// One thread's part of the load.
#[derive(Debug, Clone, Copy)]
enum Share {
    /// This many contexts, each with one request in flight.
    Contexts(usize),
    /// This many requests per second.
    Rate(f64),
}

impl Share {
    fn of(spec: &LoadSpec, index: usize, threads: usize) -> Share {
        match spec.pace {
            Pace::Concurrency(n) => Share::Contexts(n / threads + usize::from(index < n % threads)),
            #[allow(clippy::cast_precision_loss)] // thread counts are small
            Pace::Rate { per_second, .. } => Share::Rate(per_second / threads as f64),
        }
    }
}

fn run_thread(
    spec: &Arc<LoadSpec>,
    shared: &Arc<Shared>,
    index: usize,
    share: Share,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start a load thread's event loop: {e}")));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let senders = match Senders::connect(spec, share).await {
            Ok(senders) => senders,
            Err(text) => {
                let _ = ready.send(Err(text));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let thread = Rc::new(Thread {
            spec: Arc::clone(spec),
            shared: Arc::clone(shared),
            index,
            senders,
            payloads: payloads(spec),
            live: Cell::new(0),
            idle: Notify::new(),
        });
        match share {
            Share::Contexts(n) => {
                for context in 0..n {
                    Thread::spawn(&thread, closed_loop(Rc::clone(&thread), context));
                }
            }
            Share::Rate(per_second) => {
                let gaps = match spec.pace {
                    Pace::Rate { poisson: true, .. } => {
                        Gaps::poisson(per_second, spec.seed.wrapping_add(index as u64))
                    }
                    _ => Gaps::constant(per_second),
                };
                open_loop(&thread, gaps).await;
            }
        }
        thread.wait_for_stop().await;
        // What is still in flight gets a grace period; a server that stopped answering must
        // not keep the caller waiting forever (dropping the runtime abandons the rest).
        let _ = tokio::time::timeout(STOP_GRACE, thread.all_done()).await;
    });
}

/// One load thread's state, shared by its tasks (all on the thread's own event loop).
struct Thread {
    spec: Arc<LoadSpec>,
    shared: Arc<Shared>,
    index: usize,
    senders: Senders,
    payloads: Vec<Payload>,
    /// Tasks still running.
    live: Cell<usize>,
    /// Woken when the last task ends.
    idle: Notify,
}

/// How often a thread looks whether it has been told to stop.
const STOP_POLL: Duration = Duration::from_millis(5);

impl Thread {
    fn spawn(thread: &Rc<Thread>, task: impl std::future::Future<Output = ()> + 'static) {
        thread.live.set(thread.live.get() + 1);
        let owner = Rc::clone(thread);
        tokio::task::spawn_local(async move {
            task.await;
            owner.live.set(owner.live.get() - 1);
            if owner.live.get() == 0 {
                owner.idle.notify_one();
            }
        });
    }

    async fn all_done(&self) {
        while self.live.get() > 0 {
            self.idle.notified().await;
        }
    }

    async fn wait_for_stop(&self) {
        while !self.shared.stopping() {
            tokio::time::sleep(STOP_POLL).await;
        }
    }

    /// Sends one request, waits for its answer (on `stream` when the load streams) and
    /// records it.
    async fn one_request(&self, index: usize, stream: Option<&mut Option<stream::StreamCall>>) {
        let shared = &*self.shared;
        let payload = &self.payloads[index];
        let start = shared.now();
        let exchange = match stream {
            None => self.senders.exchange(payload, shared).await,
            Some(call) => {
                let decoupled = self.spec.decoupled;
                self.senders
                    .stream_exchange(call, payload, decoupled, shared)
                    .await
            }
        };
        let end = shared.now();
        let record = Record {
            start,
            sent: exchange.sent,
            first_byte: exchange.first_byte,
            end,
            ok: exchange.ok,
            responses: exchange.responses,
            payload: u32::try_from(index).unwrap_or(u32::MAX),
        };
        shared.record(self.index, record);
    }
}

/// Which payload goes next: the payloads in turn from an offset, or a script's.
#[derive(Debug)]
struct Order {
    /// Scripts' positions (none: the payloads in turn).
    positions: Vec<usize>,
    scripts: Option<Vec<Vec<usize>>>,
    turn: usize,
}

impl Order {
    /// The order of the closed loop's context `context` (numbered across all threads): its
    /// own script, or the payloads from an offset of its own so that several are in flight.
    fn of_context(spec: &LoadSpec, context: usize) -> Order {
        if spec.scripts.is_empty() {
            return Order {
                positions: Vec::new(),
                scripts: None,
                turn: context * 7919,
            };
        }
        let script = spec.scripts[context % spec.scripts.len()].clone();
        Order {
            positions: vec![0],
            scripts: Some(vec![script]),
            turn: 0,
        }
    }

    /// An open loop's order: the thread's share of the scripts (every `threads`-th, so that
    /// no script is sent from two threads), each in turn from where it was left.
    fn of_open_loop(spec: &LoadSpec, thread: usize) -> Order {
        if spec.scripts.is_empty() {
            return Order {
                positions: Vec::new(),
                scripts: None,
                turn: thread * 104_729,
            };
        }
        let threads = spec.threads.max(1);
        let scripts: Vec<Vec<usize>> = spec
            .scripts
            .iter()
            .skip(thread)
            .step_by(threads)
            .cloned()
            .collect();
        Order {
            positions: vec![0; scripts.len()],
            scripts: Some(scripts),
            turn: 0,
        }
    }

    /// Scripts this order takes turns over (none: the payloads in turn).
    fn slots(&self) -> usize {
        self.scripts.as_ref().map_or(0, Vec::len)
    }

    fn next(&mut self, payloads: usize) -> usize {
        let turn = self.turn;
        self.turn += 1;
        match self.scripts.as_ref().map(Vec::len) {
            None => turn % payloads,
            Some(slots) => self.next_of(turn % slots),
        }
    }

    /// The next payload of script `slot`.
    fn next_of(&mut self, slot: usize) -> usize {
        let Some(scripts) = &self.scripts else {
            return 0;
        };
        let script = &scripts[slot];
        let index = script[self.positions[slot] % script.len()];
        self.positions[slot] += 1;
        index
    }

    /// The next script after the last one taken whose previous request is answered (`busy`:
    /// one flag per script), if any.
    fn next_free(&mut self, busy: &[Cell<bool>]) -> Option<usize> {
        let slots = busy.len();
        let found = (0..slots)
            .map(|k| (self.turn + k) % slots)
            .find(|&slot| !busy[slot].get())?;
        self.turn = found + 1;
        Some(found)
    }
}

/// A context: one request in flight, the next sent as soon as it is answered.
async fn closed_loop(thread: Rc<Thread>, context: usize) {
    let threads = thread.spec.threads.max(1);
    let mut order = Order::of_context(&thread.spec, thread.index + context * threads);
    let mut stream = None;
    let streams = thread.spec.protocol == Protocol::GrpcStream;
    while !thread.shared.stopping() {
        let index = order.next(thread.payloads.len());
        thread
            .one_request(index, streams.then_some(&mut stream))
            .await;
    }
}

/// Requests sent on the schedule `gaps`, each in a task of its own, until told to stop.
async fn open_loop(thread: &Rc<Thread>, gaps: Gaps) {
    let mut order = Order::of_open_loop(&thread.spec, thread.index);
    let mut schedule = Schedule::new(gaps);
    if thread.spec.serial && order.slots() > 0 {
        serial_open_loop(thread, schedule, order).await;
        return;
    }
    while schedule.wait_next(thread).await {
        let index = order.next(thread.payloads.len());
        let owner = Rc::clone(thread);
        Thread::spawn(thread, async move { owner.one_request(index, None).await });
    }
}

/// When an open loop's requests are due.
struct Schedule {
    origin: tokio::time::Instant,
    due: Duration,
    gaps: Gaps,
}

impl Schedule {
    fn new(gaps: Gaps) -> Self {
        Schedule {
            origin: tokio::time::Instant::now(),
            due: Duration::ZERO,
            gaps,
        }
    }

    /// Sleeps until the next request is due: false once the load is told to stop.
    async fn wait_next(&mut self, thread: &Thread) -> bool {
        self.due += self.gaps.next_gap();
        let at = self.origin + self.due;
        // Wake at least every STOP_POLL so that a slow rate still stops promptly.
        while tokio::time::Instant::now() < at && !thread.shared.stopping() {
            tokio::time::sleep_until(at.min(tokio::time::Instant::now() + STOP_POLL)).await;
        }
        !thread.shared.stopping()
    }
}

/// An open loop over scripts with at most one request of each in flight (a sequence's
/// requests one after another): a request that comes due while every script waits for its
/// answer goes out as soon as one is answered, late.
async fn serial_open_loop(thread: &Rc<Thread>, mut schedule: Schedule, mut order: Order) {
    let busy: Rc<Vec<Cell<bool>>> = Rc::new((0..order.slots()).map(|_| Cell::new(false)).collect());
    let freed = Rc::new(Notify::new());
    while schedule.wait_next(thread).await {
        let slot = loop {
            if thread.shared.stopping() {
                return;
            }
            if let Some(slot) = order.next_free(&busy) {
                break slot;
            }
            let _ = tokio::time::timeout(STOP_POLL, freed.notified()).await;
        };
        busy[slot].set(true);
        let index = order.next_of(slot);
        let (owner, busy, freed) = (Rc::clone(thread), Rc::clone(&busy), Rc::clone(&freed));
        Thread::spawn(thread, async move {
            owner.one_request(index, None).await;
            busy[slot].set(false);
            freed.notify_one();
        });
    }
}

/// A thread's connections.
enum Senders {
    /// HTTP/1.1: idle connections, one taken per request (a closed loop holds one each).
    Http {
        address: String,
        idle: RefCell<Vec<http1::Connection>>,
    },
    /// gRPC: HTTP/2 connections whose streams carry the requests.
    Grpc {
        connections: Vec<grpc::Connection>,
        next: Cell<usize>,
    },
}

impl Senders {
    async fn connect(spec: &LoadSpec, share: Share) -> Result<Senders, String> {
        let failed = |e: std::io::Error| format!("cannot connect to {}: {e}", spec.address);
        match spec.protocol {
            Protocol::Http => {
                let count = match share {
                    Share::Contexts(n) => n,
                    Share::Rate(_) => 1,
                };
                let mut idle = Vec::with_capacity(count);
                for _ in 0..count {
                    idle.push(
                        http1::Connection::open(&spec.address)
                            .await
                            .map_err(failed)?,
                    );
                }
                Ok(Senders::Http {
                    address: spec.address.clone(),
                    idle: RefCell::new(idle),
                })
            }
            Protocol::Grpc | Protocol::GrpcStream => {
                let mut connections = Vec::new();
                for _ in 0..spec.connections_per_thread.max(1) {
                    connections.push(grpc::Connection::open(&spec.address, &spec.path).await?);
                }
                Ok(Senders::Grpc {
                    connections,
                    next: Cell::new(0),
                })
            }
        }
    }

    /// Sends one request and waits for its answer.
    async fn exchange(&self, payload: &Payload, shared: &Shared) -> Exchange {
        match self {
            Senders::Http { address, idle } => {
                let taken = idle.borrow_mut().pop();
                let mut connection = match taken {
                    Some(connection) => connection,
                    None => match http1::Connection::open(address).await {
                        Ok(connection) => connection,
                        Err(e) => return Exchange::failed(shared, format!("cannot connect: {e}")),
                    },
                };
                let exchange = connection.exchange(&payload.bytes, shared).await;
                if connection.reusable() {
                    idle.borrow_mut().push(connection);
                }
                exchange
            }
            Senders::Grpc { connections, next } => {
                let index = next.get();
                next.set((index + 1) % connections.len());
                connections[index].exchange(&payload.bytes, shared).await
            }
        }
    }

    /// Sends one request on the context's stream, opened first if it has none (or its last
    /// one broke), and waits until the request is complete.
    async fn stream_exchange(
        &self,
        call: &mut Option<stream::StreamCall>,
        payload: &Payload,
        decoupled: bool,
        shared: &Shared,
    ) -> Exchange {
        let Senders::Grpc { connections, next } = self else {
            return Exchange::failed(shared, "streams need gRPC".to_string());
        };
        if call.is_none() {
            let index = next.get();
            next.set((index + 1) % connections.len());
            match connections[index].open_stream(decoupled).await {
                Ok(opened) => *call = Some(opened),
                Err(text) => return Exchange::failed(shared, text),
            }
        }
        let Some(open) = call.as_mut() else {
            unreachable!("opened above")
        };
        match open.exchange(&payload.bytes, shared).await {
            Ok(exchange) => exchange,
            Err(text) => {
                *call = None;
                Exchange::failed(shared, text)
            }
        }
    }
}

/// A payload as a thread sends it: gRPC messages carry their 5-byte frame header already.
#[derive(Debug, Clone)]
struct Payload {
    bytes: bytes::Bytes,
}

fn payloads(spec: &LoadSpec) -> Vec<Payload> {
    spec.payloads
        .iter()
        .map(|payload| Payload {
            bytes: match spec.protocol {
                Protocol::Http => bytes::Bytes::copy_from_slice(payload),
                Protocol::Grpc | Protocol::GrpcStream => grpc::framed(payload),
            },
        })
        .collect()
}

/// What one request came to.
#[derive(Debug)]
struct Exchange {
    sent: u64,
    first_byte: u64,
    ok: bool,
    responses: u32,
}

impl Exchange {
    fn failed(shared: &Shared, text: String) -> Exchange {
        shared.error(text);
        let now = shared.now();
        Exchange {
            sent: now,
            first_byte: now,
            ok: false,
            responses: 0,
        }
    }
}
