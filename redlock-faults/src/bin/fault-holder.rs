//! A process that takes a lock and works under it, for the fault tests to kill (-9) and
//! pause (SIGSTOP). It reports every step on stdout (see `redlock_faults::protocol`).
//!
//! ```text
//! fault-holder --lock URL --resource-url URL --resource NAME --key K --ttl-ms N
//!              --mode guard|macro|leader --steps N --step-ms MS --hold-ms MS
//! ```
//!
//! Each step is one critical-section access of the fenced resource: `begin(token)`, a sleep
//! of `step-ms` (where the tests pause it), then `commit(token, value + 1)`. In `guard` mode
//! the steps do not look at `is_held()` before committing, as if the pause struck right
//! after such a check: only fencing can catch the late write. In `macro` mode the steps run
//! in a `#[distributed_lock(on_lost = "abort")]` function, which is dropped at its next
//! await once the lock is lost. In `leader` mode the process campaigns for the leadership
//! of `K` (`leader_with`), works as in `guard` mode under its term, then resigns.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use redlock::{distributed_lock, LockError, LockManager, LockOptions};
use redlock_faults::clock::now_ns;
use redlock_faults::protocol::{Args, Event, Mode};
use redlock_faults::resource::{Begin, Resource};

/// Prints one report line and flushes it, so a test sees it before any kill.
fn emit(event: Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", event.line());
    let _ = out.flush();
}

/// Why the holder's work stopped.
#[derive(Debug)]
enum HolderError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl From<LockError> for HolderError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

impl From<redis::RedisError> for HolderError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

impl std::fmt::Display for HolderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lock(e) => write!(f, "lock: {e}"),
            Self::Redis(e) => write!(f, "resource: {e}"),
        }
    }
}

impl HolderError {
    fn kind(&self) -> String {
        match self {
            Self::Lock(e) => format!("error:{}", e.kind()),
            Self::Redis(_) => "error:resource".to_owned(),
        }
    }
}

/// The critical-section steps, with `token`; `held` tells whether the lock (or
/// leadership) is still held, reported before each step.
async fn steps(
    args: &Args,
    resource: &Resource,
    token: u64,
    held: impl Fn() -> bool,
) -> Result<(), HolderError> {
    for _ in 0..args.steps {
        emit(Event::new("held").with("held", held()).with("at", now_ns()));
        let at = now_ns();
        let begun = resource.begin(token).await?;
        let value = match begun {
            Begin::Granted(v) => v,
            Begin::Rejected(_) => {
                emit(
                    Event::new("begin")
                        .with("token", token)
                        .with("ok", false)
                        .with("at", at),
                );
                continue;
            }
        };
        emit(
            Event::new("begin")
                .with("token", token)
                .with("ok", true)
                .with("value", value)
                .with("at", at),
        );
        tokio::time::sleep(Duration::from_millis(args.step_ms)).await;
        emit(
            Event::new("commit-sent")
                .with("token", token)
                .with("at", now_ns()),
        );
        let ok = resource.commit(token, value + 1).await?;
        emit(
            Event::new("commit")
                .with("token", token)
                .with("ok", ok)
                .with("at", now_ns()),
        );
    }
    tokio::time::sleep(Duration::from_millis(args.hold_ms)).await;
    Ok(())
}

/// The macro mode's critical section: the lock is `lock:{<key>}`, ttl 1 s.
#[distributed_lock(key = "<key>", ttl = "1s", wait = "10s", manager = locks, guard = g, on_lost = "abort")]
async fn annotated(
    locks: &LockManager,
    key: &str,
    args: &Args,
    resource: &Resource,
) -> Result<(), HolderError> {
    emit(
        Event::new("acquired")
            .with("token", g.fencing_token())
            .with("at", now_ns()),
    );
    steps(args, resource, g.fencing_token(), || g.is_held()).await
}

/// The leader mode: campaign, work under the term, resign.
async fn lead(locks: &LockManager, args: &Args, resource: &Resource) -> Result<(), HolderError> {
    emit(Event::new("campaign").with("at", now_ns()));
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(args.ttl_ms))
        .wait(Duration::from_secs(10));
    let leadership = Arc::new(locks.leader_with(&args.key, opts).await?);
    let term = leadership.fencing_token();
    emit(
        Event::new("acquired")
            .with("token", term)
            .with("at", now_ns()),
    );
    let watcher = {
        let leadership = leadership.clone();
        tokio::spawn(async move {
            leadership.lost().await;
            emit(Event::new("lost").with("at", now_ns()));
        })
    };
    let worked = steps(args, resource, term, || leadership.is_held()).await;
    watcher.abort();
    let _ = watcher.await;
    let leadership = Arc::try_unwrap(leadership).map_err(|_| {
        HolderError::Lock(LockError::NotHeld {
            key: args.key.clone(),
        })
    })?;
    let resigned = leadership.resign().await;
    worked?;
    resigned.map_err(HolderError::from)
}

async fn run(args: Args) -> Result<(), HolderError> {
    let locks = LockManager::builder()
        .single(&args.lock_url)
        .build()
        .await?;
    let resource = Resource::open(&args.resource_url, &args.resource).await?;
    emit(Event::new("ready").with("pid", std::process::id()));
    match args.mode {
        Mode::Macro => annotated(&locks, &args.key, &args, &resource).await,
        Mode::Leader => lead(&locks, &args, &resource).await,
        Mode::Guard => {
            let opts = LockOptions::new()
                .ttl(Duration::from_millis(args.ttl_ms))
                .wait(Duration::from_secs(10));
            let guard = Arc::new(locks.lock_with(&format!("{{{}}}", args.key), opts).await?);
            let token = guard.fencing_token();
            emit(
                Event::new("acquired")
                    .with("token", token)
                    .with("at", now_ns()),
            );
            let watcher = {
                let guard = guard.clone();
                tokio::spawn(async move {
                    guard.lost().await;
                    emit(Event::new("lost").with("at", now_ns()));
                })
            };
            let worked = steps(&args, &resource, token, || guard.is_held()).await;
            watcher.abort();
            // The aborted task drops its clone of the guard only once it is awaited.
            let _ = watcher.await;
            let guard = Arc::try_unwrap(guard).map_err(|_| {
                HolderError::Lock(LockError::NotHeld {
                    key: args.key.clone(),
                })
            })?;
            let released = guard.release().await;
            worked?;
            released.map_err(HolderError::from)
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fault-holder: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match run(args).await {
        Ok(()) => "ok".to_owned(),
        Err(HolderError::Lock(LockError::Lost { .. })) => "lost".to_owned(),
        Err(e) => {
            eprintln!("fault-holder: {e}");
            e.kind()
        }
    };
    emit(
        Event::new("done")
            .with("result", result)
            .with("at", now_ns()),
    );
    ExitCode::SUCCESS
}
