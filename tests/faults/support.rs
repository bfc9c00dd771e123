//! What the scenarios share: the holder process, run sizes, keys, timing helpers.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock::{LockManager, LockManagerBuilder};
use redlock_faults::clock::now_ns;
use redlock_faults::history::Section;
use redlock_faults::protocol::{Args, Event, Mode};
use redlock_faults::resource::{Begin, Resource};
use tokio::sync::mpsc;

/// Skips the test (with a message) on a machine without `redis-server`.
macro_rules! require_redis {
    () => {
        if !redlock_testkit::redis_available() {
            eprintln!("redis-server not found: skipping");
            return;
        }
    };
}
pub(crate) use require_redis;

/// Whether the long soak mode is on (`REDLOCK_SOAK=1`).
pub fn soak() -> bool {
    std::env::var("REDLOCK_SOAK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `ci` rounds by default, `soak` rounds with `REDLOCK_SOAK=1`.
pub fn rounds(ci: usize, soak_rounds: usize) -> usize {
    if soak() {
        soak_rounds
    } else {
        ci
    }
}

/// The scenarios that run several redis-server processes and measure timing are run one
/// at a time (2 cores; failovers and lease deadlines are timing-sensitive).
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A key no other test uses, without braces (the holder wraps it in `{...}`).
pub fn unique(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A manager on one server with the given builder tweaks.
pub async fn single(url: &str) -> LockManager {
    single_with(url, |b| b).await
}

/// A manager on one server, the builder adjusted by `f`.
pub async fn single_with(
    url: &str,
    f: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) -> LockManager {
    f(LockManager::builder().single(url))
        .build()
        .await
        .expect("manager builds")
}

/// An `Instant` as a [`now_ns`] reading (both read `CLOCK_MONOTONIC`).
pub fn instant_ns(t: std::time::Instant) -> u64 {
    let (now_i, now_n) = (std::time::Instant::now(), now_ns());
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match t.checked_duration_since(now_i) {
        Some(ahead) => now_n.saturating_add(nanos(ahead)),
        None => now_n.saturating_sub(nanos(now_i - t)),
    }
}

/// A random duration in `lo..hi`.
pub fn rand_between(lo: Duration, hi: Duration) -> Duration {
    let span = u64::try_from((hi.saturating_sub(lo)).as_micros())
        .unwrap_or(0)
        .max(1);
    lo + Duration::from_micros(fastrand::u64(0..span))
}

/// The default holder settings for `key`: guard mode, one quick step, holds 60 s.
pub fn holder_args(lock_url: &str, resource_url: &str, resource: &str, key: &str) -> Args {
    Args {
        lock_url: lock_url.to_owned(),
        resource_url: resource_url.to_owned(),
        resource: resource.to_owned(),
        key: key.to_owned(),
        ttl_ms: 1000,
        mode: Mode::Guard,
        steps: 1,
        step_ms: 10,
        hold_ms: 60_000,
    }
}

/// A `fault-holder` process, its report lines collected as they arrive.
///
/// Dropping it continues (SIGCONT) and kills (SIGKILL) the process by its pid, and reaps it.
pub struct Holder {
    child: Option<Child>,
    pid: u32,
    rx: mpsc::UnboundedReceiver<(u64, Event)>,
    /// Every event received so far, with the time it was read.
    pub events: Vec<(u64, Event)>,
}

impl Holder {
    /// Starts the holder binary with `args`.
    pub fn spawn(args: &Args) -> Holder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-holder"))
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fault-holder");
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::unbounded_channel();
        // Ends at EOF, i.e. when the process exits or is killed.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(event) = Event::parse(&line) {
                    if tx.send((now_ns(), event)).is_err() {
                        return;
                    }
                }
            }
        });
        Holder {
            child: Some(child),
            pid,
            rx,
            events: Vec::new(),
        }
    }

    /// Waits (at most `timeout`) for the next event named `name`, keeping every event read.
    ///
    /// # Panics
    /// When it does not come in time or the process ended first.
    pub async fn expect(&mut self, name: &str, timeout: Duration) -> Event {
        match self.next_named(name, timeout).await {
            Some(e) => e,
            None => panic!(
                "holder {}: no @{name} within {timeout:?}; events so far: {:?}",
                self.pid,
                self.events
                    .iter()
                    .map(|(_, e)| e.line())
                    .collect::<Vec<_>>()
            ),
        }
    }

    /// Like [`expect`](Self::expect) but `None` instead of a panic.
    pub async fn next_named(&mut self, name: &str, timeout: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (at, event) = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .ok()??;
            self.events.push((at, event.clone()));
            if event.name == name {
                return Some(event);
            }
        }
    }

    /// Reads every event until the process closes its stdout (exits), at most `timeout`.
    pub async fn drain(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while let Ok(Some((at, event))) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.events.push((at, event));
        }
    }

    /// Events named `name` received so far.
    pub fn all(&self, name: &str) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|(_, e)| e.name == name)
            .map(|(_, e)| e)
            .collect()
    }

    /// SIGKILL now, then reap. Returns the time the signal was sent.
    pub fn kill9(&mut self) -> u64 {
        let at = now_ns();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        at
    }

    /// SIGSTOP; returns the time the signal was sent.
    pub fn pause(&mut self) -> u64 {
        let at = now_ns();
        self.signal(libc::SIGSTOP);
        at
    }

    /// SIGCONT; returns the time the signal was sent.
    pub fn resume(&mut self) -> u64 {
        let at = now_ns();
        self.signal(libc::SIGCONT);
        at
    }

    /// Waits for the process to exit by itself (bounded); true when it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        // Bounded: at most timeout / 10 ms rounds.
        while std::time::Instant::now() < deadline {
            match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(_))) | None => {
                    self.child = None;
                    return true;
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        false
    }

    fn signal(&mut self, sig: libc::c_int) {
        // Only an unreaped child of ours: its pid cannot have been reused.
        if let Some(Ok(None)) = self.child.as_mut().map(Child::try_wait) {
            if let Ok(pid) = libc::pid_t::try_from(self.pid) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid, sig);
                }
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Holder {
    /// The holder's critical section as the checker sees it, from its report lines: its
    /// begins and commits, and whether a commit was in flight when it stopped reporting.
    pub fn section(&self, token: u64, enter: u64, exit: u64, lost: bool) -> Section {
        let mut s = Section::new(format!("holder-{}", self.pid), token, enter, exit);
        s.lost = lost;
        for e in self.all("begin") {
            if let (Some(at), Some(ok)) = (e.u64("at"), e.bool("ok")) {
                s.begins.push((at, ok));
            }
        }
        for e in self.all("commit") {
            if let (Some(at), Some(ok)) = (e.u64("at"), e.bool("ok")) {
                s.commits.push((at, ok));
            }
        }
        s.commit_unknown = self.all("commit-sent").len() > self.all("commit").len();
        s
    }
}

/// One in-process critical section on `resource`: begin, optional work, commit; recorded
/// as `client`'s section from `enter` (the grant) to now.
pub async fn in_process_section(
    resource: &Resource,
    client: &str,
    token: u64,
    enter: u64,
    work: Duration,
) -> Section {
    let mut s = Section::new(client, token, enter, 0);
    let at = now_ns();
    match resource.begin(token).await.expect("resource begin") {
        Begin::Granted(v) => {
            s.begins.push((at, true));
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            let ok = resource
                .commit(token, v + 1)
                .await
                .expect("resource commit");
            s.commits.push((now_ns(), ok));
        }
        Begin::Rejected(_) => s.begins.push((at, false)),
    }
    s.exit = now_ns();
    s
}
