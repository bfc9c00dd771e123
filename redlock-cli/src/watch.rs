//! `watch KEY`: a line per grant, release and expiry.
//!
//! The lock is inspected every `--interval`, and at once when a notification about the
//! key arrives: on one server, the release wake-up the library publishes on the key's
//! channel, and keyspace notifications when the server has them enabled
//! (`notify-keyspace-events`). A change between two looks is reported as:
//! - `granted`: the key is held by a grant not seen before (a new fencing token, or a
//!   new holder);
//! - `released`: the grant seen last is gone, while its ttl had time left (or, for
//!   readers and permits, fewer hold it);
//! - `expired`: the grant seen last is gone, and its ttl had run out by now.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redlock::{redis, LockInfo, LockManager};
use serde_json::json;

use crate::output::{human, owner, shown, to_json};
use crate::{failed, Exit};

/// What happened to the lock between two looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Granted,
    Released,
    /// Released with `hold_at_least` before its minimum hold: held on, no job under it.
    Kept,
    Expired,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Released => "released",
            Self::Kept => "kept",
            Self::Expired => "expired",
        }
    }
}

/// The events from what was seen last (`before`, `since` ago) to what is seen now, each
/// with the lock as it is shown: the grant that ended, or the lock as it is now.
fn events<'a>(
    before: Option<&'a LockInfo>,
    since: Duration,
    now: Option<&'a LockInfo>,
) -> Vec<(Event, &'a LockInfo)> {
    let same =
        |a: &LockInfo, b: &LockInfo| a.holder == b.holder && a.fencing_token == b.fencing_token;
    let gone = |a: &LockInfo| match a.ttl {
        Some(ttl) if ttl <= since => Event::Expired,
        _ => Event::Released,
    };
    match (before, now) {
        (None, None) => vec![],
        (None, Some(b)) => vec![(Event::Granted, b)],
        (Some(a), None) => vec![(gone(a), a)],
        // A holder released with hold_at_least, kept (under a name of its own).
        (Some(a), Some(b))
            if a.kind == b.kind && a.fencing_token == b.fencing_token && b.kept > a.kept =>
        {
            vec![(Event::Kept, b)]
        }
        // Readers or permit holders leaving, the latest grant still there.
        (Some(a), Some(b)) if same(a, b) && b.holders < a.holders => vec![(Event::Released, b)],
        (Some(a), Some(b)) if same(a, b) => vec![],
        // Another reader or permit holder joined.
        (Some(a), Some(b)) if a.kind == b.kind && a.holders < b.holders => {
            vec![(Event::Granted, b)]
        }
        (Some(a), Some(b)) => vec![(gone(a), a), (Event::Granted, b)],
    }
}

/// Prints one event.
fn print(event: Event, info: &LockInfo, json: bool) {
    if json {
        println!(
            "{}",
            json!({ "event": event.name(), "lock": to_json(info) })
        );
        return;
    }
    let fence = info
        .fencing_token
        .map_or_else(String::new, |f| format!(" fencing token {f}"));
    let ttl = info
        .ttl
        .map_or_else(|| "no expiry".to_owned(), |t| format!("ttl {}", human(t)));
    println!(
        "{} {} {} ({}{fence}, {ttl}) {}",
        event.name(),
        shown(&info.key),
        info.kind,
        owner(info),
        holders(info)
    );
}

/// The holders after an event's line: nothing for one running holder.
fn holders(info: &LockInfo) -> String {
    match (info.holders, info.kept) {
        (1, 0) => String::new(),
        (n, 0) => format!("{n} holders"),
        (1, 1) => "kept by hold_at_least".to_owned(),
        (n, k) => format!("{n} holders, {k} kept by hold_at_least"),
    }
}

/// The shortest polling interval on Redlock.
const REDLOCK_INTERVAL: Duration = Duration::from_secs(1);

/// Watches `key` (without the prefix) for `duration` (or until Ctrl-C), looking every
/// `interval` and whenever a notification arrives.
pub(crate) async fn run(
    locks: &LockManager,
    key: &str,
    duration: Option<Duration>,
    interval: Duration,
    json: bool,
    notify_url: Option<&str>,
) -> Exit {
    // On Redlock, inspecting a key held by nobody scans every node for its permit
    // places: no more often than once a second.
    let interval = if locks.backend_name() == "redlock" {
        interval.max(REDLOCK_INTERVAL)
    } else {
        interval
    };
    let end = duration.map(|d| Instant::now() + d);
    let full = format!("{}{key}", locks.prefix());
    let mut notes = match notify_url {
        Some(url) => notifications(url, &full).await,
        None => None,
    };
    let note = blind_spot(notes.is_some(), locks.backend_name(), interval);
    // The first line people read; beside a script's JSON, on stderr.
    if json {
        eprintln!("redlock: {note}");
    } else {
        println!("{note}");
    }
    let mut seen = match locks.inspect(key).await {
        Ok(info) => info,
        Err(e) => return failed(&e),
    };
    let mut at = Instant::now();
    if let Some(info) = &seen {
        print(Event::Granted, info, json);
    } else if !json {
        println!("{}: not held; watching", shown(&full));
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let left = end.map(|end| end.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Exit::Ok;
        }
        let pause = left.map_or(interval, |l| l.min(interval));
        tokio::select! {
            _ = &mut ctrl_c => return Exit::Ok,
            _ = tokio::time::sleep(pause) => {}
            note = next(&mut notes) => {
                if note.is_none() {
                    // The subscription ended: polling goes on.
                    notes = None;
                }
            }
        }
        let now = match locks.inspect(key).await {
            Ok(info) => info,
            Err(e) => return failed(&e),
        };
        for (event, info) in events(seen.as_ref(), at.elapsed(), now.as_ref()) {
            print(event, info, json);
        }
        (seen, at) = (now, Instant::now());
    }
}

/// What the operator should know before the first event: what `watch` cannot see
/// between two looks, and how to see it. Whether the server sends keyspace events is not
/// asked (`CONFIG GET` is no operator's command: it reads passwords too).
fn blind_spot(notified: bool, backend: &str, interval: Duration) -> String {
    let every = human(interval);
    if notified {
        format!(
            "releases show at once; a grant and expiry between two looks ({every} apart) \
             show only if the server sends keyspace events \
             (CONFIG SET notify-keyspace-events Kgx), or with a shorter --interval"
        )
    } else {
        format!(
            "looking every {every} ({backend}: no notifications): a lock held and freed \
             between two looks is missed; a shorter --interval sees more"
        )
    }
}

type Notes = std::pin::Pin<Box<dyn futures_util::Stream<Item = redis::Msg> + Send>>;

/// The key's wake-up channel and its keyspace events on a connection of their own;
/// `None` (polling only) when the wake-up channel cannot be had.
///
/// The keyspace events are the plain channel `__keyspace@<db>__:<key>`, not a pattern:
/// an ACL grants a pattern subscription only for that very pattern, while the channel is
/// covered by `&__keyspace@*__:lock:*`. They are optional (without them an expiry shows
/// at the next look).
async fn notifications(url: &str, full: &str) -> Option<Notes> {
    let client = redis::Client::open(url).ok()?;
    let db = client.get_connection_info().redis_settings().db();
    let subscribe = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(full).await?;
        let _ = pubsub.subscribe(format!("__keyspace@{db}__:{full}")).await;
        Ok::<_, redis::RedisError>(pubsub)
    };
    let pubsub = tokio::time::timeout(Duration::from_secs(3), subscribe)
        .await
        .ok()?
        .ok()?;
    Some(Box::pin(pubsub.into_on_message()))
}

/// The next notification; never resolves without a subscription.
async fn next(notes: &mut Option<Notes>) -> Option<redis::Msg> {
    match notes {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
