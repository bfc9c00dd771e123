//! The web integration over real loopback HTTP: an axum server on 127.0.0.1:0 with
//! `LockLayer` as a `route_layer`, a hyper client, and each case on the in-memory
//! backend and on a real redis-server (`redlock-testkit`).
#![cfg(feature = "axum")]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlock::tower::{key, HeldLock, LockLayer, LockService};
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::RedisServer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

// ---------------------------------------------------------------------------------------
// Harness

#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Redis,
}

/// A manager on `backend` with its own prefix (in-memory managers share one store), and
/// the redis-server it uses, alive as long as the test holds it.
struct Locks {
    manager: LockManager,
    _server: Option<RedisServer>,
}

async fn locks(backend: Backend, test: &str, max_waiters: usize) -> Locks {
    let builder = LockManager::builder()
        .prefix(format!("web:{test}:"))
        .max_waiters_per_key(max_waiters);
    let (builder, server) = match backend {
        Backend::Memory => (builder.in_memory(), None),
        Backend::Redis => {
            let server = tokio::task::spawn_blocking(RedisServer::start)
                .await
                .expect("redis-server starts");
            (builder.single(server.url()), Some(server))
        }
    };
    let manager = builder.build().await.expect("manager builds");
    Locks {
        manager,
        _server: server,
    }
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body {:?} is not JSON: {e}", self.body))
    }
}

async fn send(client: &HttpClient, addr: SocketAddr, method: &str, path: &str) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = client.request(req).await.expect("request");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn post_(client: &HttpClient, addr: SocketAddr, path: &str) -> Reply {
    send(client, addr, "POST", path).await
}

/// Polls `cond` every 5 ms until it holds or `limit` passes; returns the time it took.
async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// `/goods/{id}/...` is locked as `goods_{id}`.
fn goods_layer(locks: &LockManager) -> LockLayer<key::PathSegment<u64>> {
    LockLayer::new(locks.clone(), key::path_segment::<u64>(1, "goods_{}"))
}

/// A handler that blocks until the test opens the gate, reporting when it starts and
/// when its future is dropped before finishing.
#[derive(Clone)]
struct Gate {
    entered: mpsc::UnboundedSender<u64>,
    open: watch::Receiver<bool>,
    calls: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

struct DropFlag(Arc<AtomicUsize>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct GateControl {
    entered: mpsc::UnboundedReceiver<u64>,
    open: watch::Sender<bool>,
    calls: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

fn gate() -> (Gate, GateControl) {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (open, open_rx) = watch::channel(false);
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    (
        Gate {
            entered: entered_tx,
            open: open_rx,
            calls: calls.clone(),
            dropped: dropped.clone(),
        },
        GateControl {
            entered,
            open,
            calls,
            dropped,
        },
    )
}

async fn gated(State(gate): State<Gate>, Path(id): Path<u64>) -> &'static str {
    gate.calls.fetch_add(1, Ordering::SeqCst);
    let mut flag = DropFlag(gate.dropped.clone(), false);
    let _ = gate.entered.send(id);
    let mut open = gate.open.clone();
    let _ = open.wait_for(|open| *open).await;
    flag.1 = true;
    "done"
}

impl GateControl {
    async fn entered(&mut self) -> u64 {
        tokio::time::timeout(Duration::from_secs(10), self.entered.recv())
            .await
            .expect("the handler was entered in time")
            .expect("sender alive")
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Memory).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Redis).await;
                }
            )*
        }
    };
}

on_both_backends!(
    concurrent_requests_for_one_key_are_serialised,
    different_keys_run_in_parallel,
    full_queue_gets_503_with_retry_after,
    expired_wait_gets_423_and_skips_the_handler,
    requests_without_a_key_pass_through,
    client_disconnect_releases_the_lock,
    lock_lost_mid_request_still_responds,
    path_spellings_of_one_id_share_one_lock,
    unparsable_id_gets_400_and_skips_the_handler,
    a_named_route_parameter_keys_every_route_alike,
);

// ---------------------------------------------------------------------------------------
// Cases

#[derive(Clone, Default)]
struct Counter {
    value: Arc<AtomicU64>,
    active: Arc<AtomicUsize>,
    max_active: Arc<AtomicUsize>,
    fences: Arc<Mutex<Vec<u64>>>,
}

/// A non-atomic read-modify-write with a pause in the middle: lost updates without a lock.
async fn bump(State(c): State<Counter>, lock: Option<Extension<HeldLock>>) -> String {
    let now = c.active.fetch_add(1, Ordering::SeqCst) + 1;
    c.max_active.fetch_max(now, Ordering::SeqCst);
    if let Some(Extension(lock)) = &lock {
        assert!(lock.is_held());
        c.fences.lock().unwrap().push(lock.fencing_token());
    }
    let read = c.value.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    c.value.store(read + 1, Ordering::SeqCst);
    c.active.fetch_sub(1, Ordering::SeqCst);
    (read + 1).to_string()
}

async fn concurrent_requests_for_one_key_are_serialised(backend: Backend) {
    const N: u64 = 24;
    let locks = locks(backend, "serialised", 1024).await;
    let locked = Counter::default();
    let unlocked = Counter::default();
    let app = Router::new()
        .route("/goods/{id}/buy", post(bump))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_secs(30)))
        .with_state(locked.clone())
        .merge(
            Router::new()
                .route("/free/{id}/buy", post(bump))
                .with_state(unlocked.clone()),
        );
    let addr = serve(app).await;
    let client = client();

    let run = |path: &'static str| {
        let requests: Vec<_> = (0..N)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { post_(&client, addr, path).await })
            })
            .collect();
        async move {
            for r in requests {
                assert_eq!(r.await.unwrap().status, StatusCode::OK);
            }
        }
    };
    run("/goods/1/buy").await;
    run("/free/1/buy").await;

    assert_eq!(
        locked.value.load(Ordering::SeqCst),
        N,
        "no update lost under the lock"
    );
    assert_eq!(locked.max_active.load(Ordering::SeqCst), 1, "one at a time");
    let fences = locked.fences.lock().unwrap().clone();
    assert_eq!(fences.len() as u64, N);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens increase in execution order: {fences:?}"
    );
    // The control: the same endpoint without the layer loses updates.
    assert!(unlocked.max_active.load(Ordering::SeqCst) > 1);
    assert!(unlocked.value.load(Ordering::SeqCst) < N);
    assert!(!locks.manager.is_locked("goods_{1}").await.unwrap());
}

/// Ten ways to write goods 42 in a path: axum's `Path<u64>` hands each to the handler
/// as `42` (percent-decoded, then `u64::from_str`).
const SPELLINGS_OF_42: [&str; 10] = [
    "42",
    "042",
    "+42",
    "0042",
    "%34%32",
    "4%32",
    "%2B42",
    "+042",
    "00000000000000000042",
    "%30%34%32",
];

/// A purchase of goods 42: a read-modify-write with a 50 ms pause in the middle.
async fn buy_42(State(c): State<Counter>, Path(id): Path<u64>) -> String {
    assert_eq!(id, 42, "every spelling reaches the handler as 42");
    let now = c.active.fetch_add(1, Ordering::SeqCst) + 1;
    c.max_active.fetch_max(now, Ordering::SeqCst);
    let read = c.value.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.value.store(read + 1, Ordering::SeqCst);
    c.active.fetch_sub(1, Ordering::SeqCst);
    (read + 1).to_string()
}

/// Regression (issue 11, finding 6): the layer locked the raw path text, so `/goods/42`,
/// `/goods/042` and `/goods/+42` took three different locks while the handler's
/// `Path<u64>` saw the same goods: ten concurrent purchases spelled ten ways lost nine
/// updates. The key comes from the parsed value, so they share one lock.
async fn path_spellings_of_one_id_share_one_lock(backend: Backend) {
    let locks = locks(backend, "spellings", 1024).await;
    let counter = Counter::default();
    let app = Router::new()
        .route("/goods/{id}/buy", post(buy_42))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_secs(30)))
        .with_state(counter.clone());
    let addr = serve(app).await;
    let client = client();
    let requests: Vec<_> = SPELLINGS_OF_42
        .iter()
        .map(|id| {
            let client = client.clone();
            let path = format!("/goods/{id}/buy");
            tokio::spawn(async move { (post_(&client, addr, &path).await, path) })
        })
        .collect();
    for r in requests {
        let (reply, path) = r.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{path}: {reply:?}");
    }
    assert_eq!(
        counter.value.load(Ordering::SeqCst),
        SPELLINGS_OF_42.len() as u64,
        "updates lost: the spellings of 42 did not share one lock"
    );
    assert_eq!(
        counter.max_active.load(Ordering::SeqCst),
        1,
        "one at a time"
    );
    assert!(!locks.manager.is_locked("goods_{42}").await.unwrap());
}

/// A path segment that is not a `u64` is answered `400 Bad Request` by the layer: the
/// handler (whose `Path<u64>` would refuse it too) is not called and no lock is taken.
async fn unparsable_id_gets_400_and_skips_the_handler(backend: Backend) {
    let locks = locks(backend, "unparsable", 1024).await;
    let counter = Counter::default();
    let app = Router::new()
        .route("/goods/{id}/buy", post(bump))
        .route_layer(goods_layer(&locks.manager))
        .with_state(counter.clone());
    let addr = serve(app).await;
    let client = client();
    for path in [
        "/goods/abc/buy",
        "/goods/-1/buy",
        "/goods/4%2F2/buy",
        "/goods/%FF/buy",
    ] {
        let reply = post_(&client, addr, path).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}: {reply:?}");
        assert_eq!(
            reply.json(),
            serde_json::json!({"error": "invalid_key", "key": null}),
            "{path}"
        );
    }
    assert_eq!(counter.active.load(Ordering::SeqCst), 0);
    assert_eq!(
        counter.value.load(Ordering::SeqCst),
        0,
        "the handler was not called"
    );
    // A valid id still goes through.
    assert_eq!(
        post_(&client, addr, "/goods/7/buy").await.status,
        StatusCode::OK
    );
    assert_eq!(counter.value.load(Ordering::SeqCst), 1);
}

/// The key the request held, or `none`.
async fn held_key(lock: Option<Extension<HeldLock>>) -> String {
    lock.map_or_else(|| "none".to_owned(), |Extension(l)| l.key().to_owned())
}

/// Issue 24, item 2: `path_segment` counts segments, so a layer over a whole router
/// locked `lock:goods_{42}` for `/jobs/42/run` and answered `/users/alice` with `400
/// invalid_key`. `path_param` finds `{id}` in the route axum matched, wherever it sits
/// (nested routers too); a route without it is a configuration error (`500`), never a
/// wrong key, and so is a key function used outside a router.
async fn a_named_route_parameter_keys_every_route_alike(backend: Backend) {
    let locks = locks(backend, "named", 1024).await;
    let by_id = || {
        LockLayer::new(
            locks.manager.clone(),
            key::path_param::<u64>("id", "job_{}"),
        )
    };
    let app = Router::new()
        .route("/jobs/{id}/run", post(held_key))
        .route("/teams/{team}/jobs/{id}/rename", post(held_key))
        .route("/users/{name}", post(held_key))
        .route_layer(by_id())
        .nest(
            "/v2",
            Router::new()
                .route("/jobs/{id}/run", post(held_key))
                .route_layer(by_id()),
        );
    let addr = serve(app).await;
    let client = client();
    let full = "web:named:job_{42}";
    for path in [
        "/jobs/42/run",
        "/jobs/042/run",
        "/teams/7/jobs/42/rename",
        "/v2/jobs/%34%32/run",
    ] {
        let reply = post_(&client, addr, path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {reply:?}");
        assert_eq!(reply.body, full, "{path}");
    }
    let misfit = serde_json::json!({"error": "invalid_option", "key": null});
    let reply = post_(&client, addr, "/users/alice").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
    assert_eq!(reply.json(), misfit);
    // Outside a router (no route matched yet): a configuration error too.
    let outside = key::path_param::<u64>("id", "job_{}");
    let request = Request::post("/jobs/42/run").body(()).unwrap();
    let err = redlock::tower::KeyFn::key(&outside, &request).unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    let reply = post_(&client, addr, "/jobs/abc/run").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert!(!locks.manager.is_locked("job_{42}").await.unwrap());
}

async fn sleepy(Path(_id): Path<u64>) -> &'static str {
    tokio::time::sleep(Duration::from_millis(200)).await;
    "ok"
}

async fn different_keys_run_in_parallel(backend: Backend) {
    const N: u64 = 8;
    let locks = locks(backend, "parallel", 1024).await;
    let app = Router::new()
        .route("/goods/{id}/buy", post(sleepy))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_secs(30)));
    let addr = serve(app).await;
    let client = client();
    // Warm up the connection pool and the backend.
    post_(&client, addr, "/goods/0/buy").await;

    let batch = |paths: Vec<String>| {
        let client = client.clone();
        async move {
            let start = Instant::now();
            let requests: Vec<_> = paths
                .into_iter()
                .map(|path| {
                    let client = client.clone();
                    tokio::spawn(async move { post_(&client, addr, &path).await })
                })
                .collect();
            for r in requests {
                assert_eq!(r.await.unwrap().status, StatusCode::OK);
            }
            start.elapsed()
        }
    };
    let one = batch(vec!["/goods/100/buy".into()]).await;
    let parallel = batch((1..=N).map(|i| format!("/goods/{i}/buy")).collect()).await;
    let serial = batch((1..=N).map(|_| "/goods/99/buy".to_owned()).collect()).await;
    println!(
        "[{backend:?}] handler 200 ms: 1 request {one:?}; {N} requests on {N} keys {parallel:?} \
         ({:.2}x one); {N} requests on 1 key {serial:?} ({:.2}x one)",
        parallel.as_secs_f64() / one.as_secs_f64(),
        serial.as_secs_f64() / one.as_secs_f64(),
    );
    assert!(
        serial >= Duration::from_millis(200 * N),
        "one key is serialised"
    );
    assert!(
        parallel < Duration::from_millis(200 * N / 2),
        "{N} keys took {parallel:?}, expected about one request's time"
    );
}

async fn full_queue_gets_503_with_retry_after(backend: Backend) {
    // One waiter per key: the request waiting for the lock fills the queue.
    let locks = locks(backend, "queue", 1).await;
    let (gate, mut control) = gate();
    let app = Router::new()
        .route("/goods/{id}/hold", post(gated))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_secs(30)))
        .with_state(gate);
    let addr = serve(app).await;
    let client = client();

    let holder = tokio::spawn({
        let client = client.clone();
        async move { post_(&client, addr, "/goods/5/hold").await }
    });
    assert_eq!(control.entered().await, 5);
    // Two more: whichever comes second finds the one queue slot taken, at once.
    let (done, mut replies) = mpsc::unbounded_channel();
    for _ in 0..2 {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move { done.send(post_(&client, addr, "/goods/5/hold").await) });
    }
    let rejected = tokio::time::timeout(Duration::from_secs(10), replies.recv())
        .await
        .expect("one request is rejected while the holder still runs")
        .unwrap();
    assert_eq!(
        rejected.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{rejected:?}"
    );
    assert_eq!(rejected.headers["retry-after"], "1");
    assert_eq!(rejected.headers["content-type"], "application/json");
    assert_eq!(
        rejected.json(),
        serde_json::json!({"error": "queue_full", "key": "web:queue:goods_{5}"})
    );
    assert_eq!(
        control.calls.load(Ordering::SeqCst),
        1,
        "the handler was not called"
    );

    control.open();
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    let waiter = replies.recv().await.unwrap();
    assert_eq!(waiter.status, StatusCode::OK, "the queued request ran");
    assert_eq!(control.calls.load(Ordering::SeqCst), 2);
}

async fn expired_wait_gets_423_and_skips_the_handler(backend: Backend) {
    let locks = locks(backend, "expired", 1024).await;
    let (gate, mut control) = gate();
    let app = Router::new()
        .route("/goods/{id}/hold", post(gated))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_millis(150)))
        .with_state(gate);
    let addr = serve(app).await;
    let client = client();

    let holder = tokio::spawn({
        let client = client.clone();
        async move { post_(&client, addr, "/goods/6/hold").await }
    });
    control.entered().await;
    let start = Instant::now();
    let rejected = post_(&client, addr, "/goods/6/hold").await;
    let waited = start.elapsed();
    assert_eq!(rejected.status, StatusCode::LOCKED, "{rejected:?}");
    assert!(waited >= Duration::from_millis(150), "waited {waited:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert_eq!(rejected.headers["retry-after"], "1");
    assert_eq!(
        rejected.json(),
        serde_json::json!({"error": "timeout", "key": "web:expired:goods_{6}"})
    );
    assert_eq!(
        control.calls.load(Ordering::SeqCst),
        1,
        "the handler was not called"
    );

    control.open();
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
}

async fn requests_without_a_key_pass_through(backend: Backend) {
    const N: usize = 6;
    let locks = locks(backend, "passthrough", 1024).await;
    let counter = Counter::default();
    let by_tenant = LockLayer::new(
        locks.manager.clone(),
        key::header::<String>("x-tenant", "tenant_{}"),
    );
    let app = Router::new()
        .route("/orders", post(bump))
        .route_layer(by_tenant)
        .with_state(counter.clone());
    let addr = serve(app).await;
    let client = client();

    // No x-tenant header: no key, so no lock, no serialisation, no HeldLock.
    let requests: Vec<_> = (0..N)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { post_(&client, addr, "/orders").await })
        })
        .collect();
    for r in requests {
        assert_eq!(r.await.unwrap().status, StatusCode::OK);
    }
    assert!(
        counter.max_active.load(Ordering::SeqCst) > 1,
        "ran concurrently"
    );
    assert!(counter.fences.lock().unwrap().is_empty(), "no HeldLock");

    // With the header the same route is locked.
    let req = Request::post(format!("http://{addr}/orders"))
        .header("x-tenant", "acme")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), StatusCode::OK);
    assert_eq!(counter.fences.lock().unwrap().len(), 1);
}

async fn quick(Path(_id): Path<u64>) -> &'static str {
    "quick"
}

async fn client_disconnect_releases_the_lock(backend: Backend) {
    let locks = locks(backend, "disconnect", 1024).await;
    let (gate, mut control) = gate();
    let app = Router::new()
        .route("/goods/{id}/hold", post(gated))
        .route("/goods/{id}/quick", post(quick))
        .route_layer(goods_layer(&locks.manager).wait(Duration::from_secs(2)))
        .with_state(gate);
    let addr = serve(app).await;

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /goods/7/hold HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(control.entered().await, 7);
    assert!(locks.manager.is_locked("goods_{7}").await.unwrap());

    drop(stream);
    let freed = eventually(Duration::from_secs(5), || {
        let manager = locks.manager.clone();
        async move { !manager.is_locked("goods_{7}").await.unwrap() }
    })
    .await
    .expect("the lock is released after the client went away");
    println!("[{backend:?}] lock released {freed:?} after the client disconnected");
    assert_eq!(
        control.dropped.load(Ordering::SeqCst),
        1,
        "the handler was dropped"
    );

    let start = Instant::now();
    let reply = post_(&client(), addr, "/goods/7/quick").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

async fn lock_lost_mid_request_still_responds(backend: Backend) {
    let locks = locks(backend, "lost", 1024).await;
    // A 100 ms lease that nothing renews, and a handler that outlives it.
    let layer = goods_layer(&locks.manager).options(
        LockOptions::new()
            .ttl(Duration::from_millis(100))
            .watchdog(false),
    );
    let app = Router::new()
        .route(
            "/goods/{id}/slow",
            post(|Extension(lock): Extension<HeldLock>| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if lock.is_held() {
                    "held"
                } else {
                    "lost"
                }
            }),
        )
        .route_layer(layer);
    let addr = serve(app).await;
    let reply = post_(&client(), addr, "/goods/8/slow").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "lost");
}

// ---------------------------------------------------------------------------------------
// LockError as a response, from an axum handler

fn error_of(kind: &str) -> LockError {
    let key = "lock:goods_{42}".to_owned();
    match kind {
        "timeout" => LockError::Timeout { key },
        "queue_full" => LockError::QueueFull { key },
        "lost" => LockError::Lost { key },
        "not_held" => LockError::NotHeld { key },
        "quorum_unavailable" => LockError::QuorumUnavailable {
            key,
            reached: 1,
            needed: 3,
        },
        "replicas_unavailable" => LockError::ReplicasUnavailable {
            key,
            acked: 0,
            wanted: 1,
        },
        "no_manager" => LockError::NoManager,
        "invalid_key" => LockError::InvalidKey {
            reason: "the key is empty".into(),
        },
        "invalid_option" => LockError::InvalidOption {
            reason: "ttl".into(),
        },
        "backend" => LockError::Backend {
            operation: "acquire",
            node: None,
            source: ::redis::RedisError::from((::redis::ErrorKind::Io, "connection refused")),
        },
        other => panic!("unknown kind {other}"),
    }
}

async fn failing(Path(kind): Path<String>) -> Result<&'static str, LockError> {
    Err(error_of(&kind))
}

#[tokio::test]
async fn lock_error_into_response_mapping() {
    let addr = serve(Router::new().route("/fail/{kind}", get(failing))).await;
    let client = client();
    let cases = [
        ("timeout", 423, Some("1"), true),
        ("queue_full", 503, Some("1"), true),
        ("quorum_unavailable", 503, Some("1"), true),
        ("replicas_unavailable", 503, Some("1"), true),
        ("backend", 503, Some("1"), false),
        ("lost", 409, None, true),
        ("invalid_key", 400, None, false),
        ("not_held", 500, None, true),
        ("no_manager", 500, None, false),
        ("invalid_option", 500, None, false),
    ];
    for (kind, status, retry_after, has_key) in cases {
        let reply = send(&client, addr, "GET", &format!("/fail/{kind}")).await;
        assert_eq!(reply.status.as_u16(), status, "{kind}: {reply:?}");
        assert_eq!(
            reply
                .headers
                .get("retry-after")
                .map(|v| v.to_str().unwrap()),
            retry_after,
            "{kind}"
        );
        assert_eq!(reply.headers["content-type"], "application/json", "{kind}");
        let key = if has_key {
            serde_json::json!("lock:goods_{42}")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(
            reply.json(),
            serde_json::json!({"error": kind, "key": key}),
            "{kind}"
        );
    }
}

/// A user error wrapping `LockError` delegates to its response.
#[tokio::test]
async fn a_wrapping_error_type_reuses_the_mapping() {
    use axum::response::{IntoResponse, Response};

    enum ShopError {
        Lock(LockError),
        SoldOut,
    }
    impl From<LockError> for ShopError {
        fn from(e: LockError) -> Self {
            Self::Lock(e)
        }
    }
    impl IntoResponse for ShopError {
        fn into_response(self) -> Response {
            match self {
                Self::Lock(e) => e.into_response(),
                Self::SoldOut => (StatusCode::GONE, "sold out").into_response(),
            }
        }
    }
    async fn buy(Path(id): Path<u64>) -> Result<&'static str, ShopError> {
        if id == 0 {
            return Err(ShopError::SoldOut);
        }
        Err(LockError::QueueFull {
            key: format!("lock:goods_{{{id}}}"),
        })?
    }
    let addr = serve(Router::new().route("/goods/{id}/buy", post(buy))).await;
    let client = client();
    let reply = post_(&client, addr, "/goods/3/buy").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["key"], "lock:goods_{3}");
    assert_eq!(
        post_(&client, addr, "/goods/0/buy").await.status,
        StatusCode::GONE
    );
}

/// The layer keeps tower's contract for axum: a `Clone + Send + Sync` service whose
/// future is `Send`.
#[test]
fn service_and_future_are_send() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    fn send<T: Send + 'static>() {}
    type Svc = LockService<axum::routing::Route, key::PathSegment<u64>>;
    send_sync_clone::<Svc>();
    send_sync_clone::<LockLayer<key::Header<String>>>();
    send::<redlock::tower::future::ResponseFuture<axum::routing::Route, Body>>();
    send_sync_clone::<HeldLock>();
}
