//! `watch KEY`: a line per grant, release and expiry.
//!
//! The lock is inspected every `--interval`, and at once when a notification about the
//! key arrives: on one server, the release wake-up the library publishes on the key's
//! channel, and keyspace notifications when the server has them enabled
//! (`notify-keyspace-events`). A change between two looks is reported as (for a read
//! lock or permit, one line per holder, named as `inspect` names it):
//! - `granted`: the key is held by a grant not seen before (a new fencing token, or a
//!   new holder);
//! - `released`: the grant seen last is gone, while its ttl had time left;
//! - `kept`: released with `hold_at_least` before its minimum hold, held on with no job
//!   running under it;
//! - `expired`: the grant seen last is gone, and its ttl had run out by now.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redlock::{redis, LockInfo, LockManager, SharedHolder};
use serde_json::json;

use crate::output::{human, ms, owner, shown, to_json};
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

/// One line of `watch`: an event, the lock as it is shown, and for a read lock or permit
/// the holder the event is about (one line per holder).
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    event: Event,
    lock: &'a LockInfo,
    holder: Option<&'a SharedHolder>,
    /// Whether the lock's owner fields describe this holder: a grant that is the latest
    /// (its fencing token is new, and no other holder came with it).
    latest: bool,
    /// The lock as it is now (`None`: nobody holds it any more).
    now: Option<&'a LockInfo>,
}

impl<'a> Line<'a> {
    fn whole(event: Event, lock: &'a LockInfo) -> Self {
        Self {
            event,
            lock,
            holder: None,
            latest: true,
            now: None,
        }
    }

    fn of(event: Event, lock: &'a LockInfo, holder: &'a SharedHolder) -> Self {
        Self {
            event,
            lock,
            holder: Some(holder),
            latest: false,
            now: None,
        }
    }
}

/// The lines from what was seen last (`before`, `since` ago) to what is seen now: a
/// line per grant, release, keep and expiry, per holder for readers and permits, each
/// with the lock as it is shown (the grant that ended, or the lock as it is now).
fn events<'a>(
    before: Option<&'a LockInfo>,
    since: Duration,
    now: Option<&'a LockInfo>,
) -> Vec<Line<'a>> {
    let mut lines = match (before, now) {
        (None, None) => vec![],
        (None, Some(b)) => granted(b),
        (Some(a), None) => gone(a, since),
        (Some(a), Some(b)) if listed(a) && listed(b) && a.kind == b.kind => holders(a, since, b),
        (Some(a), Some(b)) if !listed(a) && !listed(b) => whole(a, since, b),
        (Some(a), Some(b)) => [gone(a, since), granted(b)].concat(),
    };
    // The owner shown is the latest grant's: the one new holder, when the fence moved.
    let new_fence = now.and_then(|b| b.fencing_token) != before.and_then(|a| a.fencing_token);
    let fresh: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].event == Event::Granted && lines[i].holder.is_some())
        .collect();
    if let ([only], true) = (fresh.as_slice(), new_fence) {
        lines[*only].latest = true;
    }
    for line in &mut lines {
        line.now = now;
    }
    lines
}

/// Whether `info` lists its holders one by one (readers and permits).
fn listed(info: &LockInfo) -> bool {
    !info.shared.is_empty()
}

/// `info` granted: one line, or one per holder.
fn granted(info: &LockInfo) -> Vec<Line<'_>> {
    if listed(info) {
        info.shared
            .iter()
            .map(|h| Line::of(Event::Granted, info, h))
            .collect()
    } else {
        vec![Line::whole(Event::Granted, info)]
    }
}

/// Released, or expired when its ttl had run out `since` the look that saw it.
fn ended(ttl: Option<Duration>, since: Duration) -> Event {
    match ttl {
        Some(ttl) if ttl <= since => Event::Expired,
        _ => Event::Released,
    }
}

/// `info` gone: one line, or one per holder.
fn gone(info: &LockInfo, since: Duration) -> Vec<Line<'_>> {
    if listed(info) {
        info.shared
            .iter()
            .map(|h| Line::of(ended(h.ttl, since), info, h))
            .collect()
    } else {
        vec![Line::whole(ended(info.ttl, since), info)]
    }
}

/// Readers or permit holders from `a` to `b`: each holder that left, was kept, or came
/// (a holder with another fencing token under the same name is a new grant), each with
/// the lock as it is now.
fn holders<'a>(a: &'a LockInfo, since: Duration, b: &'a LockInfo) -> Vec<Line<'a>> {
    let find = |info: &'a LockInfo, name: &str| info.shared.iter().find(|h| h.name == name);
    let mut left = Vec::new();
    let mut came = Vec::new();
    for h in &a.shared {
        match find(b, &h.name) {
            Some(now) if now.fencing_token != h.fencing_token => {
                left.push(Line::of(ended(h.ttl, since), b, h));
                came.push(Line::of(Event::Granted, b, now));
            }
            Some(now) if now.kept && !h.kept => left.push(Line::of(Event::Kept, b, now)),
            Some(_) => {}
            None => left.push(Line::of(ended(h.ttl, since), b, h)),
        }
    }
    for h in &b.shared {
        if find(a, &h.name).is_none() {
            came.push(Line::of(Event::Granted, b, h));
        }
    }
    left.extend(came);
    left
}

/// A lock not listed holder by holder, from `a` to `b`.
fn whole<'a>(a: &'a LockInfo, since: Duration, b: &'a LockInfo) -> Vec<Line<'a>> {
    let same =
        |a: &LockInfo, b: &LockInfo| a.holder == b.holder && a.fencing_token == b.fencing_token;
    if a.kind == b.kind && a.fencing_token == b.fencing_token && b.kept > a.kept {
        // A holder released with hold_at_least, kept (under a name of its own).
        vec![Line::whole(Event::Kept, b)]
    } else if same(a, b) && b.holders < a.holders {
        // Readers or permit holders leaving, the latest grant still there.
        vec![Line::whole(Event::Released, b)]
    } else if same(a, b) {
        vec![]
    } else if a.kind == b.kind && a.holders < b.holders {
        // Another reader or permit holder joined.
        vec![Line::whole(Event::Granted, b)]
    } else {
        vec![
            Line::whole(ended(a.ttl, since), a),
            Line::whole(Event::Granted, b),
        ]
    }
}

/// Prints one line.
fn print(line: Line<'_>, json: bool) {
    let Line {
        event,
        lock: info,
        holder,
        latest,
        now,
    } = line;
    if json {
        let mut out = json!({ "event": event.name(), "lock": to_json(info) });
        if let Some(h) = holder {
            out["holder"] = json!({
                "name": h.name,
                "ttl_ms": h.ttl.map(ms),
                "kept": h.kept,
                "fencing_token": h.fencing_token,
                "latest": latest,
            });
        }
        println!("{out}");
        return;
    }
    let ttl = |ttl: Option<Duration>| {
        ttl.map_or_else(|| "no expiry".to_owned(), |t| format!("ttl {}", human(t)))
    };
    let fence = |f: Option<u64>| f.map_or_else(String::new, |f| format!(" fencing token {f}"));
    let text = match holder {
        None => format!(
            "{} {} {} ({}{}, {}) {}",
            event.name(),
            shown(&info.key),
            info.kind,
            owner(info),
            fence(info.fencing_token),
            ttl(info.ttl),
            count(info)
        ),
        Some(h) => {
            let mut who = Vec::new();
            if latest {
                who.push(owner(info));
            }
            let fence = if latest {
                info.fencing_token.or(h.fencing_token)
            } else {
                h.fencing_token
            };
            who.extend(fence.map(|f| format!("fencing token {f}")));
            who.push(ttl(h.ttl));
            format!(
                "{} {} {} holder {} ({}): {}",
                event.name(),
                shown(&info.key),
                info.kind,
                shown(&h.name),
                who.join(", "),
                left(now)
            )
        }
    };
    println!("{}", text.trim_end());
}

/// After a holder's line: who holds the lock now (`2 holders now, 1 kept`).
fn left(now: Option<&LockInfo>) -> String {
    let Some(info) = now else {
        return "none left".to_owned();
    };
    let mut out = match info.holders {
        1 => "1 holder now".to_owned(),
        n => format!("{n} holders now"),
    };
    if info.kept > 0 {
        out.push_str(&format!(", {} kept", info.kept));
    }
    out
}

/// The holders after an event's line: nothing for one running holder.
fn count(info: &LockInfo) -> String {
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
        for line in events(None, Duration::ZERO, Some(info)) {
            print(line, json);
        }
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
        for line in events(seen.as_ref(), at.elapsed(), now.as_ref()) {
            print(line, json);
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
            "each release makes it look at once; a grant or expiry between two looks \
             ({every} apart) makes it look only if the server sends keyspace events \
             (if it does not: CONFIG SET notify-keyspace-events Kgx), or sooner with a \
             shorter --interval; a hold shorter than one look (a round trip) can be \
             missed even then"
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
