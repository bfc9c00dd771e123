//! The Lua scripts run directly on a real redis-server (`EVAL` of each body), rule by rule:
//! read/write locks with writer intents, leased permits, `hold_at_least`, `lock_all`, and
//! fencing tokens that never pass through a Lua double.

use std::thread::sleep;
use std::time::Duration;

use redis::{Commands, Connection, FromRedisValue, PubSub, RedisResult, ToRedisArgs, Value};
use redlock_testkit::RedisServer;

const ACQUIRE: &str = include_str!("../redlock-runtime/src/scripts/acquire.lua");
const RELEASE: &str = include_str!("../redlock-runtime/src/scripts/release.lua");
const ACQUIRE_SHARED: &str = include_str!("../redlock-runtime/src/scripts/acquire_shared.lua");
const RELEASE_SHARED: &str = include_str!("../redlock-runtime/src/scripts/release_shared.lua");
const RENEW_SHARED: &str = include_str!("../redlock-runtime/src/scripts/renew_shared.lua");
const ACQUIRE_ALL: &str = include_str!("../redlock-runtime/src/scripts/acquire_all.lua");
const FENCE_FLOOR: &str = include_str!("../redlock-runtime/src/scripts/fence_floor.lua");
const EXTEND: &str = include_str!("../redlock-runtime/src/scripts/extend.lua");
const RENEW: &str = include_str!("../redlock-runtime/src/scripts/renew.lua");

/// The keys of one lock, all in slot `{7}`.
const K: &str = "lock:report_{7}";
const H: &str = "lock:report_{7}:holders";
const F: &str = "lock:fence:{7}";
const W: &str = "lock:report_{7}:writers";

const READ: &str = "~read";
const PERMIT: &str = "~permit";

/// 2^53 + 5: above what a Lua number holds exactly.
const BIG: &str = "9007199254740997";

/// A shared kind's marker as the key's value starts with it: padded to 16 bytes with
/// `~` (the metadata follows it).
fn marked(marker: &str) -> String {
    format!("{marker:~<16}")
}

/// A 16-byte token, as the library makes them (raw bytes, not text).
fn token(n: u8) -> Vec<u8> {
    let mut t = vec![0xA5u8; 16];
    t[0] = n;
    t[15] = 0xFF - n;
    t
}

struct Redis {
    server: RedisServer,
    con: Connection,
}

fn redis() -> Redis {
    let server = RedisServer::start();
    let con = server.client().get_connection().expect("connect");
    Redis { server, con }
}

impl Redis {
    fn eval<T: FromRedisValue>(
        &mut self,
        script: &str,
        keys: &[&str],
        args: impl ToRedisArgs,
    ) -> RedisResult<T> {
        redis::cmd("EVAL")
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .query(&mut self.con)
    }

    /// acquire.lua for writer `tok` (no writer intent when `waiter` is empty).
    fn write(&mut self, tok: &[u8], ttl: u64, waiter: &str, intent: u64) -> Value {
        self.eval(ACQUIRE, &[K, F, W], (tok, ttl, "", waiter, intent))
            .expect("acquire")
    }

    fn shared(&mut self, tok: &[u8], ttl: u64, marker: &str, limit: u32) -> Value {
        let honour = if marker == READ { "1" } else { "0" };
        self.eval(
            ACQUIRE_SHARED,
            &[K, H, F, W],
            (tok, ttl, marker, limit, honour),
        )
        .expect("acquire_shared")
    }

    fn release_shared(&mut self, tok: &[u8], marker: &str, keep: u64) -> i64 {
        self.eval(RELEASE_SHARED, &[K, H], (tok, "PUBLISH", marker, keep))
            .expect("release_shared")
    }

    fn renew_shared(&mut self, tok: &[u8], ttl: u64, marker: &str) -> Vec<i64> {
        self.eval(RENEW_SHARED, &[K, H], (tok, ttl, marker))
            .expect("renew_shared")
    }

    fn digest(&mut self, value: &[u8]) -> String {
        self.eval(
            "return string.sub(redis.sha1hex(ARGV[1]), 1, 16)",
            &[],
            value,
        )
        .expect("digest")
    }

    fn exists(&mut self, key: &str) -> bool {
        self.con.exists(key).expect("EXISTS")
    }

    fn pttl(&mut self, key: &str) -> i64 {
        self.con.pttl(key).expect("PTTL")
    }

    fn zcard(&mut self, key: &str) -> u64 {
        self.con.zcard(key).expect("ZCARD")
    }

    /// A connection for a subscriber ([`listen`]).
    fn subscriber(&self) -> Connection {
        self.server.client().get_connection().expect("connect")
    }
}

/// Subscribes `con` to `channel`, reading with a short timeout.
fn listen<'a>(con: &'a mut Connection, channel: &str) -> PubSub<'a> {
    let mut sub = con.as_pubsub();
    sub.subscribe(channel).expect("SUBSCRIBE");
    sub.set_read_timeout(Some(Duration::from_millis(150)))
        .expect("timeout");
    sub
}

/// The payloads received until a read times out (at most 10).
fn messages(sub: &mut PubSub<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..10 {
        match sub.get_message() {
            Ok(msg) => out.push(msg.get_payload().expect("payload")),
            Err(e) if e.is_timeout() => break,
            Err(e) => panic!("pubsub: {e}"),
        }
    }
    out
}

/// A granted fence (an integer or decimal digits), as a u64.
fn fence(v: &Value) -> u64 {
    match v {
        Value::Int(n) => u64::try_from(*n).expect("positive fence"),
        Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
        other => panic!("not granted: {other:?}"),
    }
}

/// A granted fence sent as decimal digits (above 2^53).
fn digits(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("not digits: {other:?}"),
    }
}

/// A refusal `{ms, holder digest}`.
fn refused(v: &Value) -> (i64, String) {
    match v {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(ms), Value::BulkString(d)] => (*ms, String::from_utf8(d.clone()).unwrap()),
            _ => panic!("odd refusal: {v:?}"),
        },
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn readers_share_and_exclude_a_writer() {
    let mut r = redis();
    let f1 = fence(&r.shared(&token(1), 30_000, READ, 0));
    let f2 = fence(&r.shared(&token(2), 30_000, READ, 0));
    assert!(f2 > f1, "each reader gets a fencing token of its own");
    assert_eq!(r.zcard(H), 2);
    let read = r.digest(marked(READ).as_bytes());
    let (pttl, holder) = refused(&r.write(&token(3), 30_000, "", 0));
    assert_eq!(holder, read);
    assert!(pttl > 25_000 && pttl <= 30_000, "{pttl}");
    // No waiter id: no intent.
    assert!(!r.exists(W));
}

#[test]
fn a_writer_excludes_readers_and_permits() {
    let mut r = redis();
    fence(&r.write(&token(1), 30_000, "waiter-1", 5_000));
    assert!(!r.exists(W), "an uncontended writer registers no intent");
    let writer = r.digest(&token(1));
    let (pttl, holder) = refused(&r.shared(&token(2), 30_000, READ, 0));
    assert_eq!(holder, writer);
    assert!(pttl > 25_000, "{pttl}");
    let (_, holder) = refused(&r.shared(&token(3), 30_000, PERMIT, 4));
    assert_eq!(holder, writer);
    assert!(!r.exists(H), "a refusal writes nothing");
}

#[test]
fn a_permit_key_refuses_readers_and_the_reverse() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, PERMIT, 2));
    let (_, holder) = refused(&r.shared(&token(2), 30_000, READ, 0));
    assert_eq!(holder, r.digest(marked(PERMIT).as_bytes()));
}

#[test]
fn writer_intent_blocks_new_readers_and_is_removed_on_the_writers_success() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    let (_, holder) = refused(&r.write(&token(9), 30_000, "waiter-9", 5_000));
    assert_eq!(holder, r.digest(marked(READ).as_bytes()));
    assert_eq!(r.zcard(W), 1);
    let w_pttl = r.pttl(W);
    assert!(
        w_pttl > 4_000 && w_pttl <= 5_000,
        "W expires with its intent: {w_pttl}"
    );
    // A new reader queues behind the writer...
    let (wait, holder) = refused(&r.shared(&token(2), 30_000, READ, 0));
    assert_eq!(holder, r.digest(b"~write-intent"));
    assert!(wait > 4_000 && wait <= 5_000, "{wait}");
    // ...while a retry of the reader already in is granted.
    fence(&r.shared(&token(1), 30_000, READ, 0));
    assert_eq!(r.zcard(H), 1);
    assert_eq!(r.release_shared(&token(1), READ, 0), 1);
    // The writer's next attempt takes the lock and removes its intent.
    fence(&r.write(&token(9), 30_000, "waiter-9", 4_000));
    assert!(!r.exists(W), "intent removed");
    let mut raw: Vec<u8> = r.con.get(K).unwrap();
    assert_eq!(raw[..16], token(9));
    // Released: readers come in again.
    let released: i64 = r.eval(RELEASE, &[K], (&token(9)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);
    fence(&r.shared(&token(2), 30_000, READ, 0));
    raw = r.con.get(K).unwrap();
    assert_eq!(raw[..16], *marked(READ).as_bytes());
}

/// Issue 23, finding 3: a writer's intent outlived the writer when the attempt that
/// registered it lost its reply and the retried call was granted: the grant removed the
/// intent only when the caller said one was registered (readers were refused for 19.4 s
/// after the only writer released). A grant now removes its writer's intent whatever it
/// was told.
#[test]
fn a_grant_withdraws_its_writers_intent_whatever_it_was_told() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    // The attempt that registers the intent; its reply is lost.
    refused(&r.write(&token(9), 30_000, "waiter-9", 20_000));
    assert_eq!(r.zcard(W), 1);
    assert_eq!(r.release_shared(&token(1), READ, 0), 1);
    // The retry, sent as the first attempt with an intent would be: granted.
    fence(&r.write(&token(8), 30_000, "waiter-9", 20_000));
    assert!(!r.exists(W), "the writer's intent outlives its grant");
    let released: i64 = r.eval(RELEASE, &[K], (&token(8)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);
    fence(&r.shared(&token(2), 30_000, READ, 0));
}

/// Issue 23, finding 2: a kept lock (`hold_at_least`) kept its token, so an extend or
/// renewal applied after the release re-armed it for a whole ttl. Now a kept key or
/// place is held by its kept name: no extend or renewal finds it, and a retried release
/// (its first reply lost) still recognises it as its own.
#[test]
fn a_kept_hold_is_extended_and_renewed_by_nobody() {
    let mut r = redis();
    fence(&r.write(&token(1), 30_000, "", 0));
    let keep = |r: &mut Redis, ms: u64| -> i64 {
        r.eval(RELEASE, &[K], (&token(1)[..], "PUBLISH", ms))
            .unwrap()
    };
    assert_eq!(keep(&mut r, 5_000), 1);
    let extended: i64 = r.eval(EXTEND, &[K], (&token(1)[..], 120_000)).unwrap();
    assert_eq!(extended, 0, "an extend after the release");
    let renewed: Vec<i64> = r.eval(RENEW, &[K], (&token(1)[..], 120_000)).unwrap();
    assert_eq!(renewed, vec![0], "a renewal after the release");
    assert!(r.pttl(K) <= 5_000, "re-armed: {}", r.pttl(K));
    refused(&r.write(&token(2), 30_000, "", 0));
    assert_eq!(keep(&mut r, 4_000), 1, "a retried keep is still ours");
    assert!(r.pttl(K) <= 4_000);
    assert_eq!(keep(&mut r, 0), 1, "a retried release after the hold");
    assert!(!r.exists(K));
    // A shared place: the same.
    for marker in [READ, PERMIT] {
        fence(&r.shared(&token(3), 30_000, marker, 2));
        assert_eq!(r.release_shared(&token(3), marker, 5_000), 1);
        assert_eq!(
            r.renew_shared(&token(3), 120_000, marker),
            vec![0],
            "{marker}"
        );
        assert!(r.pttl(K) <= 5_000, "{marker} re-armed: {}", r.pttl(K));
        assert_eq!(r.zcard(H), 1, "{marker}: the kept place still counts");
        assert_eq!(
            r.release_shared(&token(3), marker, 0),
            1,
            "{marker}: a retried release"
        );
        assert!(!r.exists(K) && !r.exists(H), "{marker}");
    }
}

#[test]
fn a_writer_waiting_behind_a_writer_keeps_readers_out_after_it() {
    let mut r = redis();
    fence(&r.write(&token(1), 30_000, "", 0));
    refused(&r.write(&token(2), 30_000, "waiter-2", 5_000));
    assert_eq!(r.zcard(W), 1, "an intent whoever holds the lock");
    let released: i64 = r.eval(RELEASE, &[K], (&token(1)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);
    let (_, holder) = refused(&r.shared(&token(3), 30_000, READ, 0));
    assert_eq!(holder, r.digest(b"~write-intent"));
    fence(&r.write(&token(2), 30_000, "waiter-2", 4_000));
    assert!(!r.exists(W));
}

/// Regression (kinds review): a writer's intent lasted its whole remaining wait, so a
/// writer that died (no withdrawal can come) with a long wait kept every new reader out
/// that long. It now lasts until 2 s after the key's current expiry, which the writer was
/// told: a live writer asks again by then (or sooner, woken by a release) and renews it.
#[test]
fn a_writers_intent_runs_out_soon_after_the_expiry_it_was_told() {
    let mut r = redis();
    fence(&r.shared(&token(1), 1_000, READ, 0));
    refused(&r.write(&token(9), 30_000, "waiter-9", 600_000));
    let w = r.pttl(W);
    assert!(
        w > 2_000 && w <= 3_000,
        "the intent of a writer told 1 s lasts {w} ms"
    );
    // Shorter than that: the writer's remaining wait.
    refused(&r.write(&token(9), 30_000, "waiter-9", 1_500));
    let w = r.pttl(W);
    assert!(w > 1_000 && w <= 1_500, "{w}");
}

#[test]
fn writer_intent_expires_on_its_own() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    refused(&r.write(&token(9), 30_000, "waiter-9", 5_000));
    let (wait, _) = refused(&r.shared(&token(2), 30_000, READ, 0));
    assert!(wait > 4_000 && wait <= 5_000, "{wait}");
    // The writer's next attempt refreshes its intent to its remaining wait, shorter now.
    refused(&r.write(&token(9), 30_000, "waiter-9", 150));
    assert_eq!(r.zcard(W), 1);
    let (wait, _) = refused(&r.shared(&token(2), 30_000, READ, 0));
    assert!(wait <= 150, "{wait}");
    assert!(r.pttl(W) <= 150);
    sleep(Duration::from_millis(250));
    fence(&r.shared(&token(2), 30_000, READ, 0));
    assert!(!r.exists(W), "the writer gave up: nothing lasting");
    // An intent of 0 ms (a writer that does not wait) registers nothing.
    refused(&r.write(&token(9), 30_000, "waiter-9", 0));
    assert!(!r.exists(W));
}

#[test]
fn at_most_limit_permit_holders() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, PERMIT, 2));
    fence(&r.shared(&token(2), 10_000, PERMIT, 2));
    let (wait, holder) = refused(&r.shared(&token(3), 30_000, PERMIT, 2));
    assert_eq!(holder, r.digest(marked(PERMIT).as_bytes()));
    assert!(
        wait > 5_000 && wait <= 10_000,
        "until the earliest holder expires: {wait}"
    );
    assert_eq!(r.zcard(H), 2);
    // Scores are expiries on the server's clock (TIME), in milliseconds.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut r.con).unwrap();
    let now = secs * 1_000 + micros / 1_000;
    let score: f64 = r.con.zscore(H, &token(2)[..]).unwrap();
    let left = score as i64 - now as i64;
    assert!(left > 5_000 && left <= 10_000, "{left}");
    // A retry of a holder at the limit keeps its place.
    fence(&r.shared(&token(2), 10_000, PERMIT, 2));
    assert_eq!(r.release_shared(&token(2), PERMIT, 0), 1);
    fence(&r.shared(&token(3), 30_000, PERMIT, 2));
    assert_eq!(r.zcard(H), 2);
}

#[test]
fn an_expired_permit_holder_frees_its_place_by_the_servers_clock() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, PERMIT, 2));
    fence(&r.shared(&token(2), 30_000, PERMIT, 2));
    refused(&r.shared(&token(3), 30_000, PERMIT, 2));
    // Holder 1 dies after its last renewal (to 100 ms).
    assert_eq!(r.renew_shared(&token(1), 100, PERMIT), vec![1]);
    let (wait, _) = refused(&r.shared(&token(3), 30_000, PERMIT, 2));
    assert!(wait <= 100, "{wait}");
    sleep(Duration::from_millis(200));
    fence(&r.shared(&token(3), 30_000, PERMIT, 2));
    let live: u64 = r
        .eval(
            "local t = redis.call('TIME') \
             return redis.call('ZCOUNT', KEYS[1], '(' .. (t[1] * 1000 + math.floor(t[2] / 1000)), '+inf')",
            &[H],
            Vec::<u8>::new(),
        )
        .unwrap();
    assert_eq!(live, 2, "the expired holder is not counted");
    // Its renewal and release find nothing; the release reclaims its entry.
    assert_eq!(r.renew_shared(&token(1), 30_000, PERMIT), vec![0]);
    assert_eq!(r.release_shared(&token(1), PERMIT, 0), 0);
    let score: Option<f64> = r.con.zscore(H, &token(1)[..]).unwrap();
    assert_eq!(score, None);
    assert_eq!(r.zcard(H), 2);
}

#[test]
fn shrinking_one_readers_ttl_keeps_the_others_time() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    fence(&r.shared(&token(2), 30_000, READ, 0));
    assert_eq!(r.renew_shared(&token(2), 100, READ), vec![1]);
    let (k, h) = (r.pttl(K), r.pttl(H));
    assert!(k > 25_000 && h > 25_000, "K {k} H {h}");
    // The other one shrinks too: the key now ends with the latest of them.
    assert_eq!(r.renew_shared(&token(1), 2_000, READ), vec![1]);
    let k = r.pttl(K);
    assert!(k > 1_000 && k <= 2_000, "{k}");
    // Growing again works, and a batch answers per place.
    let renewed: Vec<i64> = r
        .eval(
            RENEW_SHARED,
            &[K, H, K, H],
            (&token(1)[..], 30_000, READ, &token(7)[..], 30_000, READ),
        )
        .unwrap();
    assert_eq!(renewed, vec![1, 0]);
    assert!(r.pttl(K) > 25_000);
    // Wrong marker: lost.
    assert_eq!(r.renew_shared(&token(1), 30_000, PERMIT), vec![0]);
}

#[test]
fn releasing_the_last_reader_deletes_the_key_and_its_holders_and_publishes_free() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    fence(&r.shared(&token(1), 30_000, READ, 0));
    fence(&r.shared(&token(2), 10_000, READ, 0));
    fence(&r.shared(&token(3), 5_000, READ, 0));
    // A reader leaving others who hold K as long as before: nobody waits on it.
    assert_eq!(r.release_shared(&token(3), READ, 0), 1);
    assert_eq!(
        messages(&mut sub),
        Vec::<String>::new(),
        "K's expiry unchanged"
    );
    assert_eq!(r.release_shared(&token(1), READ, 0), 1);
    assert!(r.exists(K) && r.exists(H));
    let k = r.pttl(K);
    assert!(
        k <= 10_000 && k > 5_000,
        "K now ends with the other reader: {k}"
    );
    assert_eq!(
        messages(&mut sub),
        vec!["1".to_owned()],
        "readers remain, but K expires sooner than a waiting writer was told"
    );
    assert_eq!(r.release_shared(&token(2), READ, 0), 1);
    assert!(!r.exists(K) && !r.exists(H));
    assert_eq!(messages(&mut sub), vec![String::new()], "'' = free");
    assert_eq!(r.release_shared(&token(2), READ, 0), 0, "a double release");
    assert_eq!(messages(&mut sub), Vec::<String>::new());
}

#[test]
fn a_permit_release_publishes_the_places_freed() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    fence(&r.shared(&token(1), 30_000, PERMIT, 3));
    fence(&r.shared(&token(2), 30_000, PERMIT, 3));
    fence(&r.shared(&token(3), 30_000, PERMIT, 3));
    assert_eq!(r.renew_shared(&token(1), 100, PERMIT), vec![1]);
    sleep(Duration::from_millis(200));
    assert_eq!(r.release_shared(&token(2), PERMIT, 0), 1);
    assert_eq!(
        messages(&mut sub),
        vec!["2".to_owned()],
        "itself + one expired"
    );
    assert_eq!(r.release_shared(&token(3), PERMIT, 0), 1);
    assert_eq!(messages(&mut sub), vec!["1".to_owned()]);
    assert!(!r.exists(K) && !r.exists(H));
}

#[test]
fn a_shared_release_never_touches_a_key_someone_else_took() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    // Force-released (e.g. by an operator), then taken by a writer.
    let _: () = r.con.del(K).unwrap();
    fence(&r.write(&token(9), 30_000, "", 0));
    assert_eq!(r.renew_shared(&token(1), 30_000, READ), vec![0]);
    assert_eq!(r.release_shared(&token(1), READ, 0), 1);
    let held: Vec<u8> = r.con.get(K).unwrap();
    assert_eq!(held[..16], token(9), "the writer's value, its token first");
    assert!(r.pttl(K) > 25_000);
    assert!(!r.exists(H));
}

#[test]
fn hold_at_least_keeps_the_key() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    fence(&r.write(&token(1), 30_000, "", 0));
    let released: i64 = r
        .eval(RELEASE, &[K], (&token(1)[..], "PUBLISH", 5_000))
        .unwrap();
    assert_eq!(released, 1);
    let pttl = r.pttl(K);
    assert!(pttl > 4_000 && pttl <= 5_000, "{pttl}");
    // Not free yet ('' is never published): waiters are told to ask again.
    assert_eq!(messages(&mut sub), vec!["kept".to_owned()]);
    refused(&r.write(&token(2), 30_000, "", 0));
    // '0' deletes as before.
    let released: i64 = r
        .eval(RELEASE, &[K], (&token(1)[..], "PUBLISH", 0))
        .unwrap();
    assert_eq!(released, 1);
    assert!(!r.exists(K));
    assert_eq!(messages(&mut sub), vec![String::new()]);
    // A malformed keep is an error, the lock untouched.
    fence(&r.write(&token(1), 30_000, "", 0));
    let err = r.eval::<i64>(RELEASE, &[K], (&token(1)[..], "PUBLISH", "soon"));
    assert!(err.is_err());
    assert!(r.pttl(K) > 25_000);
}

#[test]
fn hold_at_least_keeps_a_permit_counted() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    fence(&r.shared(&token(1), 30_000, PERMIT, 1));
    assert_eq!(r.release_shared(&token(1), PERMIT, 5_000), 1);
    // Nothing freed (no count is published): waiters are told to ask again.
    assert_eq!(messages(&mut sub), vec!["kept".to_owned()]);
    let (wait, _) = refused(&r.shared(&token(2), 30_000, PERMIT, 1));
    assert!(wait > 4_000 && wait <= 5_000, "{wait}");
    let pttl = r.pttl(K);
    assert!(pttl > 4_000 && pttl <= 5_000, "{pttl}");
}

#[test]
fn acquire_all_is_all_or_nothing() {
    let mut r = redis();
    let (a, b, c) = ("lock:a_{7}", "lock:b_{7}", "lock:c_{7}");
    let other = token(2);
    let _: () = r.con.set_ex(b, &other[..], 30).unwrap();
    let reply: Value = r
        .eval(ACQUIRE_ALL, &[a, b, c, F, F, F], (&token(1)[..], 30_000))
        .unwrap();
    let expected_holder = r.digest(&other);
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(0), Value::Int(2), Value::Int(pttl), Value::BulkString(d)] => {
                assert!(*pttl > 25_000, "{pttl}");
                assert_eq!(String::from_utf8(d.clone()).unwrap(), expected_holder);
            }
            _ => panic!("odd miss: {items:?}"),
        },
        other => panic!("odd miss: {other:?}"),
    }
    assert!(!r.exists(a) && !r.exists(c), "no key left behind");
    let counter: Option<u64> = r.con.get(F).unwrap();
    assert_eq!(
        counter,
        Some(0),
        "no fence issued: the increments taken back"
    );
    let _: () = r.con.del(b).unwrap();
    let grant: Vec<u64> = r
        .eval(ACQUIRE_ALL, &[a, b, c, F, F, F], (&token(1)[..], 30_000))
        .unwrap();
    assert_eq!(
        grant,
        vec![1, 1, 2, 3],
        "distinct increasing fences on one counter"
    );
    // A retry (reply lost) is granted again with fresh fences, its expiry reset.
    let _: () = r.con.pexpire(a, 1_000).unwrap();
    let grant: Vec<u64> = r
        .eval(ACQUIRE_ALL, &[a, b, c, F, F, F], (&token(1)[..], 30_000))
        .unwrap();
    assert_eq!(grant, vec![1, 4, 5, 6]);
    assert!(r.pttl(a) > 25_000);
    // A reader on one key is another holder.
    for key in [a, b, c] {
        let released: i64 = r.eval(RELEASE, &[key], (&token(1)[..], "PUBLISH")).unwrap();
        assert_eq!(released, 1);
    }
    fence(&r.shared(&token(5), 30_000, READ, 0));
    let reply: Value = r
        .eval(ACQUIRE_ALL, &[a, K, F, F], (&token(1)[..], 30_000))
        .unwrap();
    let read = r.digest(marked(READ).as_bytes());
    assert!(
        matches!(&reply, Value::Array(i) if i.len() == 4 && i[3] == Value::BulkString(read.into_bytes())),
        "{reply:?}"
    );
    assert!(!r.exists(a));
}

/// A key of another type among them fails the call (the server's own `WRONGTYPE`)
/// after the keys before it were written and their counters incremented: all of that is
/// taken back, so a failed `lock_all` leaves no lock behind and no fence issued; a key
/// this token held before the call (a retry) is left as it was.
#[test]
fn acquire_all_takes_back_what_it_took_when_a_key_fails() {
    let mut r = redis();
    let (a, b, c) = ("lock:a_{7}", "lock:b_{7}", "lock:c_{7}");
    let mine = [&token(1)[..], b"|1||1"].concat();
    let _: () = r.con.set(a, &mine[..]).unwrap();
    let _: () = r.con.hset(c, "f", "v").unwrap();
    let err = r
        .eval::<Value>(ACQUIRE_ALL, &[a, b, c, F, F, F], (&token(1)[..], 30_000))
        .unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    assert!(!r.exists(b), "the key this call wrote is given back");
    let kept: Vec<u8> = r.con.get(a).unwrap();
    assert_eq!(kept, mine, "a key held before the call is as it was");
    let counter: Option<u64> = r.con.get(F).unwrap();
    assert_eq!(counter, Some(0), "no fence issued");
}

/// A counter at 2^63 - 1 cannot issue the second key's fence (`INCR` overflows): the
/// first key, written with a fence of another counter, is given back and that counter
/// decremented, so no fence was issued and no lock is left.
#[test]
fn acquire_all_takes_back_the_keys_before_a_counter_that_overflows() {
    let mut r = redis();
    let (a, b) = ("lock:a_{7}", "lock:b_{8}");
    let full = "lock:fence:{8}";
    let _: () = r.con.set(F, 41).unwrap();
    let _: () = r.con.set(full, i64::MAX).unwrap();
    let err = r
        .eval::<Value>(ACQUIRE_ALL, &[a, b, F, full], (&token(1)[..], 30_000))
        .unwrap_err();
    assert!(
        err.to_string().contains("fencing counter lock:fence:{8}"),
        "{err}"
    );
    assert!(!r.exists(a), "the first key is given back");
    let counter: u64 = r.con.get(F).unwrap();
    assert_eq!(counter, 41, "the first key's fence taken back");
    let untouched: i64 = r.con.get(full).unwrap();
    assert_eq!(untouched, i64::MAX);
}

#[test]
fn retries_are_idempotent() {
    let mut r = redis();
    let f1 = fence(&r.shared(&token(1), 10_000, READ, 0));
    let again = fence(&r.shared(&token(1), 30_000, READ, 0));
    assert!(
        again > f1,
        "a retry gets a fresh token (see the test below)"
    );
    assert_eq!(r.zcard(H), 1);
    assert!(r.pttl(K) > 25_000, "expiry reset");
    assert_eq!(r.release_shared(&token(1), READ, 0), 1);
    let w = fence(&r.write(&token(9), 10_000, "waiter-9", 1_000));
    assert_eq!(fence(&r.write(&token(9), 30_000, "waiter-9", 1_000)), w);
    assert!(r.pttl(K) > 25_000, "expiry reset");
    assert_eq!(r.release_shared(&token(9), READ, 0), 0, "not a reader");
}

/// Found by the nemesis of issue 13: a shared acquire whose reply was lost is sent
/// again with the same token (the connection's retry); it found its place and read the
/// counter back, which is the token of whoever was granted meanwhile: two readers (or
/// permits) with one fencing token.
#[test]
fn a_retried_shared_acquire_gets_a_token_of_its_own() {
    for (marker, limit) in [(READ, 0), (PERMIT, 3)] {
        let mut r = redis();
        let first = fence(&r.shared(&token(1), 10_000, marker, limit));
        let other = fence(&r.shared(&token(2), 10_000, marker, limit));
        let retried = fence(&r.shared(&token(1), 10_000, marker, limit));
        assert_ne!(
            retried, other,
            "{marker}: the retry got the other holder's token (first {first})"
        );
        assert!(retried > other, "{marker}: {retried} after {other}");
        assert_eq!(r.zcard(H), 2, "{marker}: the retry took no second place");
    }
}

#[test]
fn fences_above_2_pow_53_are_exact_digits() {
    let mut r = redis();
    let _: () = r.con.set(F, BIG).unwrap();
    assert_eq!(
        digits(&r.shared(&token(1), 30_000, READ, 0)),
        "9007199254740998"
    );
    assert_eq!(
        digits(&r.shared(&token(2), 30_000, READ, 0)),
        "9007199254740999"
    );
    // A retry gets a fresh token, exact digits too.
    assert_eq!(
        digits(&r.shared(&token(2), 30_000, READ, 0)),
        "9007199254741000"
    );
    r.release_shared(&token(1), READ, 0);
    r.release_shared(&token(2), READ, 0);
    assert_eq!(
        digits(&r.write(&token(3), 30_000, "w", 1_000)),
        "9007199254741001"
    );
    let grant: Value = r
        .eval(
            ACQUIRE_ALL,
            &["lock:a_{7}", "lock:b_{7}", F, F],
            (&token(4)[..], 30_000),
        )
        .unwrap();
    assert_eq!(
        grant,
        Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"9007199254741002".to_vec()),
            Value::BulkString(b"9007199254741003".to_vec()),
        ])
    );
}

#[test]
fn fence_floor_raises_the_counter_for_a_shared_holder_only() {
    let mut r = redis();
    fence(&r.shared(&token(1), 30_000, READ, 0));
    let floor = "9007199254740999";
    let raised: i64 = r
        .eval(FENCE_FLOOR, &[K, F, H], (&token(2)[..], floor, READ))
        .unwrap();
    assert_eq!(raised, 0, "not a holder");
    let raised: i64 = r
        .eval(FENCE_FLOOR, &[K, F, H], (&token(1)[..], floor, PERMIT))
        .unwrap();
    assert_eq!(raised, 0, "another kind of place");
    let raised: i64 = r
        .eval(FENCE_FLOOR, &[K, F], (&token(1)[..], floor))
        .unwrap();
    assert_eq!(raised, 0, "not the exclusive holder");
    let counter: String = r.con.get(F).unwrap();
    assert_eq!(counter, "1");
    let raised: i64 = r
        .eval(FENCE_FLOOR, &[K, F, H], (&token(1)[..], floor, READ))
        .unwrap();
    assert_eq!(raised, 1);
    let counter: String = r.con.get(F).unwrap();
    assert_eq!(counter, floor);
}

#[test]
fn a_failing_counter_gives_the_place_back() {
    let mut r = redis();
    let _: () = r.con.set(F, "not a number").unwrap();
    let err = r
        .eval::<Value>(
            ACQUIRE_SHARED,
            &[K, H, F, W],
            (&token(1)[..], 30_000, READ, 0, 1),
        )
        .unwrap_err();
    assert!(err.to_string().contains("fencing counter"), "{err}");
    assert!(!r.exists(K) && !r.exists(H));
    let err = r
        .eval::<Value>(
            ACQUIRE_ALL,
            &["lock:a_{7}", "lock:b_{7}", F, F],
            (&token(1)[..], 30_000),
        )
        .unwrap_err();
    assert!(err.to_string().contains("fencing counter"), "{err}");
    assert!(!r.exists("lock:a_{7}") && !r.exists("lock:b_{7}"));
}

#[test]
fn bad_arguments_are_errors_and_write_nothing() {
    let mut r = redis();
    for (ttl, limit) in [("0", "0"), ("soon", "0"), ("100", "x")] {
        let err = r.eval::<Value>(
            ACQUIRE_SHARED,
            &[K, H, F, W],
            (&token(1)[..], ttl, READ, limit, 1),
        );
        assert!(err.is_err(), "ttl {ttl} limit {limit}");
    }
    let err = r.eval::<Value>(
        ACQUIRE_ALL,
        &["lock:a_{7}", "lock:b_{7}", F],
        (&token(1)[..], 30_000),
    );
    assert!(err.is_err(), "odd key count");
    let err = r.eval::<Value>(ACQUIRE_ALL, &["lock:a_{7}", F], (&token(1)[..], "-1"));
    assert!(err.is_err(), "bad ttl");
    let err = r.eval::<Value>(RENEW_SHARED, &[K, H], (&token(1)[..], 100));
    assert!(err.is_err(), "not a triple");
    let keys: Vec<String> = r.con.keys("*").unwrap();
    assert_eq!(keys, Vec::<String>::new());
}

const INSPECT: &str = include_str!("../redlock-runtime/src/scripts/inspect.lua");

/// Issue 16: the value is the token followed by owner metadata; release, extend, renew
/// and a retried acquire compare only its first 16 bytes, and refuse a token that
/// differs anywhere in them, or a longer argument that starts with the token.
#[test]
fn owner_metadata_follows_the_token_and_only_the_token_is_compared() {
    let mut r = redis();
    let owner = "|e|4242|build-host";
    let fence1 = fence(
        &r.eval(
            ACQUIRE,
            &[K, F, W],
            (&token(1)[..], 30_000, owner, "", "", 1_700_000_000_123u64),
        )
        .unwrap(),
    );
    let raw: Vec<u8> = r.con.get(K).unwrap();
    assert_eq!(raw[..16], token(1));
    let meta = String::from_utf8(raw[16..].to_vec()).unwrap();
    let fields: Vec<&str> = meta.split('|').collect();
    assert_eq!(fields[..2], ["", "1"], "{meta}");
    assert_eq!(
        fields[2], "1700000000123",
        "the caller's acquire time: {meta}"
    );
    assert_eq!(fields[3], fence1.to_string());
    assert_eq!(fields[4..], ["e", "4242", "build-host"]);

    let mut near = token(1);
    near[15] ^= 1;
    let mut longer = token(1);
    longer.push(b'|');
    for other in [&near[..], &longer[..], &token(1)[..15]] {
        let extended: i64 = r.eval(EXTEND, &[K], (other, 60_000)).unwrap();
        assert_eq!(extended, 0);
        let released: i64 = r.eval(RELEASE, &[K], (other, "PUBLISH")).unwrap();
        assert_eq!(released, -1);
        let renewed: Vec<i64> = r.eval(RENEW, &[K], (other, 60_000)).unwrap();
        assert_eq!(renewed, [0]);
        refused(&r.eval(ACQUIRE, &[K, F, W], (other, 30_000, owner)).unwrap());
    }
    assert!(r.pttl(K) <= 30_000, "nobody else extended it");
    let renewed: Vec<i64> = r.eval(RENEW, &[K], (&token(1)[..], 60_000)).unwrap();
    assert_eq!(renewed, [1]);
    let extended: i64 = r.eval(EXTEND, &[K], (&token(1)[..], 90_000)).unwrap();
    assert_eq!(extended, 1);
    assert!(r.pttl(K) > 60_000);
    let again: Vec<u8> = r.con.get(K).unwrap();
    assert_eq!(again, raw, "extends keep the metadata");
    // A retry finding its own token is granted again.
    fence(
        &r.eval(ACQUIRE, &[K, F, W], (&token(1)[..], 30_000, owner))
            .unwrap(),
    );
    let released: i64 = r.eval(RELEASE, &[K], (&token(1)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);
    assert!(!r.exists(K));
}

/// Issue 16: a retried acquire (its reply lost) that finds its own token reports the
/// fence its value holds, the one `inspect` shows, not the slot's counter read back
/// (which another key of the slot has moved on meanwhile). A value of a token alone,
/// written before the metadata, gets the counter.
#[test]
fn a_retried_acquire_reports_the_fence_its_value_holds() {
    let mut r = redis();
    let first = fence(&r.write(&token(1), 30_000, "", 0));
    let other: Value = r
        .eval(ACQUIRE, &["lock:other_{7}", F], (&token(2)[..], 30_000))
        .unwrap();
    assert_eq!(fence(&other), first + 1, "one counter for the slot");
    let retried = fence(&r.write(&token(1), 30_000, "", 0));
    assert_eq!(retried, first, "the retry reports the grant it found");
    let raw: Vec<u8> = r.con.get(K).unwrap();
    let meta = String::from_utf8(raw[16..].to_vec()).unwrap();
    assert_eq!(meta.split('|').nth(3), Some(&*first.to_string()), "{meta}");

    // Above 2^53 the stored digits come back as digits.
    let _: () = r.con.set(F, BIG).unwrap();
    let big = "lock:big_{7}";
    let granted: Value = r.eval(ACQUIRE, &[big, F], (&token(3)[..], 30_000)).unwrap();
    let _: () = r.con.incr(F, 1).unwrap();
    let again: Value = r.eval(ACQUIRE, &[big, F], (&token(3)[..], 30_000)).unwrap();
    assert_eq!(digits(&again), digits(&granted));

    // A bare token (an older version's value): the counter, after this call's INCR
    // (every call increments it first: above anything issued for that key).
    let bare = "lock:bare_{7}";
    let _: () = r.con.set_ex(bare, &token(4)[..], 30).unwrap();
    let counter: String = r.con.get(F).unwrap();
    let reply: Value = r
        .eval(ACQUIRE, &[bare, F], (&token(4)[..], 30_000))
        .unwrap();
    let next = counter.parse::<u64>().unwrap() + 1;
    assert_eq!(digits(&reply), next.to_string());
}

/// Issue 16: a value written before owner metadata existed (the 16-byte token alone, or
/// a bare reader marker) is still extended, renewed and released by its holder, and a
/// reader joining bare-marker readers leaves the marker bare for them.
#[test]
fn values_written_before_owner_metadata_still_work() {
    let mut r = redis();
    let _: () = r.con.set_ex(K, &token(1)[..], 30).unwrap();
    let extended: i64 = r.eval(EXTEND, &[K], (&token(1)[..], 60_000)).unwrap();
    assert_eq!(extended, 1);
    let renewed: Vec<i64> = r.eval(RENEW, &[K], (&token(1)[..], 60_000)).unwrap();
    assert_eq!(renewed, [1]);
    let (_, holder) = refused(&r.write(&token(2), 30_000, "", 0));
    assert_eq!(
        holder,
        r.digest(&token(1)),
        "the same digest as with metadata"
    );
    let released: i64 = r.eval(RELEASE, &[K], (&token(1)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);

    // Readers of an older version: K holds the bare marker.
    let _: () = r.con.set(K, READ).unwrap();
    let _: () = r.con.zadd(H, &token(3)[..], 99_999_999_999_999u64).unwrap();
    fence(&r.shared(&token(4), 30_000, READ, 0));
    let raw: Vec<u8> = r.con.get(K).unwrap();
    assert_eq!(raw, READ.as_bytes(), "left as the older readers wrote it");
    assert_eq!(r.renew_shared(&token(4), 30_000, READ), vec![1]);
    let info: Vec<Value> = r.eval(INSPECT, &[K, H], Vec::<u8>::new()).unwrap();
    assert_eq!(info[0], Value::BulkString(b"r".to_vec()));
    assert_eq!(info[3], Value::Int(2));
    assert_eq!(
        info[4],
        Value::BulkString(Vec::new()),
        "no metadata to show"
    );
    assert_eq!(r.release_shared(&token(4), READ, 0), 1);
    assert_eq!(r.release_shared(&token(3), READ, 0), 1);
    assert!(!r.exists(K) && !r.exists(H));
}

/// Whether `reply` holds 8 bytes in a row of `tok`, at any depth.
fn shows_token(reply: &Value, tok: &[u8]) -> bool {
    match reply {
        Value::BulkString(b) => b.windows(8).any(|w| tok.windows(8).any(|t| t == w)),
        Value::Array(items) => items.iter().any(|i| shows_token(i, tok)),
        _ => false,
    }
}

/// Issue 16: what inspect.lua returns never contains the token; issue 24, item 12: nor
/// the names it lists shared holders by (their kept names: the name each keeps).
#[test]
fn inspect_returns_no_token() {
    let mut r = redis();
    fence(
        &r.eval(ACQUIRE, &[K, F, W], (&token(1)[..], 30_000, "|e|1|h"))
            .unwrap(),
    );
    let reply: Value = r.eval(INSPECT, &[K, H], Vec::<u8>::new()).unwrap();
    assert!(!shows_token(&reply, &token(1)), "{reply:?}");
    let Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(items[0], Value::BulkString(b"e".to_vec()));
    assert_eq!(items[7], Value::Array(vec![]), "no shared holders");
    let nothing: Value = r
        .eval(INSPECT, &["lock:free_{7}", H], Vec::<u8>::new())
        .unwrap();
    assert_eq!(nothing, Value::Nil);

    let released: i64 = r.eval(RELEASE, &[K], (&token(1)[..], "")).unwrap();
    assert_eq!(released, 1);
    fence(&r.shared(&token(2), 10_000, READ, 0));
    fence(&r.shared(&token(3), 20_000, READ, 0));
    assert_eq!(r.release_shared(&token(3), READ, 30_000), 1, "kept");
    let reply: Value = r.eval(INSPECT, &[K, H], Vec::<u8>::new()).unwrap();
    for t in [2, 3] {
        assert!(!shows_token(&reply, &token(t)), "{reply:?}");
    }
    let Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    let shared: Vec<(String, i64)> = redis::from_redis_value(items[7].clone()).unwrap();
    let mut kept_name = |t: u8| {
        let mut seed = b"~kept".to_vec();
        seed.extend_from_slice(&token(t));
        r.digest(&seed)
    };
    let (two, three) = (kept_name(2), kept_name(3));
    assert_eq!(shared.len(), 2, "{shared:?}");
    assert_eq!(shared[0].0, two, "soonest first, named by its kept name");
    assert_eq!(
        shared[1].0,
        format!("{three}~kept"),
        "kept, under that name"
    );
    assert!(shared[0].1 > 0 && shared[0].1 <= 10_000, "{shared:?}");
    assert!(shared[1].1 > 20_000 && shared[1].1 <= 30_000, "{shared:?}");
}

const FORCE_UNLOCK: &str = include_str!("../redlock-runtime/src/scripts/force_unlock.lua");

/// Issue 24, item 11: force_unlock.lua deletes the lock, its holders and its writers'
/// intents and wakes the waiters, whoever holds it; given the holder and fencing token
/// an operator was shown, only while no later grant holds it: another holder, a later
/// grant of the same shared kind (compared as text, exact beyond 2^53), or a key that
/// is not a lock is left untouched.
#[test]
fn force_unlock_deletes_only_the_grant_shown() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    let force = |r: &mut Redis, holder: &str, fence: &str| -> i64 {
        r.eval(FORCE_UNLOCK, &[K, H, W], ("PUBLISH", holder, fence))
            .expect("force_unlock")
    };
    assert_eq!(force(&mut r, "", ""), 0, "nothing there");
    assert_eq!(messages(&mut sub), Vec::<String>::new(), "nobody woken");

    // Exclusive: another holder, or a later grant, is refused; the one shown goes.
    let shown = fence(&r.write(&token(1), 30_000, "", 0));
    let holder = r.digest(&token(1));
    let other = r.digest(&token(2));
    assert_eq!(force(&mut r, &other, &shown.to_string()), -1);
    assert_eq!(force(&mut r, &holder, &(shown - 1).to_string()), -1);
    assert!(r.exists(K), "kept");
    assert_eq!(force(&mut r, &holder, &shown.to_string()), 1);
    assert!(!r.exists(K));
    assert_eq!(messages(&mut sub), vec![String::new()], "waiters woken");
    assert_eq!(force(&mut r, &holder, &shown.to_string()), 0, "gone");

    // Readers: a reader that joined later is another grant of the same holder digest.
    let first = fence(&r.shared(&token(3), 30_000, READ, 0));
    let later = fence(&r.shared(&token(4), 30_000, READ, 0));
    let marker = r.digest(marked(READ).as_bytes());
    assert_eq!(force(&mut r, &marker, &first.to_string()), -1);
    assert_eq!(r.zcard(H), 2, "both readers kept");
    assert_eq!(force(&mut r, &marker, &later.to_string()), 1);
    assert!(!r.exists(K) && !r.exists(H));
    assert_eq!(messages(&mut sub), vec![String::new()]);

    // Unconditional: holders and intents too.
    r.write(&token(5), 30_000, "", 0);
    let _: () = r.con.zadd(W, "7", 9_999_999_999_999u64).unwrap();
    assert_eq!(force(&mut r, "", ""), 1);
    assert!(!r.exists(K) && !r.exists(W));

    // Tokens beyond a double's precision: 2^53 + 5 is later than 2^53 + 4.
    let big = format!("{}|1|1700000000000|{BIG}|e|1|h", "x".repeat(16));
    let _: () = r.con.set(K, &big).unwrap();
    let holder = r.digest(&b"x".repeat(16));
    assert_eq!(force(&mut r, &holder, "9007199254740996"), -1);
    assert_eq!(force(&mut r, &holder, "10000000000000000000"), 1);

    // A value written before metadata existed: by holder alone.
    let _: () = r.con.set(K, &token(6)[..]).unwrap();
    let holder = r.digest(&token(6));
    assert_eq!(force(&mut r, &holder, "1"), 1);

    // Not a lock: left alone when a grant is named.
    let _: () = r.con.rpush(K, "x").unwrap();
    assert_eq!(force(&mut r, &holder, "1"), 0);
    assert!(r.exists(K));
}

/// Issue 27: extend.lua sets a later expiry with one `PEXPIRE … GT`; only an expiry that
/// moves sooner (or a key that had none) is announced ('sooner': waiters were told the
/// later time), and only the token's own lock is touched.
#[test]
fn extend_announces_only_an_expiry_moved_sooner() {
    let mut r = redis();
    let mut con = r.subscriber();
    let mut sub = listen(&mut con, K);
    fence(
        &r.eval(ACQUIRE, &[K, F, W], (&token(1)[..], 30_000))
            .unwrap(),
    );
    let extend = |r: &mut Redis, tok: &[u8], ms: u64| -> i64 {
        r.eval(EXTEND, &[K], (tok, ms, "PUBLISH")).unwrap()
    };
    assert_eq!(extend(&mut r, &token(1), 60_000), 1);
    assert!(r.pttl(K) > 30_000, "later: {}", r.pttl(K));
    assert_eq!(
        messages(&mut sub),
        Vec::<String>::new(),
        "later: nobody to tell"
    );
    assert_eq!(extend(&mut r, &token(1), 10_000), 1);
    assert!(r.pttl(K) <= 10_000, "sooner: {}", r.pttl(K));
    assert_eq!(messages(&mut sub), ["sooner"]);
    let _: () = redis::cmd("PERSIST").arg(K).query(&mut r.con).unwrap();
    assert_eq!(extend(&mut r, &token(1), 20_000), 1);
    assert!(
        (1..=20_000).contains(&r.pttl(K)),
        "an expiry again: {}",
        r.pttl(K)
    );
    assert_eq!(
        messages(&mut sub),
        ["sooner"],
        "no expiry counts as the latest"
    );
    assert_eq!(extend(&mut r, &token(2), 90_000), 0, "another token");
    assert!(r.pttl(K) <= 20_000);
    assert_eq!(messages(&mut sub), Vec::<String>::new());
}

/// Issue 27 (CI flake of `force_unlock_spares_a_later_grant` on Redlock, after the acquire
/// script took to incrementing the counter first): a refused acquire moved the counter,
/// so a Redlock set's nodes drifted apart by every refusal, and a late grant on a node
/// ahead carried a fence above its holder's token (what `inspect` showed then changed
/// under the operator). A refusal leaves the counter where it was, writer or not.
#[test]
fn a_refused_acquire_leaves_the_counter_alone() {
    let mut r = redis();
    let first = fence(&r.write(&token(1), 30_000, "", 0));
    refused(&r.write(&token(2), 30_000, "", 0));
    refused(&r.write(&token(3), 30_000, "writer-1", 5_000));
    let counter: u64 = r.con.get(F).unwrap();
    assert_eq!(counter, first, "refusals do not count");
    let released: i64 = r.eval(RELEASE, &[K], (&token(1)[..], "PUBLISH")).unwrap();
    assert_eq!(released, 1);
    assert_eq!(fence(&r.write(&token(2), 30_000, "", 0)), first + 1);
}

const ACQUIRE_BATCH: &str = include_str!("../redlock-runtime/src/scripts/acquire_batch.lua");
const RELEASE_BATCH: &str = include_str!("../redlock-runtime/src/scripts/release_batch.lua");

/// The claims of the batch tests, in six slots, each set up in a state of its own: free,
/// held by another token, held by its own token (a retry), a counter that is no integer,
/// a counter one step below 2^53 + 5, and a key that holds a list.
fn batch_claims(r: &mut Redis) -> Vec<(String, String, Vec<u8>)> {
    let claims: Vec<_> = (1..=6u8)
        .map(|i| {
            (
                format!("lock:b{i}_{{{i}}}"),
                format!("lock:fence:{{{i}}}"),
                token(i),
            )
        })
        .collect();
    let _: () = r
        .con
        .set(&claims[1].0, [&token(9)[..], b"|1||1"].concat())
        .unwrap();
    let _: () = r
        .con
        .set(&claims[2].0, [&claims[2].2[..], b"|1|5|7"].concat())
        .unwrap();
    let _: () = r.con.set(&claims[2].1, 7).unwrap();
    let _: () = r.con.set(&claims[3].1, "abc").unwrap();
    let _: () = r.con.set(&claims[4].1, "9007199254740996").unwrap();
    let _: () = r.con.rpush(&claims[5].0, "not a lock").unwrap();
    claims
}

/// Review of the coalescing (issue 27): a batch decides each claim exactly as
/// acquire.lua decides it alone (grant and fence, refusal and holder, a retry finding its
/// own token, a counter error, digits above 2^53, a key of another type), one claim's
/// failure touching no other claim (the review's finding 1: a `WRONGTYPE` raised by
/// `redis.call` ended the whole call, every caller of the batch failing with it), and a
/// refusal leaving its counter where it was.
#[test]
fn a_batched_acquire_decides_each_claim_as_acquire_alone_does() {
    let (mut alone, mut batched) = (redis(), redis());
    let claims = batch_claims(&mut alone);
    batch_claims(&mut batched);
    let one_by_one: Vec<RedisResult<Value>> = claims
        .iter()
        .map(|(k, f, t)| alone.eval(ACQUIRE, &[k, f], (t, 30_000, "", "", "", 1234)))
        .collect();
    let keys: Vec<&str> = claims
        .iter()
        .flat_map(|(k, f, _)| [k.as_str(), f.as_str()])
        .collect();
    let mut args: Vec<Vec<u8>> = vec![b"".to_vec(), b"1234".to_vec()];
    for (_, _, t) in &claims {
        args.push(t.clone());
        args.push(b"30000".to_vec());
    }
    let together: Value = batched.eval(ACQUIRE_BATCH, &keys, &args).unwrap();
    let Value::Array(together) = together else {
        panic!("not an array: {together:?}")
    };
    assert_eq!(together.len(), claims.len());
    for (i, (one, batch)) in one_by_one.iter().zip(&together).enumerate() {
        match (one, batch) {
            (Ok(Value::Array(a)), Value::Array(b)) => {
                assert_eq!(a[1], b[1], "claim {i}: the same holder");
                let (Value::Int(pa), Value::Int(pb)) = (&a[0], &b[0]) else {
                    panic!("claim {i}: pttl {a:?} {b:?}")
                };
                assert!((pa - pb).abs() < 1000, "claim {i}: pttl {pa} and {pb}");
            }
            (Ok(a), b) => assert_eq!(a, b, "claim {i}"),
            (Err(a), Value::Array(b)) if b.len() == 1 => {
                let b = String::from_redis_value(b[0].clone()).unwrap();
                let code = |m: &str| m.split_whitespace().next().map(str::to_owned);
                assert_eq!(
                    code(&b),
                    a.code().map(str::to_owned),
                    "claim {i}: {a} and {b}"
                );
            }
            other => panic!("claim {i}: alone and batched differ: {other:?}"),
        }
    }
    assert_eq!(fence(&together[0]), 1);
    refused(&together[1]);
    assert_eq!(
        fence(&together[2]),
        7,
        "a retry reports the fence its value holds"
    );
    for failed in [3, 5] {
        assert!(
            matches!(&together[failed], Value::Array(m) if m.len() == 1),
            "a failed claim is its message alone: {:?}",
            together[failed]
        );
    }
    assert_eq!(digits(&together[4]), "9007199254740997");
    for r in [&mut alone, &mut batched] {
        let counter: Option<u64> = r.con.get(&claims[1].1).unwrap();
        assert_eq!(counter, Some(0), "the refusal took its increment back");
        let value: Vec<u8> = r.con.get(&claims[0].0).unwrap();
        assert_eq!(
            &value[..16],
            &claims[0].2[..],
            "the granted claim holds its key"
        );
        assert!(value.ends_with(b"|1|1234|1"), "{value:?}");
    }
}

/// A batched release releases each key as release.lua does with nothing kept: its own
/// token (1, with a wake-up), a key gone (0), another holder's (-1, untouched), its own
/// kept name (1), and a key of another type (its failure alone).
#[test]
fn a_batched_release_decides_each_key_as_release_alone_does() {
    let mut r = redis();
    let keys = ["lock:r1", "lock:r2", "lock:r3", "lock:r4", "lock:r5"];
    let kept = {
        let seed = [b"~kept".as_slice(), &token(4)].concat();
        let digest: String = r
            .eval("return redis.sha1hex(ARGV[1])", &[], &seed[..])
            .unwrap();
        digest[..16].to_owned()
    };
    let _: () = r
        .con
        .set(keys[0], [&token(1)[..], b"|1||1"].concat())
        .unwrap();
    let _: () = r
        .con
        .set(keys[2], [&token(9)[..], b"|1||2"].concat())
        .unwrap();
    let _: () = r.con.set(keys[3], format!("{kept}|1||3")).unwrap();
    let _: () = r.con.rpush(keys[4], "not a lock").unwrap();
    let mut listener = r.server.client().get_connection().unwrap();
    let mut sub = listen(&mut listener, keys[0]);
    let tokens: Vec<Vec<u8>> = (1..=5).map(token).collect();
    let mut args: Vec<&[u8]> = vec![b"PUBLISH"];
    args.extend(tokens.iter().map(|t| &t[..]));
    let replies: Vec<Value> = r.eval(RELEASE_BATCH, &keys, &args).unwrap();
    assert_eq!(
        replies[..4],
        [Value::Int(1), Value::Int(0), Value::Int(-1), Value::Int(1)]
    );
    assert!(
        matches!(&replies[4], Value::Array(m) if m.len() == 1),
        "a key of another type fails alone: {:?}",
        replies[4]
    );
    let left: Vec<bool> = keys.iter().map(|k| r.con.exists(k).unwrap()).collect();
    assert_eq!(left, vec![false, false, true, false, true]);
    assert_eq!(
        messages(&mut sub),
        vec![String::new()],
        "the release woke its waiters"
    );
}

// The fair lock: `acquire_fair.lua` runs before `acquire.lua`, as one script.

/// The fair queue of `K`, and its heartbeats.
const Q: &str = "lock:report_{7}:~queue";
const B: &str = "lock:report_{7}:~heartbeats";

impl Redis {
    /// One fair attempt of waiter `waiter` ('' = one attempt that does not queue) with
    /// `ticket`, its place lasting `beat` ms, the queue bounded by `bound`.
    fn fair(
        &mut self,
        tok: &[u8],
        waiter: &str,
        ticket: u64,
        beat: u64,
        bound: u32,
    ) -> RedisResult<Value> {
        let script = [
            include_str!("../redlock-runtime/src/scripts/acquire_fair.lua"),
            ACQUIRE,
        ]
        .concat();
        self.eval(
            &script,
            &[K, F, W, Q, B],
            (
                tok, 30_000, "", "", "", "", waiter, ticket, beat, bound, "PUBLISH",
            ),
        )
    }

    fn fair_release(&mut self, tok: &[u8]) -> i64 {
        self.eval(RELEASE, &[K, Q, B], (tok, "PUBLISH", 0))
            .expect("release")
    }
}

/// A fair attempt refused: `(pttl, ticket)`.
fn queued(v: &Value) -> (i64, i64) {
    match v {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(ms), _, Value::Int(ticket)] => (*ms, *ticket),
            _ => panic!("odd fair refusal: {v:?}"),
        },
        other => panic!("not queued: {other:?}"),
    }
}

/// Waiters are granted in the order they arrived, only at their turn; a release names
/// the first waiter (and no one else) on the key's channel; a grant leaves the queue.
#[test]
fn fair_waiters_are_granted_in_arrival_order_and_named_by_the_release() {
    let mut r = redis();
    let mut sub_con = r.subscriber();
    let mut sub = listen(&mut sub_con, K);
    let held = fence(&r.fair(&token(1), "", 0, 3_000, 10).unwrap());
    assert!(held > 0, "free and nobody queued: granted");
    assert_eq!(queued(&r.fair(&token(2), "20", 0, 3_000, 10).unwrap()).1, 1);
    assert_eq!(queued(&r.fair(&token(3), "30", 0, 3_000, 10).unwrap()).1, 2);
    assert!(
        queued(&r.fair(&token(9), "", 0, 3_000, 10).unwrap()).0 > 0,
        "one attempt waits behind the queue"
    );
    assert_eq!(r.zcard(Q), 2, "a one-attempt call takes no place");
    assert_eq!(r.fair_release(&token(1)), 1);
    assert_eq!(messages(&mut sub), vec!["w:20".to_owned()]);
    // 30 is not first: refused though the key is free.
    assert_eq!(
        queued(&r.fair(&token(3), "30", 2, 3_000, 10).unwrap()),
        (-2, 2)
    );
    let second = fence(&r.fair(&token(2), "20", 1, 3_000, 10).unwrap());
    assert!(second > held);
    assert_eq!(r.zcard(Q), 1, "the grant left the queue");
    // Its reply lost, the same attempt is sent again: granted again, no place taken.
    assert_eq!(
        fence(&r.fair(&token(2), "20", 1, 3_000, 10).unwrap()),
        second
    );
    assert_eq!(r.zcard(Q), 1);
    assert_eq!(r.fair_release(&token(2)), 1);
    assert_eq!(messages(&mut sub), vec!["w:30".to_owned()]);
    assert!(fence(&r.fair(&token(3), "30", 2, 3_000, 10).unwrap()) > second);
    assert_eq!(r.fair_release(&token(3)), 1);
    assert_eq!(
        messages(&mut sub),
        vec![String::new()],
        "nobody queued: free for anyone"
    );
    assert!(!r.exists(Q) && !r.exists(B), "an empty queue leaves no key");
}

/// A waiter that stops asking loses its place by the server's clock, and when that
/// leaves a new first waiter while the key is free, the attempt that found it out names
/// it on the channel. A full queue refuses a new place with `QUEUEFULL`.
#[test]
fn a_silent_fair_waiter_is_dropped_by_the_servers_clock() {
    let mut r = redis();
    let mut sub_con = r.subscriber();
    let mut sub = listen(&mut sub_con, K);
    // First and the key free: granted at once, leaving no place.
    let held = fence(&r.fair(&token(1), "10", 0, 200, 2).unwrap());
    assert_eq!(r.zcard(Q), 0);
    assert_eq!(queued(&r.fair(&token(2), "20", 0, 200, 2).unwrap()).1, 1);
    assert_eq!(queued(&r.fair(&token(3), "30", 0, 5_000, 2).unwrap()).1, 2);
    let full = r.fair(&token(4), "40", 0, 5_000, 2).unwrap_err();
    assert_eq!(full.code(), Some("QUEUEFULL"), "{full}");
    assert!(
        r.pttl(Q) > 4_000,
        "the queue lives as long as its latest place"
    );
    assert_eq!(r.fair_release(&token(1)), 1);
    assert_eq!(messages(&mut sub), vec!["w:20".to_owned()]);
    // 20 never comes: its place runs out 200 ms after it last asked.
    sleep(Duration::from_millis(300));
    assert_eq!(
        queued(&r.fair(&token(4), "40", 0, 5_000, 2).unwrap()),
        (-2, 3)
    );
    assert_eq!(
        messages(&mut sub),
        vec!["w:30".to_owned()],
        "the new first waiter is named"
    );
    assert!(fence(&r.fair(&token(3), "30", 2, 5_000, 2).unwrap()) > held);
}

/// A place dropped or never made on a node comes back at the ticket it is sent (a
/// Redlock waiter's agreed ticket), and a greater ticket moves it back.
#[test]
fn a_fair_place_comes_back_at_its_ticket() {
    let mut r = redis();
    fence(&r.fair(&token(1), "", 0, 3_000, 10).unwrap());
    assert_eq!(queued(&r.fair(&token(2), "20", 0, 3_000, 10).unwrap()).1, 1);
    assert_eq!(queued(&r.fair(&token(3), "30", 7, 3_000, 10).unwrap()).1, 7);
    assert_eq!(queued(&r.fair(&token(4), "40", 0, 3_000, 10).unwrap()).1, 8);
    assert_eq!(
        queued(&r.fair(&token(2), "20", 9, 3_000, 10).unwrap()).1,
        9,
        "moved back"
    );
    assert_eq!(
        queued(&r.fair(&token(2), "20", 3, 3_000, 10).unwrap()).1,
        9,
        "never forward"
    );
    assert_eq!(r.fair_release(&token(1)), 1);
    let first: Vec<String> = r.con.zrange(Q, 0, 0).unwrap();
    assert_eq!(first, vec!["30".to_owned()]);
}

impl Redis {
    /// Calls of `command` the server has run, from `INFO commandstats`.
    fn calls_of(&mut self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con)
            .unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }
}

/// Issue 27 (cost per lock): a fair attempt that finds nobody queued and the key free is
/// granted without making a place and taking it back (the gate's dozen calls skipped),
/// and its release, with nobody queued, reads no clock and names nobody. A settling
/// round of a Redlock waiter (`'place'`) still makes its place on a free key and is not
/// granted.
#[test]
fn an_uncontended_fair_lock_makes_no_place() {
    let mut r = redis();
    let mut sub_con = r.subscriber();
    let mut sub = listen(&mut sub_con, K);
    let (places, clocks) = (r.calls_of("zadd"), r.calls_of("time"));
    let granted = fence(&r.fair(&token(1), "10", 0, 3_000, 10).unwrap());
    assert!(granted > 0);
    assert_eq!(r.fair_release(&token(1)), 1);
    assert_eq!(r.calls_of("zadd"), places, "no place made and removed");
    assert_eq!(r.calls_of("time"), clocks, "no clock read");
    assert_eq!(messages(&mut sub), vec![String::new()], "free for anyone");
    assert!(!r.exists(Q) && !r.exists(B));
    let script = [
        include_str!("../redlock-runtime/src/scripts/acquire_fair.lua"),
        ACQUIRE,
    ]
    .concat();
    let settled: Value = r
        .eval(
            &script,
            &[K, F, W, Q, B],
            (
                &token(2)[..],
                30_000,
                "",
                "",
                "",
                "",
                "20",
                5,
                3_000,
                10,
                "PUBLISH",
                "place",
            ),
        )
        .unwrap();
    assert_eq!(
        queued(&settled),
        (-2, 5),
        "placed at its ticket, not granted"
    );
    assert!(!r.exists(K));
}

/// Regression (issue 26 review, finding 1): a fair attempt granted with its reply lost
/// and sent again (the connection's re-send, same token) found its place gone and a
/// waiter queued meanwhile ahead of it: it was queued behind the key it held, told
/// "held", and the key stayed taken until its ttl, nobody releasing it.
#[test]
fn a_resent_fair_attempt_is_granted_again_though_others_queued_meanwhile() {
    let mut r = redis();
    let granted = fence(&r.fair(&token(1), "10", 0, 3_000, 10).unwrap());
    assert_eq!(queued(&r.fair(&token(2), "20", 0, 3_000, 10).unwrap()).1, 1);
    assert_eq!(
        fence(&r.fair(&token(1), "10", 0, 3_000, 10).unwrap()),
        granted
    );
    let places: Vec<String> = r.con.zrange(Q, 0, -1).unwrap();
    assert_eq!(places, vec!["20".to_owned()], "the retry took no place");
}

/// Regression (issue 26 review, finding 2): withdrawing a fair waiter published '' (wake
/// everyone), so each timed-out or cancelled waiter sent every other one to ask.
/// `withdraw.lua` wakes whom it held back only: the readers an intent kept out (''), the
/// new first waiter when the first left while the key is free ('w:<id>'), else nobody.
#[test]
fn a_withdrawal_wakes_only_whom_it_held_back() {
    const WITHDRAW: &str = include_str!("../redlock-runtime/src/scripts/withdraw.lua");
    let mut r = redis();
    let mut sub_con = r.subscriber();
    let mut sub = listen(&mut sub_con, K);
    let held = fence(&r.fair(&token(1), "", 0, 3_000, 10).unwrap());
    for (i, w) in ["10", "20", "30"].iter().enumerate() {
        assert_eq!(
            queued(&r.fair(&token(2), w, 0, 3_000, 10).unwrap()).1,
            i as i64 + 1
        );
    }
    let withdraw = |r: &mut Redis, waiter: &str| -> i64 {
        r.eval(WITHDRAW, &[K, W, Q, B], (waiter, "PUBLISH"))
            .unwrap()
    };
    assert_eq!(withdraw(&mut r, "20"), 1);
    assert_eq!(withdraw(&mut r, "10"), 1, "first, but the key is held");
    assert!(messages(&mut sub).is_empty(), "nobody was held back");
    assert_eq!(r.fair_release(&token(1)), 1);
    assert_eq!(messages(&mut sub), vec!["w:30".to_owned()]);
    assert_eq!(queued(&r.fair(&token(3), "40", 0, 3_000, 10).unwrap()).1, 4);
    assert_eq!(withdraw(&mut r, "30"), 1, "first while the key is free");
    assert_eq!(messages(&mut sub), vec!["w:40".to_owned()]);
    assert_eq!(withdraw(&mut r, "nobody"), 0);
    // A writer's intent still wakes everyone: readers it kept out may enter.
    fence(&r.write(&token(5), 10_000, "", 0));
    assert!(held > 0);
    assert!(refused(&r.write(&token(6), 10_000, "writer-6", 5_000)).0 > 0);
    assert_eq!(withdraw(&mut r, "writer-6"), 1);
    assert_eq!(messages(&mut sub), vec![String::new()]);
}
