//! What the commands print: a table or lines for people, JSON for scripts.

use std::time::{Duration, UNIX_EPOCH};

use redlock::LockInfo;
use serde_json::{json, Value};

/// A lock as JSON: every field of [`LockInfo`], times in milliseconds.
pub(crate) fn to_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "kind": info.kind.to_string(),
        "holders": info.holders,
        "kept": info.kept,
        "queued": info.queued,
        "ttl_ms": info.ttl.map(ms),
        "fencing_token": info.fencing_token,
        "host": info.host,
        "pid": info.pid,
        "acquired_at_ms": info
            .acquired_at
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(ms),
        "held_for_ms": info.held_for.map(ms),
        "holder": info.holder,
        "shared": info.shared.iter().map(|h| json!({
            "name": h.name,
            "ttl_ms": h.ttl.map(ms),
            "kept": h.kept,
            "fencing_token": h.fencing_token,
        })).collect::<Vec<_>>(),
    })
}

/// `text` made safe for a terminal: control characters (a newline in a key would forge
/// a table row, an ESC would reach the operator's terminal) and the Unicode controls
/// that reorder or hide what is shown (bidirectional overrides, zero-width characters)
/// are written as escapes (`\n`, `\u{1b}`, `\u{202e}`). `--json` prints every string
/// exactly, escaped by JSON's rules.
pub(crate) fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || hides(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Format characters that change how the text around them is shown.
fn hides(c: char) -> bool {
    matches!(c,
        '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{feff}')
}

/// A time since the Unix epoch as `2026-11-26 18:16:35.123 UTC`.
pub(crate) fn utc(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's `civil_from_days`.
    let z = i64::try_from(days).unwrap_or(i64::MAX / 2) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03} UTC",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since_epoch.subsec_millis()
    )
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `host:pid`, or the holder's digest when the lock carries no owner (written by an
/// older version).
pub(crate) fn owner(info: &LockInfo) -> String {
    match (&info.host, info.pid) {
        (Some(host), Some(pid)) => format!("{}:{pid}", shown(host)),
        _ => format!("holder {}", shown(&info.holder)),
    }
}

/// A duration for a table cell: `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 1 {
        format!("{}ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// The holders, how many of them are only kept by `hold_at_least` after their
/// release (no job runs under those), and a fair lock's queue: `2`, `1 (kept)`,
/// `3 (1 kept)`, `1 +4 queued`.
fn holders(info: &LockInfo) -> String {
    let held = match info.kept {
        0 => info.holders.to_string(),
        kept if kept == info.holders => format!("{} (kept)", info.holders),
        kept => format!("{} ({kept} kept)", info.holders),
    };
    match info.queued {
        0 => held,
        queued => format!("{held} +{queued} queued"),
    }
}

fn cell(d: Option<Duration>, none: &str) -> String {
    d.map_or_else(|| none.to_owned(), human)
}

/// `list`: a table (or a JSON array).
pub(crate) fn list(found: &[LockInfo], json: bool) {
    if json {
        let all: Vec<Value> = found.iter().map(to_json).collect();
        println!("{}", Value::Array(all));
        return;
    }
    let header = [
        "KEY", "KIND", "HOLDERS", "TTL", "FENCE", "OWNER", "HELD FOR",
    ];
    let rows: Vec<[String; 7]> = found
        .iter()
        .map(|i| {
            [
                shown(&i.key),
                i.kind.to_string(),
                holders(i),
                cell(i.ttl, "none"),
                i.fencing_token
                    .map_or_else(|| "-".to_owned(), |f| f.to_string()),
                owner(i),
                cell(i.held_for, "-"),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(&header.map(str::to_owned));
    for row in &rows {
        line(row);
    }
    if rows.is_empty() {
        println!("(no locks held)");
    }
}

/// `inspect`: the lock's fields, one per line, then a line per reader or permit holder
/// (or a JSON object, `null` when free).
pub(crate) fn inspect(key: &str, info: Option<&LockInfo>, json: bool) {
    match (info, json) {
        (Some(i), true) => println!("{}", to_json(i)),
        (None, true) => println!("null"),
        (None, false) => println!("{}: not held", shown(key)),
        (Some(i), false) => {
            println!("key            {}", shown(&i.key));
            println!("kind           {}", i.kind);
            println!("holders        {}", holders(i));
            if i.kept > 0 {
                println!(
                    "kept           released with hold_at_least, held until its minimum \
                     hold ends; no job runs under a kept holder"
                );
            }
            println!("owner          {}", owner(i));
            if let Some(at) = i
                .acquired_at
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            {
                println!("acquired at    {} (server clock)", utc(at));
            }
            println!("held for       {}", cell(i.held_for, "unknown"));
            println!("ttl left       {}", cell(i.ttl, "no expiry"));
            let fence = i
                .fencing_token
                .map_or_else(|| "unknown".to_owned(), |f| f.to_string());
            println!("fencing token  {fence}");
            println!("holder digest  {}", shown(&i.holder));
            for h in &i.shared {
                let fence = h
                    .fencing_token
                    .map_or_else(String::new, |f| format!(", fencing token {f}"));
                let kept = if h.kept { ", kept" } else { "" };
                println!(
                    "holder         {} (ttl left {}{fence}{kept})",
                    shown(&h.name),
                    cell(h.ttl, "no expiry")
                );
            }
        }
    }
}

/// What `release` did to the lock it showed.
pub(crate) enum Released {
    /// Deleted.
    Yes,
    /// Nothing held it any more.
    Free,
    /// Another grant (this one) holds it now: kept.
    Changed(LockInfo),
}

/// `release`: what was released, on stdout (the log line goes to stderr).
pub(crate) fn released(info: &LockInfo, outcome: &Released, json: bool) {
    let (user, host, pid) = operator();
    if json {
        let now = match outcome {
            Released::Changed(now) => to_json(now),
            Released::Yes | Released::Free => Value::Null,
        };
        let out = json!({
            "key": info.key,
            "released": matches!(outcome, Released::Yes),
            "was": to_json(info),
            "now": now,
            "by": { "user": user, "host": host, "pid": pid },
        });
        println!("{out}");
        return;
    }
    match outcome {
        Released::Yes => println!("released {}", shown(&info.key)),
        Released::Free => println!("{}: already free", shown(&info.key)),
        Released::Changed(now) => println!(
            "{}: not released: another holder took it after it was shown; now {}",
            shown(&info.key),
            shown(&now.to_string())
        ),
    }
}

/// Who runs this command: user (`$USER`, `$LOGNAME`), host name and process id.
pub(crate) fn operator() -> (String, String, u32) {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    (user, host, std::process::id())
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn times_read_as_utc_dates() {
        use std::time::Duration;

        use super::utc;
        assert_eq!(utc(Duration::ZERO), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            utc(Duration::from_millis(1_795_717_395_123)),
            "2026-11-26 18:23:15.123 UTC"
        );
        assert_eq!(
            utc(Duration::from_secs(951_782_400)),
            "2000-02-29 00:00:00.000 UTC"
        );
        assert_eq!(
            utc(Duration::from_secs(4_107_542_399)),
            "2100-02-28 23:59:59.000 UTC"
        );
    }

    #[test]
    fn what_would_act_on_a_terminal_is_shown_escaped() {
        assert_eq!(shown("lock:buy_{42}"), "lock:buy_{42}");
        assert_eq!(shown("a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(shown("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(shown("\u{7f}\u{9b}"), "\\u{7f}\\u{9b}");
        assert_eq!(shown("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert_eq!(shown("zero\u{200b}width"), "zero\\u{200b}width");
        assert_eq!(
            shown("gr\u{fc}\u{df}e \u{1f512}"),
            "gr\u{fc}\u{df}e \u{1f512}"
        );
    }
}
