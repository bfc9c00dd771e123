//! An axum 0.8 seat-booking service whose handler carries `#[distributed_lock]`: one
//! lock per seat (`lock:seat_{<event>_<seat>}`, built from the `Path` extractor's
//! bindings), so a seat is never sold twice although the booking is a read-check-write
//! on a store without transactions.
//!
//! - `POST /events/{event}/seats/{seat}/{user}`: books the seat; 201, or 409 when taken.
//!   Lock errors are mapped here (no `axum` feature needed): wait ran out → 423 Locked;
//!   too many waiters or Redis unavailable → 503 with `Retry-After`; lock lost → 409.
//! - `GET /events/{event}/seats/{seat}`: who has the seat (unlocked read).
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend.
//! With `PORT` set the service just serves on `127.0.0.1:$PORT`; without it, it serves
//! on a free loopback port, sends 20 concurrent bookings for one seat to itself, prints
//! the outcome and exits.
//!
//! ```text
//! cargo run --example axum_macro_handler --features axum
//! PORT=3000 REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_macro_handler --features axum
//! curl -X POST localhost:3000/events/1/seats/7/alice
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use redlock::{distributed_lock, LockError, LockManager};
use serde_json::json;

/// The service's state. The bookings live in this process to keep the example small;
/// in a real deployment they are rows every instance shares, hence a distributed lock.
#[derive(Clone)]
struct AppState {
    locks: LockManager,
    seats: Arc<Mutex<HashMap<(u64, u32), String>>>,
}

/// The handler's error: a lock error or a business outcome, mapped to HTTP here.
enum ApiError {
    Taken { by: String },
    Lock(LockError),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        ApiError::Lock(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = match self {
            ApiError::Taken { by } => {
                let body = json!({ "error": "taken", "by": by });
                return (StatusCode::CONFLICT, Json(body)).into_response();
            }
            ApiError::Lock(e) => e,
        };
        let status = match &e {
            LockError::Timeout { .. } => StatusCode::LOCKED,
            LockError::Lost { .. } => StatusCode::CONFLICT,
            e if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = Json(json!({ "error": e.kind(), "key": e.key() }));
        let mut response = (status, body).into_response();
        if let (StatusCode::SERVICE_UNAVAILABLE, Some(after)) = (status, e.retry_after()) {
            let secs = HeaderValue::from(after.as_secs().max(1));
            response.headers_mut().insert(header::RETRY_AFTER, secs);
        }
        response
    }
}

/// Books a seat while holding `lock:seat_{<event>_<seat>}`; `user` is not in the key,
/// so every user contends for the same seat.
#[distributed_lock(
    key = "seat_<event>_<seat>",
    manager = state.locks,
    ttl = "10s",
    wait = "3s",
    guard = lock
)]
async fn book(
    State(state): State<AppState>,
    Path((event, seat, user)): Path<(u64, u32, String)>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let holder = state.seats.lock().unwrap().get(&(event, seat)).cloned();
    if let Some(by) = holder {
        return Err(ApiError::Taken { by });
    }
    // Charging the card: without the lock, every concurrent request gets here.
    tokio::time::sleep(Duration::from_millis(5)).await;
    state
        .seats
        .lock()
        .unwrap()
        .insert((event, seat), user.clone());
    let body = json!({
        "event": event,
        "seat": seat,
        "user": user,
        "lock": lock.key(),
        "fencing_token": lock.fencing_token(),
    });
    Ok((StatusCode::CREATED, Json(body)))
}

async fn seat(
    State(state): State<AppState>,
    Path((event, seat)): Path<(u64, u32)>,
) -> Json<serde_json::Value> {
    let by = state.seats.lock().unwrap().get(&(event, seat)).cloned();
    Json(json!({ "event": event, "seat": seat, "by": by }))
}

fn app(state: AppState) -> Router {
    Router::new()
        .route("/events/{event}/seats/{seat}/{user}", post(book))
        .route("/events/{event}/seats/{seat}", get(seat))
        .with_state(state)
}

/// Sends a request with an empty body; the status and the body text.
async fn send(method: &str, url: &str) -> Result<(u16, String), Box<dyn std::error::Error>> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<axum::body::Bytes>>();
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(Empty::new())?;
    let response = client.request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await?,
        Err(_) => LockManager::builder().in_memory().build().await?,
    };
    println!("backend: {}", locks.backend_name());
    let state = AppState {
        locks,
        seats: Arc::default(),
    };

    if let Ok(port) = std::env::var("PORT") {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
        println!("listening on http://{}", listener.local_addr()?);
        axum::serve(listener, app(state)).await?;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    println!("listening on {base}; 20 users book seat 7 of event 1 at once");
    let server = tokio::spawn(async move { axum::serve(listener, app(state)).await });

    let requests: Vec<_> = (0..20)
        .map(|i| {
            let url = format!("{base}/events/1/seats/7/user{i}");
            tokio::spawn(async move { send("POST", &url).await.map_err(|e| e.to_string()) })
        })
        .collect();
    let mut created = Vec::new();
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for request in requests {
        let (status, body) = request.await??;
        *statuses.entry(status).or_default() += 1;
        if status == 201 {
            created.push(body);
        }
    }
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort_unstable();
    println!("responses by status: {statuses:?}");
    for body in &created {
        println!("booked: {body}");
    }
    let (_, now) = send("GET", &format!("{base}/events/1/seats/7")).await?;
    println!("seat 7 now: {now}");
    server.abort();
    if created.len() != 1 {
        return Err(format!("seat 7 was booked {} times", created.len()).into());
    }
    Ok(())
}
