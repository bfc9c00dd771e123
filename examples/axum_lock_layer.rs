//! A small shop service: purchases of one goods are serialised by `LockLayer`, restocks
//! by `#[distributed_lock]`, on the same lock key, so the stock's read-modify-write
//! (read, pay, write) never loses an update.
//!
//! - `POST /goods/{id}/buy`: guarded by the layer (`lock:goods_{<id>}`); 423 when the
//!   lock could not be had within 3 s, 503 + `Retry-After` when too many wait for it.
//!   The key is built from the id parsed as the handler's `Path<u64>` parses it, so
//!   `/goods/42/buy`, `/goods/042/buy` and `/goods/+42/buy` (one goods for the handler)
//!   take one lock; an id that is not a `u64` is answered 400 before the handler runs.
//! - `POST /goods/{id}/restock`: an annotated handler locking `goods_<id>`, i.e.
//!   `lock:goods_{<id>}` too, so a restock never races a purchase.
//! - `GET /goods/{id}`: the stock, unlocked.
//!
//! Backend: `REDIS_URL` when set, else the in-memory backend. Port: `PORT`, else 3000.
//!
//! ```text
//! cargo run --example axum_lock_layer --features axum
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_lock_layer --features axum
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use redlock::tower::{key, HeldLock, LockLayer};
use redlock::{distributed_lock, LockError, LockManager};
use serde_json::{json, Value};

/// The shop's state. The stock lives in this process to keep the example small; in a
/// real deployment it is a database shared by every instance, which is why the lock
/// is a distributed one.
#[derive(Clone)]
struct Shop {
    locks: LockManager,
    stock: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Shop {
    fn read(&self, id: u64) -> u32 {
        self.stock.lock().unwrap().get(&id).copied().unwrap_or(0)
    }

    fn write(&self, id: u64, n: u32) {
        self.stock.lock().unwrap().insert(id, n);
    }
}

/// The shop's errors; a lock failure answers with redlock's status and JSON body.
enum ShopError {
    SoldOut(u64),
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        match self {
            Self::SoldOut(id) => (
                StatusCode::CONFLICT,
                Json(json!({"error": "sold_out", "goods": id})),
            )
                .into_response(),
            Self::Lock(e) => e.into_response(),
        }
    }
}

/// Runs under the lock `LockLayer` took for this request (`lock:goods_{<id>}`).
async fn buy(
    State(shop): State<Shop>,
    Path(id): Path<u64>,
    Extension(lock): Extension<HeldLock>,
) -> Result<Json<Value>, ShopError> {
    let left = shop.read(id);
    if left == 0 {
        return Err(ShopError::SoldOut(id));
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // take the payment
    shop.write(id, left - 1);
    Ok(Json(json!({
        "goods": id,
        "bought": 1,
        "left": left - 1,
        "fencing_token": lock.fencing_token(),
    })))
}

/// Locks `goods_<id>` itself: the same key the layer takes for purchases.
#[distributed_lock(key = "goods_<id>", manager = shop.locks, ttl = "10s", wait = "3s")]
async fn restock(State(shop): State<Shop>, Path(id): Path<u64>) -> Result<Json<Value>, ShopError> {
    let before = shop.read(id);
    tokio::time::sleep(Duration::from_millis(50)).await; // ask the warehouse
    shop.write(id, before + 10);
    Ok(Json(
        json!({"goods": id, "restocked": 10, "left": before + 10}),
    ))
}

async fn show(State(shop): State<Shop>, Path(id): Path<u64>) -> Json<Value> {
    Json(json!({"goods": id, "left": shop.read(id)}))
}

fn app(shop: Shop) -> Router {
    // `::<u64>`: the type `buy` extracts. The key must come from the parsed id, not the
    // path's text, or `/goods/042/buy` would lock another key than `/goods/42/buy` for
    // the same goods, and the two purchases would race.
    let purchases = LockLayer::new(shop.locks.clone(), key::path_segment::<u64>(1, "goods_{}"))
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(3));
    Router::new()
        .route("/goods/{id}/buy", post(buy))
        .route_layer(purchases)
        .route("/goods/{id}/restock", post(restock))
        .route("/goods/{id}", get(show))
        .with_state(shop)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (locks, backend) = match std::env::var("REDIS_URL") {
        Ok(url) => (LockManager::connect(&url).await?, format!("Redis at {url}")),
        Err(_) => (
            LockManager::builder().in_memory().build().await?,
            "the in-memory backend (set REDIS_URL for Redis)".to_owned(),
        ),
    };
    let shop = Shop {
        locks,
        stock: Arc::new(Mutex::new(HashMap::from([(42, 100)]))),
    };
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let base = format!("http://{}", listener.local_addr()?);
    println!("axum shop on {base}, locking with {backend}. Try:");
    println!("  curl -s {base}/goods/42");
    println!("  curl -s -X POST {base}/goods/42/buy");
    println!("  curl -s -X POST {base}/goods/42/restock");
    println!("  # 10 concurrent purchases run one at a time, none is lost: 100 - 10 = 90 left");
    println!("  for i in $(seq 10); do curl -s -X POST {base}/goods/42/buy & done; wait; echo");
    println!("  # spelled ten ways, still one goods and one lock: 90 - 10 = 80 left");
    println!("  for id in 42 042 +42 0042 %34%32 4%32 %2B42 +042 00042 %30%34%32; do curl -s -X POST {base}/goods/$id/buy & done; wait; echo");
    println!("  curl -s {base}/goods/42");
    println!("  # 40 at once, 100 ms each: about 30 fit in the 3 s wait, the rest get 423 Locked");
    println!("  for i in $(seq 40); do curl -s -o /dev/null -w '%{{http_code}} ' -X POST {base}/goods/42/buy & done; wait; echo");
    let locks = shop.locks.clone();
    axum::serve(listener, app(shop))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // The requests in flight have finished: free whatever is still held (a guard a
    // handler dropped just now) at once, rather than at its ttl.
    locks.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
