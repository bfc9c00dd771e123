//! `redlock`: who holds what, for operators of `redlock-guard` locks on Redis.
//!
//! `list [PATTERN]`, `inspect KEY`, `release KEY` (forced, logged, confirmed unless
//! `--yes`) and `watch KEY`, on one server, a Redis Cluster (`--cluster`), Redlock
//! nodes (`--redlock`) or the master Sentinels name (`--sentinel NAME`); a table for people, `--json` for scripts. Exit codes are in
//! [`Exit`].
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod output;
mod watch;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redlock::{LockError, LockManager, DEFAULT_PREFIX};

use output::Released;

/// The exit codes, for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Done (`list` found nothing: still 0).
    Ok = 0,
    /// `inspect` or `release`: nothing is held under that key (or the release was not
    /// confirmed, or another grant than the one shown holds it now).
    NotFound = 1,
    /// Bad arguments (clap's own errors exit 2 too).
    Usage = 2,
    /// Redis could not be reached or failed.
    Backend = 3,
}

const AFTER_HELP: &str = "\
Exit codes: 0 ok; 1 nothing held under KEY (inspect, release), release not confirmed, or
not released because another holder took KEY after it was shown; 2 usage error;
3 connection or Redis error.
KEY is the full Redis key as `list` prints it (prefix included); a key without the
prefix gets it.";

/// Who holds what: list, inspect, force-release and watch redlock locks.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Where the locks are, and how to print them.
#[derive(Debug, Args)]
struct Global {
    /// Redis URL (`redis://`, `rediss://`, with `user:password@`); repeat it for the
    /// nodes of `--cluster` or `--redlock`, or the Sentinels of `--sentinel`.
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    url: Vec<String>,
    /// The URLs are Redis Cluster nodes (every master is scanned).
    #[arg(long, global = true, conflicts_with_all = ["redlock", "sentinel"])]
    cluster: bool,
    /// The URLs are independent Redlock masters (a quorum decides).
    #[arg(long, global = true, conflicts_with = "sentinel")]
    redlock: bool,
    /// The URLs are Sentinels watching the master of this name (its locks are shown).
    #[arg(long, global = true, value_name = "MASTER")]
    sentinel: Option<String>,
    /// The prefix the applications lock under.
    #[arg(long, global = true, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// JSON for scripts instead of a table (one object per line for `watch`).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Held locks: key, kind, holders, ttl left, fencing token, owner, held for.
    List {
        /// A Redis glob on the key after the prefix (`*`, `?`, `[..]`).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// One lock in detail; exit code 1 when nothing holds it.
    Inspect {
        /// The lock's full key, as `list` prints it.
        key: String,
    },
    /// Force-release a lock whoever holds it (its holder sees the loss at its next
    /// renewal, its waiters are woken); logged on stderr.
    Release {
        /// The lock's full key, as `list` prints it.
        key: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// A line per grant, release and expiry of a lock, as they happen.
    Watch {
        /// The lock's full key, as `list` prints it.
        key: String,
        /// Stop after this long (`500ms`, `30s`, `5m`, `1h`); default: until Ctrl-C.
        #[arg(long = "for", value_parser = parse_duration)]
        duration: Option<Duration>,
        /// How often to look when no notification comes (10ms ..= 10s; at least 1s on
        /// Redlock, where looking at a key held by nobody scans every node for permit
        /// places).
        #[arg(long, default_value = "100ms", value_parser = parse_interval)]
        interval: Duration,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `rediss://`: the crypto provider the library leaves to the application.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("redlock: cannot start: {e}");
            return ExitCode::from(Exit::Backend as u8);
        }
    };
    let exit = runtime.block_on(run(cli));
    ExitCode::from(exit as u8)
}

async fn run(cli: Cli) -> Exit {
    let Global {
        url,
        cluster,
        redlock,
        sentinel,
        prefix,
        json,
    } = cli.global;
    let single = !cluster && !redlock && sentinel.is_none();
    if url.len() > 1 && single {
        eprintln!("redlock: several --url need --cluster, --redlock or --sentinel");
        return Exit::Usage;
    }
    let builder = LockManager::builder().prefix(prefix.as_str());
    let builder = match (cluster, redlock, sentinel) {
        (true, _, _) => builder.cluster(&url),
        (_, true, _) => builder.redlock(&url),
        (_, _, Some(master)) => builder.sentinel(master, &url),
        _ => builder.single(url.first().map_or("", String::as_str)),
    };
    let locks = match builder.build().await {
        Ok(locks) => locks,
        Err(e) => return failed(&e),
    };
    let user_key = |key: &str| key.strip_prefix(prefix.as_str()).unwrap_or(key).to_owned();
    match cli.command {
        Command::List { pattern } => match locks.list(&pattern).await {
            Ok(found) => {
                output::list(&found, json);
                Exit::Ok
            }
            Err(e) => failed(&e),
        },
        Command::Inspect { key } => match locks.inspect(&user_key(&key)).await {
            Ok(info) => {
                output::inspect(&key, info.as_ref(), json);
                if info.is_some() {
                    Exit::Ok
                } else {
                    Exit::NotFound
                }
            }
            Err(e) => failed(&e),
        },
        Command::Release { key, yes } => release(&locks, &user_key(&key), &key, yes, json).await,
        Command::Watch {
            key,
            duration,
            interval,
        } => {
            // One server: its wake-up channel and keyspace events speed the looks up.
            let notify = single.then(|| url[0].as_str());
            watch::run(&locks, &user_key(&key), duration, interval, json, notify).await
        }
    }
}

/// `release`: shows the lock, asks (unless `yes`), force-releases it and says who did.
async fn release(locks: &LockManager, key: &str, shown: &str, yes: bool, json: bool) -> Exit {
    let info = match locks.inspect(key).await {
        Ok(Some(info)) => info,
        Ok(None) => {
            eprintln!("redlock: nothing holds {}", output::shown(shown));
            return Exit::NotFound;
        }
        Err(e) => return failed(&e),
    };
    if !yes {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "redlock: not a terminal to confirm on; pass --yes to release {}",
                output::shown(shown)
            );
            return Exit::Usage;
        }
        eprint!(
            "{}\nForce-release it? Its holder loses it. [y/N] ",
            output::shown(&info.to_string())
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("redlock: not released");
            return Exit::NotFound;
        }
    }
    // Only the grant shown: one that took the key during the prompt keeps it.
    let outcome = match locks.force_unlock_if_unchanged(&info).await {
        Ok(true) => Released::Yes,
        Ok(false) => match locks.inspect(key).await {
            Ok(Some(now)) => Released::Changed(now),
            Ok(None) => Released::Free,
            Err(e) => return failed(&e),
        },
        Err(e) => return failed(&e),
    };
    if matches!(outcome, Released::Yes) {
        let (user, host, pid) = output::operator();
        eprintln!(
            "redlock: force-released {} (held by {}) by {} on {}, pid {pid}",
            output::shown(&info.key),
            output::owner(&info),
            output::shown(&user),
            output::shown(&host)
        );
    }
    output::released(&info, &outcome, json);
    match outcome {
        Released::Yes => Exit::Ok,
        Released::Free | Released::Changed(_) => Exit::NotFound,
    }
}

/// Reports a library error on stderr, each cause once: its exit code (bad input is a
/// usage error).
fn failed(e: &LockError) -> Exit {
    eprintln!("redlock: {}", output::shown(&e.report().to_string()));
    match e {
        LockError::InvalidKey { .. } | LockError::InvalidOption { .. } => Exit::Usage,
        _ => Exit::Backend,
    }
}

/// `500ms`, `30s`, `5m`, `1h` (a number alone is seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 30s, 5m or 1h"))?;
    let unit = match &s[digits.len()..] {
        "ms" => Duration::from_millis(1),
        "s" | "" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        other => return Err(format!("unknown unit {other:?} (ms, s, m, h)")),
    };
    unit.checked_mul(u32::try_from(n).map_err(|_| format!("{s:?} is too long"))?)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A `--interval`: a duration within 10 ms ..= 10 s.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if (Duration::from_millis(10)..=Duration::from_secs(10)).contains(&d) {
        Ok(d)
    } else {
        Err(format!("{s:?} is outside 10ms ..= 10s"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_or_say_why_not() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        for bad in ["", "s", "1.5s", "10d", "-1s", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_interval("1ms").is_err() && parse_interval("1s").is_ok());
    }
}
