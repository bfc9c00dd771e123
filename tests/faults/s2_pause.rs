//! Scenario 2: a holder process is paused (SIGSTOP) past its ttl, then resumed (SIGCONT).
//!
//! The pause lands between the holder's `begin` and `commit` on the fenced resource, the
//! moment Kleppmann's critique is about: the lease runs out while the process cannot
//! notice. Meanwhile another client acquires (with a larger fencing token) and does its own
//! begin/commit. On resume:
//!
//! * guard mode: the holder's late commit is rejected by the resource (its token is older
//!   than the newest seen); `is_held()` is false at once; `lost()` resolves at once;
//!   `release()` says `Lost`.
//! * macro mode (`on_lost = "abort"`): the body is dropped at its next await and the call
//!   returns `Err(Lost)`; it begins nothing more.

use std::time::Duration;

use redlock::LockOptions;
use redlock_faults::clock::{self, now_ns};
use redlock_faults::history::History;
use redlock_faults::protocol::Mode;
use redlock_faults::resource::Resource;
use redlock_testkit::RedisServer;

use crate::support::{
    holder_args, in_process_section, require_redis, rounds, single, unique, Holder, HEAVY,
};

/// What one round saw.
struct Round {
    holder_token: u64,
    other_token: u64,
    /// Holder commits after the resume: (accepted, rejected).
    late_commits: (usize, usize),
    /// Holder begins after the resume.
    late_begins: usize,
    /// Commit requests sent after the resume (in flight when the body was dropped).
    late_commit_sent: usize,
    /// First `is_held()` after the resume.
    held_after: Option<bool>,
    /// `lost()` resolved this long after the resume.
    lost_after_ms: Option<f64>,
    result: String,
}

async fn round(
    key: &str,
    mode: Mode,
    lock: &RedisServer,
    res: &RedisServer,
    resource: &Resource,
    history: &History,
) -> Round {
    let mut args = holder_args(&lock.url(), &res.url(), "s2", key);
    args.mode = mode;
    args.ttl_ms = 600; // the macro mode's ttl is fixed at 1 s
    args.steps = 3;
    args.step_ms = 300;
    args.hold_ms = 0;
    let mut holder = Holder::spawn(&args);
    let acquired = holder.expect("acquired", Duration::from_secs(15)).await;
    let token = acquired.u64("token").unwrap();
    let enter = acquired.u64("at").unwrap();
    let begin = holder.expect("begin", Duration::from_secs(5)).await;
    assert_eq!(begin.bool("ok"), Some(true));
    // The holder now sleeps 300 ms before committing: freeze it there.
    let paused = holder.pause();

    let other = single(&lock.url()).await;
    let guard = other
        .lock_with(
            &format!("{{{key}}}"),
            LockOptions::new().wait(Duration::from_secs(5)),
        )
        .await
        .expect("the paused holder's lock expires");
    let granted = now_ns();
    let other_token = guard.fencing_token();
    let section = in_process_section(
        resource,
        "other",
        other_token,
        granted,
        Duration::from_millis(20),
    )
    .await;
    let other_committed = section.commits.first().is_some_and(|c| c.1);
    history.record(section);
    guard.release().await.unwrap();
    assert!(other_committed, "the new holder's commit was rejected");

    tokio::time::sleep(Duration::from_millis(50)).await;
    let resumed = holder.resume();
    let done = holder.expect("done", Duration::from_secs(10)).await;
    assert!(holder.wait_exit(Duration::from_secs(5)).await);
    let done_at = done.u64("at").unwrap();
    history.record(holder.section(token, enter, done_at, true));

    let after = |name: &str| -> Vec<redlock_faults::protocol::Event> {
        holder
            .all(name)
            .into_iter()
            .filter(|e| e.u64("at").is_some_and(|at| at >= resumed))
            .cloned()
            .collect()
    };
    if std::env::var("REDLOCK_FAULTS_VERBOSE").is_ok() {
        for (at, e) in &holder.events {
            println!(
                "  {:+9.1} ms after resume: {}",
                clock::ms(resumed, *at),
                e.line()
            );
        }
    }
    let commits = after("commit");
    let accepted = commits
        .iter()
        .filter(|c| c.bool("ok") == Some(true))
        .count();
    println!(
        "s2 {mode:?}: paused {:.0} ms; holder token {token}, other token {other_token}",
        clock::ms(paused, resumed)
    );
    Round {
        holder_token: token,
        other_token,
        late_commits: (accepted, commits.len() - accepted),
        late_begins: after("begin").len(),
        late_commit_sent: after("commit-sent").len(),
        held_after: after("held").first().and_then(|e| e.bool("held")),
        lost_after_ms: after("lost")
            .first()
            .and_then(|e| e.u64("at"))
            .map(|at| clock::ms(resumed, at)),
        result: done.get("result").unwrap_or("?").to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_paused_holder_is_fenced_off_and_aborted() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let lock = RedisServer::start();
    let res = RedisServer::start();
    let resource = Resource::open(&res.url(), "s2").await.unwrap();
    let history = History::new();
    // One key (and one resource) for every round: tokens must keep increasing across them.
    let key = unique("s2");
    let n = rounds(2, 15);
    let mut fenced = 0;
    for i in 0..n {
        // Guard mode: the late commit must be rejected by fencing.
        let r = round(&key, Mode::Guard, &lock, &res, &resource, &history).await;
        println!(
            "s2 guard round {i}: late commits accepted/rejected {:?}, late begins {}, \
             is_held() after resume {:?}, lost() {:?} ms after resume, result {}",
            r.late_commits, r.late_begins, r.held_after, r.lost_after_ms, r.result
        );
        assert!(r.other_token > r.holder_token);
        assert_eq!(r.late_commits.0, 0, "a stale commit was accepted");
        assert!(r.late_commits.1 >= 1, "the late commit was not attempted");
        fenced += r.late_commits.1;
        assert_eq!(r.held_after, Some(false), "is_held() after the pause");
        let lost_after = r.lost_after_ms.expect("lost() resolved");
        assert!(lost_after < 500.0, "lost() took {lost_after} ms");
        assert_eq!(r.result, "lost");

        // Macro mode: the body stops at its next await and the call returns Lost.
        let r = round(&key, Mode::Macro, &lock, &res, &resource, &history).await;
        println!(
            "s2 macro round {i}: commit requests sent after the resume {}; late commits \
             accepted/rejected {:?}, late begins {}, result {}",
            r.late_commit_sent, r.late_commits, r.late_begins, r.result
        );
        assert!(r.other_token > r.holder_token);
        assert_eq!(r.late_commits.0, 0, "a stale commit was accepted");
        assert_eq!(r.late_begins, 0, "the body went on after losing the lock");
        assert_eq!(
            r.late_commit_sent, 0,
            "the body went on after losing the lock"
        );
        assert_eq!(r.result, "lost");
    }
    let state = resource.state().await.unwrap();
    history.settle(&state.accepted);
    let report = history.check();
    println!(
        "s2 summary: {n} rounds per mode; stale commits rejected by fencing: {fenced} \
         (plus {} rejected begins); checker: {report}; resource problems {:?}",
        state.begin_rejected,
        state.problems()
    );
    assert!(report.ok(), "{report}");
    assert_eq!(report.overlaps, report.excused);
    assert!(state.problems().is_empty(), "{:?}", state.problems());
}
