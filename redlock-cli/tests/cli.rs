//! The `redlock` binary against real redis-server processes: each subcommand, its exit
//! codes, `--json`, and a forced release seen by the holder (`lost()`) and by a waiter
//! (woken at once).

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use redlock::{LockError, LockGuard, LockManager, LockOptions};
use redlock_testkit::{RedisCluster, RedisServer};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// The binary with `--url url`, `$USER` set, no `$REDIS_URL`.
fn redlock(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
    cmd.arg("--url").arg(url);
    environment(cmd)
}

fn environment(mut cmd: Command) -> Command {
    cmd.env("USER", "night-operator")
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The binary with `flag` (`--cluster`, `--redlock`, `--sentinel NAME`) and a `--url`
/// for each of `urls`.
fn redlock_on(flag: &[&str], urls: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
    cmd.args(flag);
    for url in urls {
        cmd.arg("--url").arg(url);
    }
    environment(cmd)
}

/// Runs `release` (a forced release through the binary) while `waiting` waits with a
/// 30 s wait: the waiter is granted well before the holders' 30 s ttl, with a later
/// fencing token than theirs, and every one of `holders` sees `lost()` at its next
/// renewal.
async fn release_wakes_the_waiter(
    release: &mut Command,
    waiting: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
    holders: &[&LockGuard],
) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = release.output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was woken well before the 30 s ttl")
        .unwrap()
        .unwrap();
    for holder in holders {
        assert!(next.fencing_token() > holder.fencing_token());
        tokio::time::timeout(Duration::from_secs(30), holder.lost())
            .await
            .expect("a holder saw lost() at its next renewal");
    }
}

/// `cmd --json list`: exit 0, and what it printed.
async fn json_list(cmd: &mut Command) -> Value {
    let out = cmd.args(["--json", "list"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn run(url: &str, args: &[&str]) -> Output {
    let out = tokio::time::timeout(Duration::from_secs(30), redlock(url).args(args).output())
        .await
        .expect("the command finished")
        .expect("the command ran");
    eprintln!(
        "redlock {args:?} -> {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn manager(server: &RedisServer) -> LockManager {
    LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prints_a_table_and_json() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let empty = run(&url, &["list"]).await;
    assert_eq!(empty.status.code(), Some(0));
    assert!(stdout(&empty).contains("(no locks held)"));

    let a = locks.lock("buy_{42}").await.unwrap();
    let b = locks.lock("sell_{7}").await.unwrap();
    let readers = [
        locks.read("report_{1}").await.unwrap(),
        locks.read("report_{1}").await.unwrap(),
    ];
    let out = run(&url, &["list"]).await;
    assert_eq!(out.status.code(), Some(0));
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three locks:\n{table}");
    assert!(lines[0].starts_with("KEY") && lines[0].contains("HELD FOR"));
    let me = format!(":{}", std::process::id());
    assert!(lines[1].starts_with("lock:buy_{42}") && lines[1].contains(&me));
    assert!(lines[1].contains(&format!(" {} ", a.fencing_token())));
    assert!(lines[2].starts_with("lock:report_{1}") && lines[2].contains("read"));
    assert!(lines[3].starts_with("lock:sell_{7}"));

    // --json before or after the subcommand; a pattern.
    for args in [
        &["--json", "list", "buy_*"][..],
        &["list", "buy_*", "--json"],
    ] {
        let out = run(&url, args).await;
        assert_eq!(out.status.code(), Some(0));
        let all: Value = serde_json::from_slice(&out.stdout).unwrap();
        let all = all.as_array().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0]["key"], "lock:buy_{42}");
        assert_eq!(all[0]["kind"], "exclusive");
        assert_eq!(all[0]["fencing_token"], a.fencing_token());
        assert_eq!(all[0]["pid"], std::process::id());
        assert!(all[0]["ttl_ms"].as_u64().unwrap() > 20_000);
    }
    let out = run(&url, &["--json", "list", "report_*"]).await;
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all[0]["holders"], 2);
    drop((a, b, readers));
}

/// Issue 24, item 10: a key with a newline forged a table row and one with an ESC reached
/// the operator's terminal. Every text output (list, inspect, watch, release and its
/// log line on stderr) shows them escaped; `--json` keeps the key exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_escapes_control_characters() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let key = "row\nlock:forged_{1}\u{1b}[2J\u{202e}";
    let full = format!("lock:{key}");
    let escaped = "lock:row\\nlock:forged_{1}\\u{1b}[2J\\u{202e}";
    let g = locks.lock(key).await.unwrap();

    let raw = |out: &Output| {
        let all = [&out.stdout[..], &out.stderr[..]].concat();
        assert!(
            !all.contains(&0x1b) && !String::from_utf8_lossy(&all).contains('\u{202e}'),
            "a control character reached the terminal: {all:?}"
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = raw(&run(&url, &["list"]).await);
    assert_eq!(table.lines().count(), 2, "a header and one lock:\n{table}");
    assert!(
        table.lines().nth(1).unwrap().starts_with(escaped),
        "{table}"
    );
    let json: Value = serde_json::from_slice(&run(&url, &["--json", "list"]).await.stdout).unwrap();
    assert_eq!(json[0]["key"], full.as_str());

    let inspected = raw(&run(&url, &["inspect", &full]).await);
    assert!(
        inspected.lines().next().unwrap().ends_with(escaped),
        "{inspected}"
    );
    let watched = raw(&run(&url, &["watch", &full, "--for", "300ms"]).await);
    // The note on what it cannot see, then the lock.
    assert_eq!(watched.lines().count(), 2, "{watched}");
    assert!(
        watched.lines().nth(1).unwrap().contains(escaped),
        "{watched}"
    );

    let released = run(&url, &["release", "--yes", &full]).await;
    assert_eq!(released.status.code(), Some(0), "{released:?}");
    let said = raw(&released);
    assert_eq!(said.trim(), format!("released {escaped}"));
    assert!(String::from_utf8_lossy(&released.stderr).contains(escaped));
    assert!(tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_owner_or_exits_1() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let free = run(&url, &["inspect", "lock:buy_{42}"]).await;
    assert_eq!(free.status.code(), Some(1));
    let free = run(&url, &["inspect", "lock:buy_{42}", "--json"]).await;
    assert_eq!(free.status.code(), Some(1));
    assert_eq!(stdout(&free).trim(), "null");

    let g = locks.lock("buy_{42}").await.unwrap();
    let out = run(&url, &["inspect", "lock:buy_{42}"]).await;
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains(&format!(":{}", std::process::id())), "{text}");
    assert!(text.contains(&format!("fencing token  {}", g.fencing_token())));
    // Issue 24, item 12: a readable time, not milliseconds since the epoch.
    let acquired = text
        .lines()
        .find(|l| l.starts_with("acquired at"))
        .expect("an acquired-at line");
    assert!(
        acquired.contains(" UTC (server clock)") && acquired.contains("-"),
        "{acquired}"
    );
    // A key without the prefix gets it.
    let out = run(&url, &["--json", "inspect", "buy_{42}"]).await;
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["key"], "lock:buy_{42}");
    assert!(info["acquired_at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    g.release().await.unwrap();
}

/// Issue 16: a forced release deletes the lock whoever holds it, wakes a waiter at once
/// (not at the holder's ttl), and the holder sees `lost()` at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_wakes_a_waiter_and_the_holder_sees_lost() {
    let server = RedisServer::start();
    let url = server.url();
    let (holder, waiter) = (manager(&server).await, manager(&server).await);
    let ttl = Duration::from_secs(3);
    let guard = holder
        .lock_with("stuck_{1}", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let first = guard.fencing_token();
    let waiting = tokio::spawn(async move {
        let g = waiter
            .lock_with(
                "stuck_{1}",
                LockOptions::new().wait(Duration::from_secs(30)),
            )
            .await;
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter waits");

    // Without --yes and without a terminal to ask on: a usage error, nothing released.
    let refused = run(&url, &["release", "lock:stuck_{1}"]).await;
    assert_eq!(refused.status.code(), Some(2));
    assert!(guard.is_held() && !waiting.is_finished());

    let released_at = Instant::now();
    let out = run(&url, &["release", "lock:stuck_{1}", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("force-released lock:stuck_{1}")
            && log.contains("night-operator")
            && log.contains(&format!(":{}", std::process::id())),
        "who did it, and whose lock it was: {log}"
    );
    let (woken_at, next) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was woken")
        .unwrap();
    let next = next.expect("the waiter got the lock");
    assert!(next.fencing_token() > first);
    let woke = woken_at.duration_since(released_at);
    assert!(
        woke < ttl,
        "woken by the release's notification, not the holder's ttl: {woke:?}"
    );
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the holder saw lost() at its next renewal");
    assert!(!guard.is_held());

    // Nothing left to release: exit 1.
    next.release().await.unwrap();
    let again = run(&url, &["release", "lock:stuck_{1}", "--yes"]).await;
    assert_eq!(again.status.code(), Some(1));
}

/// Issue 24, item 11: `release` shows holder A and asks; B takes the key during the
/// prompt; the confirmed release deletes nothing (B keeps its lock), logs no release and
/// says who holds it now. The prompt runs on a terminal: `script` (util-linux) gives the
/// command a pty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_deletes_only_the_holder_it_showed() {
    let server = RedisServer::start();
    let url = server.url();
    let (a, b) = (manager(&server).await, manager(&server).await);
    let first = a.lock("job_{1}").await.unwrap();
    let command = format!(
        "'{}' --url '{url}' release 'lock:job_{{1}}'",
        env!("CARGO_BIN_EXE_redlock")
    );
    let mut child = Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("USER", "night-operator")
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script(1) runs the command on a terminal");
    let mut terminal = child.stdout.take().unwrap();
    let mut shown = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&shown).contains("[y/N]") {
            let n = terminal.read(&mut buf).await.unwrap();
            assert!(n > 0, "ended unasked: {}", String::from_utf8_lossy(&shown));
            shown.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the command asked");
    let question = String::from_utf8_lossy(&shown).into_owned();
    assert!(
        question.contains(&format!("fencing token {}", first.fencing_token())),
        "A shown: {question}"
    );

    first.release().await.unwrap();
    let second = b.lock("job_{1}").await.unwrap();
    let mut answer = child.stdin.take().unwrap();
    answer.write_all(b"y\n").await.unwrap();
    let mut told = Vec::new();
    let status = tokio::time::timeout(Duration::from_secs(30), async {
        terminal.read_to_end(&mut told).await.unwrap();
        child.wait().await.unwrap()
    })
    .await
    .expect("the command finished");
    drop(answer);
    let told = String::from_utf8_lossy(&told);
    assert_eq!(status.code(), Some(1), "not released: {told}");
    assert!(
        told.contains("not released")
            && told.contains(&format!("fencing token {}", second.fencing_token())),
        "says who holds it now: {told}"
    );
    assert!(
        !told.contains("force-released"),
        "no release logged: {told}"
    );
    // B still holds it on the server.
    second.extend(Duration::from_secs(30)).await.unwrap();

    // Shown and confirmed at once, B's lock is released.
    let out = run(&url, &["release", "--yes", "lock:job_{1}"]).await;
    assert_eq!(out.status.code(), Some(0));
    tokio::time::timeout(Duration::from_secs(30), second.lost())
        .await
        .expect("B saw lost() at its next renewal");
}

/// Issue 24, item 12: a lock released with `hold_at_least` before its minimum hold showed
/// as held by the job that had finished. `list`, `inspect` and `watch` show it as kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_is_listed_inspected_and_watched_as_kept() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let mut watch = Watch::start(&url, "lock:nightly_{1}");
    let job = locks
        .lock_with(
            "nightly_{1}",
            LockOptions::new().hold_at_least(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let e = watch.next_event().await;
    assert_eq!(
        (e["event"].as_str(), e["lock"]["kept"].as_u64()),
        (Some("granted"), Some(0))
    );
    job.release().await.unwrap();
    let e = watch.next_event().await;
    assert_eq!(
        (e["event"].as_str(), e["lock"]["kept"].as_u64()),
        (Some("kept"), Some(1)),
        "{e}"
    );
    watch.child.kill().await.unwrap();

    let listed = run(&url, &["list"]).await;
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.contains("1 (kept)"), "{table}");
    let inspected = run(&url, &["inspect", "lock:nightly_{1}"]).await;
    let text = String::from_utf8_lossy(&inspected.stdout);
    assert!(
        text.contains("holders        1 (kept)") && text.contains("no job runs"),
        "{text}"
    );
    let json = run(&url, &["--json", "inspect", "lock:nightly_{1}"]).await;
    let info: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(info["kept"], 1);
}

/// Issue 26: a fair lock is listed and inspected with its kind and its queue's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_is_shown_with_its_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let holder = locks.fair("report_{1}").await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let locks = locks.clone();
        waiters.push(tokio::spawn(async move {
            let wait = LockOptions::new().wait(Duration::from_secs(30));
            locks.fair_with("report_{1}", wait).await
        }));
    }
    let mut queued = 0;
    for _ in 0..500 {
        queued = locks
            .inspect("report_{1}")
            .await
            .unwrap()
            .map_or(0, |i| i.queued);
        if queued == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queued, 2);
    let listed = run(&url, &["list"]).await;
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        table.contains("fair") && table.contains("1 +2 queued"),
        "{table}"
    );
    let json = run(&url, &["--json", "inspect", "lock:report_{1}"]).await;
    let info: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        (info["kind"].as_str(), info["queued"].as_u64()),
        (Some("fair"), Some(2))
    );
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().unwrap().release().await.unwrap();
    }
}

/// `redlock --json watch KEY --for 20s`, read one event (a JSON line) at a time.
struct Watch {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Watch {
    fn start(url: &str, key: &str) -> Self {
        Self::start_with(url, key, &[])
    }

    /// With `args` added (`--interval 10s`).
    fn start_with(url: &str, key: &str, args: &[&str]) -> Self {
        let mut child = redlock(url)
            .args(["--json", "watch", key, "--for", "20s"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Watch { child, lines }
    }

    /// The next event, within 5 s.
    async fn next_event(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .expect("an event within 5 s")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    }

    /// The next event's name and the lock's holder count.
    async fn next_holders(&mut self) -> (String, u64) {
        let e = self.next_event().await;
        (
            e["event"].as_str().unwrap().to_owned(),
            e["lock"]["holders"].as_u64().unwrap(),
        )
    }
}

/// `watch` prints a line per grant, release and expiry, and stops after `--for`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_grants_releases_and_expiries() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let g = locks.lock("job_{1}").await.unwrap();
    let mut watch = Watch::start(&url, "lock:job_{1}");
    let e = watch.next_event().await;
    assert_eq!(e["event"], "granted");
    assert_eq!(e["lock"]["fencing_token"], g.fencing_token());
    g.release().await.unwrap();
    assert_eq!(watch.next_event().await["event"], "released");

    let short = locks
        .lock_with(
            "job_{1}",
            LockOptions::new()
                .ttl(Duration::from_millis(400))
                .watchdog(false),
        )
        .await
        .unwrap();
    let e = watch.next_event().await;
    assert_eq!(e["event"], "granted");
    assert_eq!(e["lock"]["fencing_token"], short.fencing_token());
    assert_eq!(watch.next_event().await["event"], "expired");
    drop(short);
    watch.child.kill().await.unwrap();

    // --for bounds it.
    let started = Instant::now();
    let out = run(&url, &["watch", "lock:job_{1}", "--for", "300ms"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(stdout(&out).contains("not held"));
}

/// Issue 24, item 12: `watch` silently missed 5 of 5 short holds with keyspace events
/// off. Its first line says what it cannot see and how to see it (on stderr beside
/// JSON), on one server and where it can only poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_says_first_what_it_cannot_see() {
    let server = RedisServer::start();
    let url = server.url();
    let first_line = |out: &Output| stdout(out).lines().next().unwrap_or_default().to_owned();
    let single = run(&url, &["watch", "lock:short_{1}", "--for", "200ms"]).await;
    assert_eq!(single.status.code(), Some(0));
    let line = first_line(&single);
    assert!(
        line.contains("100ms apart") && line.contains("notify-keyspace-events Kgx"),
        "{line}"
    );
    let json = run(
        &url,
        &["--json", "watch", "lock:short_{1}", "--for", "200ms"],
    )
    .await;
    assert!(stdout(&json).trim().is_empty(), "{json:?}");
    assert!(String::from_utf8_lossy(&json.stderr).contains("notify-keyspace-events"));

    let polled = tokio::time::timeout(
        Duration::from_secs(30),
        redlock_on(&["--redlock"], std::slice::from_ref(&url))
            .args(["watch", "lock:short_{1}", "--for", "1500ms"])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let line = first_line(&polled);
    assert!(
        line.starts_with("looking every 1.0s (redlock: no notifications)"),
        "{line}"
    );
}

/// `watch` on a read lock: another reader joining is a grant, a reader leaving a
/// release (the lock still held by the others), the last one leaving a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_readers_coming_and_going() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let r1 = locks.read("report_{9}").await.unwrap();
    let mut watch = Watch::start(&url, "lock:report_{9}");
    assert_eq!(watch.next_holders().await, ("granted".to_owned(), 1));
    let r2 = locks.read("report_{9}").await.unwrap();
    assert_eq!(watch.next_holders().await, ("granted".to_owned(), 2));
    r2.release().await.unwrap();
    assert_eq!(watch.next_holders().await, ("released".to_owned(), 1));
    r1.release().await.unwrap();
    assert_eq!(watch.next_holders().await.0, "released");
    watch.child.kill().await.unwrap();
}

/// Issue 24, item 12: a permit's holders showed as one line, the latest grant's. `watch`
/// prints a line per holder: each grant, keep and release names the holder it is about,
/// and only a grant that is the latest carries the owner; `inspect` lists each holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_one_line_per_permit_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = manager(&server).await;
    let mut watch = Watch::start(&url, "lock:printer_{3}");
    let holder = |e: &Value| e["holder"]["name"].as_str().expect("a holder").to_owned();

    let first = locks
        .permit_with(
            "printer_{3}",
            2,
            LockOptions::new().hold_at_least(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let e = watch.next_event().await;
    assert_eq!(e["event"], "granted", "{e}");
    assert_eq!(e["holder"]["latest"], true, "{e}");
    assert_eq!(e["lock"]["pid"], std::process::id(), "{e}");
    let a = holder(&e);
    let second = locks.permit("printer_{3}", 2).await.unwrap();
    let e = watch.next_event().await;
    assert_eq!(
        (e["event"].as_str(), e["lock"]["holders"].as_u64()),
        (Some("granted"), Some(2)),
        "{e}"
    );
    let b = holder(&e);
    assert_ne!(a, b);

    let inspected = run(&url, &["inspect", "lock:printer_{3}"]).await;
    let text = String::from_utf8_lossy(&inspected.stdout);
    for name in [&a, &b] {
        assert!(
            text.contains(&format!("holder         {name} (ttl left")),
            "{text}"
        );
    }

    first.release().await.unwrap();
    let e = watch.next_event().await;
    assert_eq!(
        (e["event"].as_str(), holder(&e)),
        (Some("kept"), a.clone()),
        "{e}"
    );
    second.release().await.unwrap();
    let e = watch.next_event().await;
    assert_eq!(
        (e["event"].as_str(), holder(&e)),
        (Some("released"), b.clone()),
        "{e}"
    );
    assert_eq!(e["lock"]["holders"], 1, "the lock as it is now: {e}");
    watch.child.kill().await.unwrap();

    // The text lines: one per holder, each naming it.
    let _third = locks.permit("printer_{3}", 2).await.unwrap();
    let out = run(&url, &["watch", "lock:printer_{3}", "--for", "300ms"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let granted: Vec<&str> = text.lines().filter(|l| l.starts_with("granted")).collect();
    assert_eq!(granted.len(), 2, "{text}");
    assert!(
        granted
            .iter()
            .any(|l| l.contains(&format!("holder {a} (ttl "))),
        "{text}"
    );
    assert!(
        granted
            .iter()
            .all(|l| l.ends_with("): 2 holders now, 1 kept")),
        "each line says who holds it now: {text}"
    );
    assert!(
        text.lines().all(|l| l == l.trim_end()),
        "no trailing blanks: {text:?}"
    );
}

#[tokio::test]
async fn bad_input_exits_2_and_unreachable_redis_exits_3() {
    let server = RedisServer::start();
    let url = server.url();
    for args in [
        &["--url", "redis://127.0.0.1:1", "list"][..],
        &["frobnicate"],
        &["inspect"],
        &["inspect", ""],
        &["watch", "k", "--interval", "1ms"],
        &["watch", "k", "--for", "soon"],
    ] {
        assert_eq!(run(&url, args).await.status.code(), Some(2), "{args:?}");
    }
    let port = redlock_testkit::free_port();
    let started = Instant::now();
    let out = run(&format!("redis://127.0.0.1:{port}"), &["list"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("redlock: "));
}

/// Issue 24, item 5: a failed connect named no node, and the CLI printed the cause twice
/// ("Connection refused (os error 111): Connection refused (os error 111)"). Every
/// backend's connect error names the node(s) it tried (never the password) and prints
/// each cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_name_the_node_and_each_cause_once() {
    let ports: Vec<u16> = (0..3).map(|_| redlock_testkit::free_port()).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://user:hunter2@127.0.0.1:{p}"))
        .collect();
    let first = format!("127.0.0.1:{}", ports[0]);
    let cases: Vec<(Vec<&str>, Vec<String>, String)> = vec![
        (
            vec![],
            urls[..1].to_vec(),
            format!("during connect on {first}: "),
        ),
        (
            vec!["--cluster"],
            urls[..2].to_vec(),
            format!("during connect on {first}, 127.0.0.1:{}: ", ports[1]),
        ),
        (
            vec!["--redlock"],
            urls.clone(),
            "during connect on 127.0.0.1:".to_owned(),
        ),
        (
            vec!["--sentinel", "mymaster"],
            urls[..1].to_vec(),
            format!("during sentinel on {first}: "),
        ),
    ];
    for (flag, urls, names) in cases {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            redlock_on(&flag, &urls).arg("list").output(),
        )
        .await
        .expect("the command finished")
        .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(3), "{flag:?}: {said}");
        assert!(said.contains(&names), "{flag:?}: no {names:?} in {said}");
        assert_eq!(
            said.matches("Connection refused").count(),
            1,
            "{flag:?}: the cause not exactly once: {said}"
        );
        assert!(!said.contains("hunter2"), "{flag:?}: {said}");
    }
}

/// Issue 16: on a Cluster, `list` scans every master (SCAN per node) and `release`
/// reaches the key's master, waking its waiters by sharded pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_list_covers_every_master_and_release_reaches_the_key() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let locks = LockManager::builder().cluster(&urls).build().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..30 {
        guards.push(locks.lock(&format!("order_{{{i}}}")).await.unwrap());
    }
    let masters: std::collections::HashSet<usize> = guards
        .iter()
        .map(|g| cluster.master_for_key(g.key()))
        .collect();
    assert_eq!(masters.len(), 3, "the keys are spread over every master");
    let cli = |args: &[&str]| {
        let mut cmd = redlock_on(&["--cluster"], &urls);
        cmd.args(args);
        cmd
    };
    let all = json_list(&mut cli(&[])).await;
    let mut listed: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap().to_owned())
        .collect();
    let mut held: Vec<String> = guards.iter().map(|g| g.key().to_owned()).collect();
    listed.sort();
    held.sort();
    assert_eq!(listed, held);

    let victim = guards.remove(7);
    let waiter = locks.clone();
    let key = victim.key().strip_prefix("lock:").unwrap().to_owned();
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with(&key, LockOptions::new().wait(Duration::from_secs(30)))
            .await
    });
    let mut release = cli(&["release", victim.key(), "--yes"]);
    release_wakes_the_waiter(&mut release, waiting, &[&victim]).await;
}

/// Issue 16: with `--sentinel NAME` the URLs are Sentinels, and the locks shown are the
/// master's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_lists_the_masters_locks() {
    let set = redlock_testkit::Sentinels::start();
    let locks = LockManager::builder()
        .sentinel(set.master_name(), set.sentinel_urls())
        .build()
        .await
        .unwrap();
    let g = locks.lock("nightly_{1}").await.unwrap();
    let all = json_list(&mut redlock_on(
        &["--sentinel", set.master_name()],
        &set.sentinel_urls(),
    ))
    .await;
    assert_eq!(all[0]["key"], "lock:nightly_{1}");
    assert_eq!(all[0]["fencing_token"], g.fencing_token());
    g.release().await.unwrap();
}

/// With `--redlock` the URLs are independent masters. A permit, whose holders each hold
/// a place (a key of its own) on a quorum, is listed once with its holders, and
/// `release` frees every place: a permit waiter is woken, the holders see `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_lists_a_permit_once_and_release_frees_its_places() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let locks = LockManager::builder().redlock(&urls).build().await.unwrap();
    let p1 = locks.permit("pool_{1}", 2).await.unwrap();
    let p2 = locks.permit("pool_{1}", 2).await.unwrap();
    let g = locks.lock("nightly_{1}").await.unwrap();
    let all = json_list(&mut redlock_on(&["--redlock"], &urls)).await;
    let shown: Vec<(&str, &str, u64)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let (key, kind) = (i["key"].as_str().unwrap(), i["kind"].as_str().unwrap());
            (key, kind, i["holders"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("lock:nightly_{1}", "exclusive", 1),
            ("lock:pool_{1}", "permit", 2)
        ]
    );

    let waiter = locks.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .permit_with(
                "pool_{1}",
                2,
                LockOptions::new().wait(Duration::from_secs(30)),
            )
            .await
    });
    let mut release = redlock_on(&["--redlock"], &urls);
    release.args(["release", "lock:pool_{1}", "--yes"]);
    release_wakes_the_waiter(&mut release, waiting, &[&p1, &p2]).await;
    g.release().await.unwrap();
}

/// The denials `ACL LOG` holds for `user`, as `reason object`; without the refused
/// `CLIENT SETINFO` redis-rs sends on Redis 7.2 and later (docs/acl.md: `+client|setinfo`
/// keeps the log clean there, and Redis 7.0 rejects the rule).
fn denials(server: &RedisServer, user: &str) -> Vec<String> {
    let log: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::from_redis_value(server.cmd_sync(&["ACL", "LOG", "1000"]).unwrap()).unwrap();
    let text = |entry: &std::collections::HashMap<String, redis::Value>, k: &str| {
        entry
            .get(k)
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
            .unwrap_or_default()
    };
    log.iter()
        .filter(|entry| {
            text(entry, "username") == user && text(entry, "object") != "client|setinfo"
        })
        .map(|entry| format!("{} {}", text(entry, "reason"), text(entry, "object")))
        .collect()
}

/// docs/acl.md's read-only operator user, taken from the doc itself: `list`, `inspect`
/// and `watch` (its wake-up channel and keyspace events: looking only every 10 s, it
/// still reports a grant and an expiry at once) run with no `ACL LOG` denial, `release`
/// is refused (exit 3, the lock kept); with the `+del +publish` the doc adds, `release`
/// works, also without a denial. (A pattern subscription to the keyspace events was
/// denied: an ACL grants `PSUBSCRIBE` only for the very pattern it names.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_operator_acl_is_enough() {
    let server = RedisServer::start();
    server
        .cmd_sync(&["CONFIG", "SET", "notify-keyspace-events", "KA"])
        .unwrap();
    let doc = include_str!("../../docs/acl.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER operator "))
        .expect("the operator's line in docs/acl.md");
    let operator: Vec<&str> = line
        .split_whitespace()
        .map(|w| if w == ">PASSWORD" { ">pw" } else { w })
        .collect();
    let releaser: Vec<&str> = operator
        .iter()
        .map(|&w| if w == "operator" { "releaser" } else { w })
        .chain(["+del", "+publish"])
        .collect();
    server.cmd_sync(&operator).unwrap();
    server.cmd_sync(&releaser).unwrap();
    server.cmd_sync(&["ACL", "LOG", "RESET"]).unwrap();
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}", server.port());

    let locks = manager(&server).await;
    let held = locks
        .lock_with("buy_{42}", LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .unwrap();
    let _readers = [
        locks.read("report_{1}").await.unwrap(),
        locks.read("report_{1}").await.unwrap(),
    ];
    let _permit = locks.permit("slots_{3}", 2).await.unwrap();
    let _fair = locks.fair("export_{5}").await.unwrap();

    let out = run(&url("operator"), &["--json", "list"]).await;
    assert_eq!(out.status.code(), Some(0));
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 4, "{all}");
    for (key, kind) in [
        ("lock:buy_{42}", "exclusive"),
        ("lock:slots_{3}", "permit"),
        ("lock:export_{5}", "fair"),
    ] {
        let out = run(&url("operator"), &["--json", "inspect", key]).await;
        assert_eq!(out.status.code(), Some(0));
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(info["kind"], kind);
    }
    let mut watch = Watch::start_with(&url("operator"), "lock:buy_{42}", &["--interval", "10s"]);
    assert_eq!(watch.next_holders().await, ("granted".to_owned(), 1));

    held.release().await.unwrap();
    assert_eq!(watch.next_holders().await.0, "released");
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .watchdog(false);
    let brief = locks.lock_with("buy_{42}", short).await.unwrap();
    assert_eq!(watch.next_holders().await, ("granted".to_owned(), 1));
    assert_eq!(watch.next_holders().await.0, "expired");
    drop(brief);
    assert_eq!(denials(&server, "operator"), Vec::<String>::new());

    let held = locks
        .lock_with("buy_{42}", LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .unwrap();
    assert_eq!(watch.next_holders().await, ("granted".to_owned(), 1));
    let refused = run(&url("operator"), &["release", "lock:buy_{42}", "--yes"]).await;
    assert_eq!(refused.status.code(), Some(3));
    assert!(held.is_held());
    assert!(
        !denials(&server, "operator").is_empty(),
        "the refusal is logged"
    );

    let out = run(&url("releaser"), &["release", "lock:buy_{42}", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(watch.next_holders().await.0, "released");
    tokio::time::timeout(Duration::from_secs(6), held.lost())
        .await
        .expect("the holder saw lost() at its next renewal");
    assert_eq!(denials(&server, "releaser"), Vec::<String>::new());
    watch.child.kill().await.unwrap();
}

/// Issue 24, item 9: `--help` printed the password of `$REDIS_URL` (clap shows
/// environment values). No output of any subcommand shows it: help, or the error of a
/// server that cannot be reached, with the URL from the environment or from `--url`.
#[tokio::test]
async fn no_output_shows_the_password() {
    const SECRET: &str = "s3cret-pw";
    let url = format!("redis://operator:{SECRET}@127.0.0.1:1");
    let runs: [&[&str]; 9] = [
        &["--help"],
        &["list", "--help"],
        &["inspect", "--help"],
        &["release", "--help"],
        &["watch", "--help"],
        &["list"],
        &["inspect", "lock:x"],
        &["release", "lock:x", "--yes"],
        &["watch", "lock:x", "--for", "1s"],
    ];
    for args in runs {
        for from_env in [true, false] {
            let mut cmd = environment(Command::new(env!("CARGO_BIN_EXE_redlock")));
            if from_env {
                cmd.env("REDIS_URL", &url);
            } else {
                cmd.arg("--url").arg(&url);
            }
            let out = tokio::time::timeout(Duration::from_secs(20), cmd.args(args).output())
                .await
                .expect("the command ends")
                .expect("the command runs");
            let printed = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
            assert!(
                !printed.contains(SECRET),
                "{args:?} (URL from the environment: {from_env}) printed the password:\n{printed}"
            );
        }
    }
}
