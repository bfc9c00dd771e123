//! CPU time of this process (getrusage) and of a server (/proc/PID/stat), and the
//! server's per-command call counts (`INFO commandstats`).

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::raw::{err, Res};

/// User + system CPU time of this process.
pub fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU time of process `pid` (clock-tick resolution, usually 10 ms).
pub fn proc_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name (field 2) may contain spaces: count fields after its ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': f[0] is field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz as f64)
}

/// Calls and server time of one command, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommandStat {
    pub calls: u64,
    /// Microseconds the server spent in it (a script's nested `redis.call`s included).
    pub usec: u64,
}

/// `INFO commandstats` as command → calls and time.
pub async fn command_times(con: &mut MultiplexedConnection) -> Res<HashMap<String, CommandStat>> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .map_err(err)?;
    Ok(parse_commandstats(&text))
}

/// The `cmdstat_<name>:calls=..,usec=..,...` lines of `INFO commandstats`.
fn parse_commandstats(text: &str) -> HashMap<String, CommandStat> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let stat = CommandStat {
            calls: field("calls="),
            usec: field("usec="),
        };
        out.insert(name.to_owned(), stat);
    }
    out
}

/// `INFO commandstats` as command → calls.
pub async fn commandstats(con: &mut MultiplexedConnection) -> Res<HashMap<String, u64>> {
    Ok(command_times(con)
        .await?
        .into_iter()
        .map(|(name, stat)| (name, stat.calls))
        .collect())
}

/// Calls per command between two snapshots, without the benchmark's own `INFO`s.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> HashMap<String, u64> {
    after
        .iter()
        .filter(|(k, _)| k.as_str() != "info")
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_seen_by_getrusage_and_proc_stat() {
        let c0 = self_cpu();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until 30 ms of CPU time were used (bounded by 10 s of wall time).
        while self_cpu() - c0 < Duration::from_millis(30) && t.elapsed() < Duration::from_secs(10) {
            for _ in 0..10_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
        }
        assert!(x > 0);
        assert!(self_cpu() - c0 >= Duration::from_millis(30));
        // Cumulative since the process started, at clock-tick resolution.
        assert!(proc_cpu(std::process::id()) >= Duration::from_millis(20));
    }

    #[test]
    fn commandstats_lines_give_calls_and_time() {
        let text = "# Commandstats\r\ncmdstat_set:calls=3,usec=12,usec_per_call=4.00,rejected_calls=0,failed_calls=0\r\ncmdstat_evalsha:calls=2,usec=21,usec_per_call=10.50\r\n";
        let stats = parse_commandstats(text);
        assert_eq!(stats["set"], CommandStat { calls: 3, usec: 12 });
        assert_eq!(stats["evalsha"], CommandStat { calls: 2, usec: 21 });
        assert_eq!(stats.len(), 2);
    }

    #[test]
    fn commandstats_deltas_skip_info() {
        let before = HashMap::from([("get".to_owned(), 5), ("info".to_owned(), 1)]);
        let after = HashMap::from([
            ("get".to_owned(), 7),
            ("info".to_owned(), 3),
            ("evalsha".to_owned(), 4),
        ]);
        let d = delta(&before, &after);
        assert_eq!(d.get("get"), Some(&2));
        assert_eq!(d.get("evalsha"), Some(&4));
        assert!(!d.contains_key("info"));
    }
}
