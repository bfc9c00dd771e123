//! Binaries and loopback port allocation.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Default port range when `REDLOCK_TEST_PORTS` is unset or malformed.
const DEFAULT_PORTS: (u16, u16) = (20000, 29999);

/// The `redis-server` binary: env `REDLOCK_REDIS_SERVER`, else `redis-server` (looked up on `PATH`).
pub fn redis_server_bin() -> String {
    match std::env::var("REDLOCK_REDIS_SERVER") {
        Ok(s) if !s.trim().is_empty() => s,
        _ => "redis-server".to_owned(),
    }
}

/// The `redis-cli` binary: env `REDLOCK_REDIS_CLI`; else `redis-cli` in the same directory as
/// [`redis_server_bin`] when that is a path with a directory; else `redis-cli` (on `PATH`).
pub fn redis_cli_bin() -> String {
    if let Ok(s) = std::env::var("REDLOCK_REDIS_CLI") {
        if !s.trim().is_empty() {
            return s;
        }
    }
    let server = redis_server_bin();
    if let Some(dir) = Path::new(&server).parent() {
        if !dir.as_os_str().is_empty() {
            let cli = dir.join("redis-cli");
            if cli.exists() {
                return cli.to_string_lossy().into_owned();
            }
        }
    }
    "redis-cli".to_owned()
}

/// Whether [`redis_server_bin`] can be executed (`redis-server --version` exits successfully).
///
/// The answer is computed once per process. Tests use it to skip, with a message, on machines
/// without Redis.
pub fn redis_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new(redis_server_bin())
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

/// Parses `LOW-HIGH` into an inclusive, non-empty range of non-zero ports.
fn parse_range(s: &str) -> Option<(u16, u16)> {
    let (lo, hi) = s.trim().split_once('-')?;
    let lo: u16 = lo.trim().parse().ok()?;
    let hi: u16 = hi.trim().parse().ok()?;
    (lo > 0 && lo <= hi).then_some((lo, hi))
}

/// The allocator's range and the per-process start offset, computed once.
fn range_and_start() -> (u16, u16, u32) {
    static STATE: OnceLock<(u16, u16, u32)> = OnceLock::new();
    *STATE.get_or_init(|| {
        let (lo, hi) = std::env::var("REDLOCK_TEST_PORTS")
            .ok()
            .and_then(|s| parse_range(&s))
            .unwrap_or(DEFAULT_PORTS);
        let span = u32::from(hi - lo) + 1;
        // Spread processes over the range: consecutive pids land far apart, so test binaries
        // running in parallel rarely walk over the same ports.
        let start = (std::process::id().wrapping_mul(7919)) % span;
        (lo, hi, start)
    })
}

/// A free loopback TCP port from the process-wide allocator.
///
/// The allocator is an atomic cursor over the range in `REDLOCK_TEST_PORTS` (`LOW-HIGH`,
/// default `20000-29999`), starting at an offset derived from the process id. Ports where
/// `TcpListener::bind(127.0.0.1:p)` fails are skipped. A port is never handed out twice by one
/// process until the cursor wraps around the whole range.
///
/// "Free" is only a hint: another process may take the port before the server binds it, so the
/// spawners in this crate retry on the next port when `redis-server` exits with
/// "Address already in use".
///
/// # Panics
///
/// When no port of the range can be bound after one full sweep.
pub fn free_port() -> u16 {
    static CURSOR: AtomicU32 = AtomicU32::new(0);
    let (lo, hi, start) = range_and_start();
    let span = u32::from(hi - lo) + 1;
    for _ in 0..span {
        let i = CURSOR.fetch_add(1, Ordering::Relaxed);
        let offset = (start.wrapping_add(i)) % span;
        // offset < span <= 65535, and lo + offset <= hi.
        let port = lo + offset as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("redlock-testkit: no free port in {lo}-{hi} (REDLOCK_TEST_PORTS)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges() {
        assert_eq!(parse_range("100-200"), Some((100, 200)));
        assert_eq!(parse_range(" 7 - 7 "), Some((7, 7)));
        assert_eq!(parse_range("200-100"), None);
        assert_eq!(parse_range("0-10"), None);
        assert_eq!(parse_range("x"), None);
    }

    #[test]
    fn free_ports_are_distinct_and_in_range() {
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len());
        let (lo, hi, _) = range_and_start();
        assert!(ports.iter().all(|p| (lo..=hi).contains(p)));
    }
}
