//! axum 0.8 handlers: extractor patterns as placeholders, `manager = state.locks`,
//! and the annotated functions still satisfy `Handler` (their futures are `Send`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use redlock::{distributed_lock, LockError, LockManager};

#[derive(Clone)]
pub struct AppState {
    pub locks: LockManager,
    pub shop: Arc<str>,
}

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (StatusCode::CONFLICT, self.0.to_string()).into_response()
    }
}

#[distributed_lock(key = "goods_<id>", manager = state.locks, ttl = "10s", wait = "500ms")]
async fn buy(State(state): State<AppState>, Path(id): Path<u64>) -> Result<String, AppError> {
    Ok(format!("{} bought {id}", state.shop))
}

#[distributed_lock(key = "cart_<user>_<item>", manager = state.locks, guard = lock)]
async fn add_to_cart(
    State(state): State<AppState>,
    Path((user, item)): Path<(u64, u64)>,
    Json(qty): Json<u32>,
) -> Result<Json<u64>, AppError> {
    let _ = &state.shop;
    Ok(Json(lock.fencing_token() + u64::from(qty)))
}

// The global manager, a plain extractor, an `impl IntoResponse` success type.
#[distributed_lock(key = "ping_<n>")]
async fn ping(Path(n): Path<u32>) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::OK, format!("pong {n}")))
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/x/{id}", post(buy))
        .route("/cart/{user}/{item}", post(add_to_cart))
        .route("/ping/{n}", get(ping))
        .with_state(state)
}

fn main() {
    let _ = app;
}
