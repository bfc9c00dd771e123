//! Scenario 9: least privilege and foreign clients.
//!
//! * The library works under an ACL user limited to its key prefix, its channels and the
//!   commands it sends ([`ACL_COMMANDS`], the line documented in docs/acl.md): a
//!   workload that exercises every code path (acquire, notified waiting, watchdog
//!   renewals, extend, release, `is_locked`, `force_unlock`, `min_replicas`, recovery
//!   after `SCRIPT FLUSH`) runs without a single `ACL LOG` entry: on one server, a
//!   cluster, and a Sentinel set (data nodes and Sentinels).
//! * Each command of the line is needed: with it removed, the workload fails or the
//!   server logs a denial. (On Redis 7.2+ redis-rs also sends `CLIENT SETINFO` when it
//!   connects and ignores its failure: `+client|setinfo` keeps `ACL LOG` clean there; Redis
//!   7.0, which the suite runs on, does not have the command and rejects the rule.)
//! * A client that knows the key but not the 128-bit token can neither release nor extend
//!   the lock through the library's compare-token scripts, even with the same ACL user.
//!   A client of a user restricted to another prefix cannot touch the lock at all.

use std::collections::HashMap;
use std::time::Duration;

use redis::{AsyncCommands, Value};
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{RedisCluster, RedisServer, Sentinels};

use crate::support::{require_redis, HEAVY};

/// Every command the library sends, as ACL rules: the scripts' commands are checked
/// against the caller's ACL too (`get set incr decr del pexpire pttl publish`, and for
/// readers, permits and writer intents `time` and the sorted-set commands), and `INFO`
/// reads `maxmemory-policy` at connect.
const ACL_COMMANDS: &[&str] = &[
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+set",
    "+incr",
    "+decr",
    "+del",
    "+pexpire",
    "+pttl",
    "+publish",
    "+exists",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+wait",
    "+info",
    // The other kinds of lock: holders and writer intents are sorted sets whose scores
    // are the server's clock (`TIME`); a writer that gives up withdraws its intent.
    "+time",
    "+zadd",
    "+zrem",
    "+zremrangebyscore",
    "+zrange",
    "+zcount",
    "+zscore",
];

/// The same for a Redis Cluster: sharded pub/sub instead of pub/sub, and the slot map.
const ACL_CLUSTER_COMMANDS: &[&str] = &[
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+set",
    "+incr",
    "+decr",
    "+del",
    "+pexpire",
    "+pttl",
    "+spublish",
    "+exists",
    "+ssubscribe",
    "+sunsubscribe",
    "+ping",
    "+wait",
    "+cluster|slots",
    "+client|info",
    "+info",
    "+time",
    "+zadd",
    "+zrem",
    "+zremrangebyscore",
    "+zrange",
    "+zcount",
    "+zscore",
];

/// Under Sentinel: the data nodes' line gains `ROLE` (the manager checks the master it is
/// named); each Sentinel is asked `SENTINEL MASTER` and heard on `+switch-master`.
const ACL_SENTINEL_DATA_EXTRA: &str = "+role";
const ACL_SENTINEL_COMMANDS: &[&str] = &["+sentinel|master", "+subscribe"];
const ACL_SENTINEL_PATTERNS: &[&str] = &["&+switch-master"];

/// Keys and channels of the default prefix `lock:`: lock keys and the fencing counters
/// (`lock:fence:{<slot tag>}`) `lock:*`, and wake-up channels named after lock keys.
const ACL_PATTERNS: &[&str] = &["~lock:*", "&lock:*"];

/// The documented line (without the password).
fn acl_line(user: &str, commands: &[&str]) -> Vec<String> {
    acl_line_of(user, ACL_PATTERNS, commands)
}

fn acl_line_of(user: &str, patterns: &[&str], commands: &[&str]) -> Vec<String> {
    let mut line: Vec<String> = ["ACL", "SETUSER", user, "reset", "on", ">pw"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    line.extend(patterns.iter().map(|s| (*s).to_owned()));
    line.push("-@all".to_owned());
    line.extend(commands.iter().map(|s| (*s).to_owned()));
    line
}

fn admin(server: &RedisServer, args: &[String]) -> Value {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    server.cmd_sync(&args).expect("admin command")
}

/// How the workload's managers reach the data servers.
#[derive(Clone, Copy)]
enum Via<'a> {
    Single,
    Cluster,
    /// Through the set's Sentinels, found as the set's master.
    Sentinels(&'a Sentinels),
}

/// A manager of `user` on `servers`, reached `via` one of them, a cluster of them or
/// Sentinels (ttl 150 ms, so the workload sees renewals).
async fn manager(
    servers: &[&RedisServer],
    via: Via<'_>,
    user: &str,
) -> Result<LockManager, LockError> {
    let url = |s: &RedisServer| format!("redis://{user}:pw@127.0.0.1:{}", s.port());
    let b = match via {
        Via::Single => LockManager::builder().single(url(servers[0])),
        Via::Cluster => LockManager::builder().cluster(servers.iter().map(|s| url(s))),
        Via::Sentinels(set) => {
            LockManager::builder().sentinel(set.master_name(), set.sentinels().iter().map(url))
        }
    };
    b.default_ttl(Duration::from_millis(150))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
}

/// Names what failed in an `Err` of the workload.
fn e(what: &str) -> impl Fn(LockError) -> String {
    let what = what.to_owned();
    move |e: LockError| format!("{what}: {e:?}")
}

/// The whole workload as `user`: the part that may run beside others, then the one that
/// must run alone.
async fn full_workload(
    servers: &[&RedisServer],
    via: Via<'_>,
    user: &str,
    tag: &str,
) -> Result<(), String> {
    workload(servers, via, user, tag).await?;
    after_script_flush(servers, via, user, tag).await
}

/// Runs every code path of the library but the script-cache recovery as `user` on
/// `servers` (the data nodes), reached `via` one of them, a cluster of them, or Sentinels;
/// `Err` names the first thing that failed.
async fn workload(
    servers: &[&RedisServer],
    via: Via<'_>,
    user: &str,
    tag: &str,
) -> Result<(), String> {
    // A cluster's masters and the Sentinel set's master have a replica each.
    let replicated = !matches!(via, Via::Single);
    let a = manager(servers, via, user).await.map_err(e("connect"))?;
    let b = manager(servers, via, user).await.map_err(e("connect"))?;
    let tagged = format!("acl_{{{tag}}}");
    let untagged = format!("acljobs{tag}");
    a.lock(&tagged)
        .await
        .map_err(e("lock"))?
        .release()
        .await
        .map_err(e("release"))?;
    a.lock(&untagged)
        .await
        .map_err(e("lock untagged"))?
        .release()
        .await
        .map_err(e("release untagged"))?;
    // Notified waiting: b subscribes and is woken by a's release.
    let g = a.lock(&tagged).await.map_err(e("lock"))?;
    let (b2, k2) = (b.clone(), tagged.clone());
    let waiter = tokio::spawn(async move {
        b2.lock_with(&k2, LockOptions::new().wait(Duration::from_secs(5)))
            .await
            .map(drop)
    });
    // Watchdog renewals (ttl 150 ms) while b waits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    if !g.is_held() {
        return Err("renewal failed".into());
    }
    g.extend(Duration::from_millis(300))
        .await
        .map_err(e("extend"))?;
    if !a.is_locked(&tagged).await.map_err(e("is_locked"))? {
        return Err("is_locked false".into());
    }
    g.release().await.map_err(e("release"))?;
    waiter
        .await
        .map_err(|e| e.to_string())?
        .map_err(e("notified waiter"))?;
    // Operator tool.
    let _g = a.lock(&tagged).await.map_err(e("lock"))?;
    if !b.force_unlock(&tagged).await.map_err(e("force_unlock"))? {
        return Err("force_unlock found nothing".into());
    }
    // min_replicas: WAIT; on one server (no replica) then the release of a lock no
    // replica acknowledged. The ttl sets the WAIT's bound (ttl/10): the manager's 150 ms
    // gave a replica 15 ms to acknowledge, which a loaded machine missed one run in ten.
    let replicas = LockOptions::new()
        .min_replicas(1)
        .ttl(Duration::from_secs(5));
    match a.lock_with(&untagged, replicas).await {
        Err(LockError::ReplicasUnavailable { .. }) if !replicated => {}
        Ok(g) if replicated => g.release().await.map_err(e("release min_replicas"))?,
        other => return Err(format!("min_replicas: {other:?}")),
    }
    if b.try_lock(&untagged)
        .await
        .map_err(e("try_lock"))?
        .is_none()
    {
        return Err("the lock of a failed min_replicas acquire was left".into());
    }
    // The other kinds. A writer waits behind a reader (its intent registered, then
    // withdrawn by its grant); the reader extends and releases.
    let reader = a.read(&tagged).await.map_err(e("read"))?;
    let (b2, k2) = (b.clone(), tagged.clone());
    let writer = tokio::spawn(async move {
        b2.write_with(&k2, LockOptions::new().wait(Duration::from_secs(5)))
            .await
            .map(drop)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    reader
        .extend(Duration::from_millis(300))
        .await
        .map_err(e("extend read"))?;
    reader.release().await.map_err(e("release read"))?;
    writer
        .await
        .map_err(|e| e.to_string())?
        .map_err(e("writer behind a reader"))?;
    // A writer that gives up withdraws its intent.
    let reader = a.read(&tagged).await.map_err(e("read"))?;
    match b
        .write_with(&tagged, LockOptions::new().wait(Duration::from_millis(200)))
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => return Err(format!("writer giving up: {other:?}")),
    }
    reader.release().await.map_err(e("release read"))?;
    // Permits: the count is checked, a place renewed and released.
    let permit = a.permit(&untagged, 1).await.map_err(e("permit"))?;
    if b.try_permit(&untagged, 1)
        .await
        .map_err(e("try_permit"))?
        .is_some()
    {
        return Err("a second permit of 1".into());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    permit.release().await.map_err(e("release permit"))?;
    // A fair lock: a waiter queued behind it, woken by the release; one that gives up
    // withdraws its place. And a leadership, resigned.
    let fair = a.fair(&tagged).await.map_err(e("fair"))?;
    let queued = {
        let (b, key) = (b.clone(), tagged.clone());
        tokio::spawn(async move {
            b.fair_with(&key, LockOptions::new().wait(Duration::from_secs(5)))
                .await
        })
    };
    match a
        .fair_with(&tagged, LockOptions::new().wait(Duration::from_millis(200)))
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => return Err(format!("fair waiter giving up: {other:?}")),
    }
    fair.release().await.map_err(e("release fair"))?;
    queued
        .await
        .map_err(|e| e.to_string())?
        .map_err(e("fair waiter behind a holder"))?
        .release()
        .await
        .map_err(e("release fair waiter"))?;
    let leader = a
        .leader(&format!("acl_{{{tag}}}"))
        .await
        .map_err(e("leader"))?;
    leader.resign().await.map_err(e("resign"))?;
    // Several keys at once, and hold_at_least.
    let both = [tagged.clone(), format!("acl2_{{{tag}}}")];
    a.lock_all(&both)
        .await
        .map_err(e("lock_all"))?
        .release()
        .await
        .map_err(e("release lock_all"))?;
    a.lock_with(
        &tagged,
        LockOptions::new().hold_at_least(Duration::from_millis(100)),
    )
    .await
    .map_err(e("lock hold_at_least"))?
    .release()
    .await
    .map_err(e("release hold_at_least"))?;
    Ok(())
}

/// The workload's last part, run while no other workload runs (the script cache is the
/// server's, shared by every user): recovery from an empty script cache (the `EVAL`
/// fallback, `SCRIPT LOAD` before renewals).
async fn after_script_flush(
    servers: &[&RedisServer],
    via: Via<'_>,
    user: &str,
    tag: &str,
) -> Result<(), String> {
    let a = manager(servers, via, user).await.map_err(e("connect"))?;
    let tagged = format!("acl_{{{tag}}}");
    let flush = || {
        for s in servers {
            let _ = s.cmd_sync(&["SCRIPT", "FLUSH"]);
        }
    };
    flush();
    let g = a.lock(&tagged).await.map_err(e("lock after flush"))?;
    flush();
    tokio::time::sleep(Duration::from_millis(250)).await;
    if !g.is_held() {
        return Err("renewal after flush failed".into());
    }
    g.release().await.map_err(e("release after flush"))?;
    Ok(())
}

/// `ACL LOG` entries per user on all `servers`: the denied commands (`object`).
fn acl_log(servers: &[&RedisServer]) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let mut entries: Vec<HashMap<String, Value>> = Vec::new();
    for server in servers {
        let log: Vec<HashMap<String, Value>> =
            redis::from_redis_value(server.cmd_sync(&["ACL", "LOG", "1000"]).unwrap()).unwrap();
        entries.extend(log);
    }
    for entry in entries {
        let text = |k: &str| {
            entry
                .get(k)
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                .unwrap_or_default()
        };
        out.entry(text("username")).or_default().push(format!(
            "{} {}",
            text("reason"),
            text("object")
        ));
    }
    out
}

/// Reports the workload's run without the rule `omitted`: the rule was needed when the
/// workload failed or a denial was logged.
fn needed(name: &str, omitted: &str, result: &Result<(), String>, denials: usize) -> bool {
    println!(
        "s9 ACL {name} without {omitted}: workload {}, {denials} denials logged",
        match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("FAILED ({})", e.chars().take(120).collect::<String>()),
        }
    );
    result.is_err() || denials > 0
}

/// Sets up `user` on every server with `commands`.
fn set_user(servers: &[&RedisServer], user: &str, commands: &[&str]) {
    for s in servers {
        admin(s, &acl_line(user, commands));
    }
}

/// The workload passes under `commands` with no denial; without any one of them it fails
/// or a denial is logged. Returns the report lines.
async fn least_privilege(servers: &[&RedisServer], via: Via<'_>, name: &str, commands: &[&str]) {
    for s in servers {
        s.cmd_sync(&["CONFIG", "SET", "acllog-max-len", "10000"])
            .unwrap();
        s.cmd_sync(&["ACL", "LOG", "RESET"]).unwrap();
    }
    set_user(servers, "locker", commands);
    let result = full_workload(servers, via, "locker", "full").await;
    let log = acl_log(servers);
    println!(
        "s9 ACL {name}: `ACL SETUSER locker on >… {} -@all {}`: workload {:?}, ACL LOG {:?}",
        ACL_PATTERNS.join(" "),
        commands.join(" "),
        result,
        log.get("locker")
    );
    result.expect("the workload under the minimal ACL");
    assert!(!log.contains_key("locker"), "denials: {log:?}");

    // Each rule is needed: without it the workload fails or a denial is logged.
    let mut runs = Vec::new();
    for (i, omitted) in commands.iter().enumerate() {
        let rest: Vec<&str> = commands.iter().copied().filter(|c| c != omitted).collect();
        let user = format!("minus{i}");
        set_user(servers, &user, &rest);
        runs.push((user, *omitted));
    }
    let mut results = futures::future::join_all(
        runs.iter()
            .map(|(user, _)| workload(servers, via, user, user)),
    )
    .await;
    // One at a time: another user's SCRIPT LOAD would refill the cache this one emptied
    // (CI once saw `+eval` unneeded that way).
    for ((user, _), result) in runs.iter().zip(results.iter_mut()) {
        if result.is_ok() {
            *result = after_script_flush(servers, via, user, user).await;
        }
    }
    let log = acl_log(servers);
    let mut unneeded = Vec::new();
    for ((user, omitted), result) in runs.iter().zip(results) {
        let denials = log.get(user).map_or(0, Vec::len);
        if !needed(name, omitted, &result, denials) {
            unneeded.push(*omitted);
        }
    }
    assert!(
        unneeded.is_empty(),
        "{name}: rules the library never needed: {unneeded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_least_privilege_acl() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    least_privilege(&[&server], Via::Single, "single", ACL_COMMANDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_least_privilege_acl_cluster() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let cluster = tokio::task::block_in_place(RedisCluster::start_default);
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    least_privilege(&nodes, Via::Cluster, "cluster", ACL_CLUSTER_COMMANDS).await;
}

/// Under Sentinel: the data nodes' line (every rule needed, `+role` too) with the
/// Sentinels' line for every user; then the Sentinels' rules, each needed as well (without
/// `+subscribe` the manager still follows failovers by asking, but the refusal is logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_least_privilege_acl_sentinel() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let set = tokio::task::block_in_place(Sentinels::start);
    let data = [set.master(), set.replica()];
    let sentinels: Vec<&RedisServer> = set.sentinels().iter().collect();
    let sentinel_user = |user: &str, commands: &[&str]| {
        for s in &sentinels {
            admin(s, &acl_line_of(user, ACL_SENTINEL_PATTERNS, commands));
        }
    };
    for s in &sentinels {
        s.cmd_sync(&["ACL", "LOG", "RESET"]).unwrap();
    }
    let data_commands: Vec<&str> = ACL_COMMANDS
        .iter()
        .copied()
        .chain([ACL_SENTINEL_DATA_EXTRA])
        .collect();
    // Every user least_privilege makes on the data nodes gets the whole Sentinel line.
    sentinel_user("locker", ACL_SENTINEL_COMMANDS);
    for i in 0..data_commands.len() {
        sentinel_user(&format!("minus{i}"), ACL_SENTINEL_COMMANDS);
    }
    let via = Via::Sentinels(&set);
    least_privilege(&data, via, "sentinel data nodes", &data_commands).await;
    let log = acl_log(&sentinels);
    assert!(!log.contains_key("locker"), "Sentinel denials: {log:?}");

    let mut unneeded = Vec::new();
    for (i, omitted) in ACL_SENTINEL_COMMANDS.iter().enumerate() {
        let user = format!("sentinelminus{i}");
        let rest: Vec<&str> = ACL_SENTINEL_COMMANDS
            .iter()
            .copied()
            .filter(|c| c != omitted)
            .collect();
        sentinel_user(&user, &rest);
        set_user(&data, &user, &data_commands);
        let result = full_workload(&data, via, &user, &user).await;
        let denials = acl_log(&sentinels).get(&user).map_or(0, Vec::len);
        if !needed("sentinel (the Sentinels' line)", omitted, &result, denials) {
            unneeded.push(*omitted);
        }
    }
    assert!(
        unneeded.is_empty(),
        "Sentinel rules the library never needed: {unneeded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_foreign_clients_can_neither_release_nor_extend() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    admin(&server, &acl_line("locker", ACL_COMMANDS));
    let stranger_acl = [
        "ACL", "SETUSER", "stranger", "reset", "on", ">pw", "~other:*", "&other:*", "+@all",
    ];
    admin(&server, &stranger_acl.map(String::from));
    let port = server.port();
    let locks = LockManager::connect(&format!("redis://locker:pw@127.0.0.1:{port}"))
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let g = locks
        .lock_with("owned_{7}", LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .unwrap();
    let key = "lock:owned_{7}";
    // The same ACL user, the key known, the token guessed: the library's own scripts.
    let same_user = redis::Client::open(format!("redis://locker:pw@127.0.0.1:{port}")).unwrap();
    let mut raw = same_user.get_multiplexed_async_connection().await.unwrap();
    let token: Vec<u8> = raw.get(key).await.unwrap();
    let release = redis::Script::new(include_str!(
        "../../redlock-runtime/src/scripts/release.lua"
    ));
    let extend = redis::Script::new(include_str!("../../redlock-runtime/src/scripts/extend.lua"));
    let mut near = token.clone();
    if let Some(b) = near.last_mut() {
        *b ^= 1;
    }
    let guesses: Vec<Vec<u8>> = vec![vec![0u8; 16], near, b"owned".to_vec(), Vec::new()];
    let mut refused = 0;
    for guess in &guesses {
        let released: i64 = release
            .key(key)
            .arg(guess.as_slice())
            .arg("PUBLISH")
            .invoke_async(&mut raw)
            .await
            .unwrap();
        let extended: i64 = extend
            .key(key)
            .arg(guess.as_slice())
            .arg(3_600_000)
            .invoke_async(&mut raw)
            .await
            .unwrap();
        assert_eq!((released, extended), (-1, 0), "a guessed token worked");
        refused += 2;
    }
    let pttl: i64 = raw.pttl(key).await.unwrap();
    let still: Vec<u8> = raw.get(key).await.unwrap();
    assert_eq!(still, token, "the lock changed hands");
    assert!(pttl > 0 && pttl <= 30_000, "the ttl was extended: {pttl}");
    // Another manager (another token) cannot take it either.
    let foreign = LockManager::connect(&format!("redis://locker:pw@127.0.0.1:{port}"))
        .await
        .unwrap();
    assert!(foreign.try_lock("owned_{7}").await.unwrap().is_none());
    // A user restricted to another prefix cannot even read it.
    let stranger = redis::Client::open(format!("redis://stranger:pw@127.0.0.1:{port}")).unwrap();
    let mut s = stranger.get_multiplexed_async_connection().await.unwrap();
    let read: redis::RedisResult<Option<Vec<u8>>> = s.get(key).await;
    let del: redis::RedisResult<i64> = s.del(key).await;
    let noperm = |e: Option<&redis::RedisError>| e.is_some_and(|e| e.code() == Some("NOPERM"));
    assert!(
        noperm(read.as_ref().err()) && noperm(del.as_ref().err()),
        "{read:?} {del:?}"
    );
    assert!(g.is_held());
    g.release().await.unwrap();
    println!(
        "s9 foreign clients: {refused} release/extend attempts with guessed tokens (zero, one bit \
         off, the key's name, empty) by a client of the same ACL user all refused, ttl \
         untouched ({pttl} ms left of 30 s); another manager's try_lock -> None; a user limited \
         to other:* -> NOPERM on GET and DEL. (A client of the same ACL user can still DEL the \
         key outright: ACLs scope prefixes and commands, the token scopes ownership.)"
    );
}
