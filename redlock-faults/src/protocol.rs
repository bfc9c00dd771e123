//! The `fault-holder` process's command line and its report lines.
//!
//! The holder prints one event per line on stdout, flushed at once, so that a test reading
//! the pipe knows what the process did up to the moment it was killed or stopped:
//!
//! ```text
//! @ready pid=4242
//! @acquired token=7 at=123456789
//! @held held=true at=...
//! @begin token=7 ok=true value=3 at=...          (at: before the request)
//! @commit-sent token=7 at=...
//! @commit token=7 ok=true at=...                 (at: after the reply)
//! @lost at=...                                   (guard.lost() resolved)
//! @done result=ok at=...                         (ok | lost | error:<kind>)
//! @campaign at=...                               (leader mode: before campaigning)
//! ```
//!
//! Times are [`clock::now_ns`](crate::clock::now_ns) readings.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The prefix of every report line (anything else on stdout is ignored).
pub const PREFIX: char = '@';

/// One report line: an event name and `key=value` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `ready`, `acquired`, `begin`, ...
    pub name: String,
    fields: HashMap<String, String>,
}

impl Event {
    /// An event with no fields.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            fields: HashMap::new(),
        }
    }

    /// Adds a field (values must not contain spaces).
    #[must_use]
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.fields.insert(key.to_owned(), value.to_string());
        self
    }

    /// The line, `@name k=v ...` (fields sorted, for stable output).
    pub fn line(&self) -> String {
        let mut out = format!("{PREFIX}{}", self.name);
        let mut keys: Vec<&String> = self.fields.keys().collect();
        keys.sort();
        for k in keys {
            let _ = write!(out, " {k}={}", self.fields[k]);
        }
        out
    }

    /// Parses a report line; `None` for other output.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim().strip_prefix(PREFIX)?;
        let mut parts = rest.split_whitespace();
        let name = parts.next()?.to_owned();
        let fields = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Some(Self { name, fields })
    }

    /// A field as text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A numeric field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.parse().ok()
    }

    /// A boolean field.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.parse().ok()
    }
}

/// How the holder uses the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `lock_with` and an explicit guard; the steps do not check `is_held()` before
    /// committing (as if a pause struck between the check and the write).
    Guard,
    /// A `#[distributed_lock(on_lost = "abort")]` function; the body is dropped at its next
    /// await once the lock is lost.
    Macro,
    /// `leader_with(key)` (issue 26): the leader lock `lock:leader:{<key>}`, the term as
    /// the token; the steps run as in `Guard` mode (no `is_held()` check before a commit),
    /// then the leader resigns.
    Leader,
}

/// The holder's settings, from its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Lock server URL (`.single(url)`).
    pub lock_url: String,
    /// Resource server URL.
    pub resource_url: String,
    /// The resource's name.
    pub resource: String,
    /// The key, without hash tag: the lock is `lock:{<key>}` in both modes.
    pub key: String,
    /// Lock ttl in milliseconds (the macro mode's ttl is fixed at 1000 ms).
    pub ttl_ms: u64,
    /// Guard or macro.
    pub mode: Mode,
    /// Critical-section steps (begin, sleep, commit) to run.
    pub steps: u32,
    /// Sleep between a step's begin and its commit, in milliseconds.
    pub step_ms: u64,
    /// How long to keep holding after the steps, in milliseconds.
    pub hold_ms: u64,
}

impl Args {
    /// The command-line arguments for these settings.
    pub fn to_args(&self) -> Vec<String> {
        let mode = match self.mode {
            Mode::Guard => "guard",
            Mode::Macro => "macro",
            Mode::Leader => "leader",
        };
        [
            ("--lock", self.lock_url.clone()),
            ("--resource-url", self.resource_url.clone()),
            ("--resource", self.resource.clone()),
            ("--key", self.key.clone()),
            ("--ttl-ms", self.ttl_ms.to_string()),
            ("--mode", mode.to_owned()),
            ("--steps", self.steps.to_string()),
            ("--step-ms", self.step_ms.to_string()),
            ("--hold-ms", self.hold_ms.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }

    /// Parses what [`to_args`](Self::to_args) wrote.
    ///
    /// # Errors
    /// A message naming the missing or malformed argument.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut map = HashMap::new();
        for pair in args.chunks(2) {
            match pair {
                [k, v] => {
                    map.insert(k.as_str(), v.clone());
                }
                _ => return Err(format!("odd argument {pair:?}")),
            }
        }
        let text = |k: &str| map.get(k).cloned().ok_or(format!("missing {k}"));
        let num =
            |k: &str| -> Result<u64, String> { text(k)?.parse().map_err(|e| format!("{k}: {e}")) };
        let mode = match text("--mode")?.as_str() {
            "guard" => Mode::Guard,
            "macro" => Mode::Macro,
            "leader" => Mode::Leader,
            other => return Err(format!("--mode {other}")),
        };
        Ok(Self {
            lock_url: text("--lock")?,
            resource_url: text("--resource-url")?,
            resource: text("--resource")?,
            key: text("--key")?,
            ttl_ms: num("--ttl-ms")?,
            mode,
            steps: u32::try_from(num("--steps")?).map_err(|e| e.to_string())?,
            step_ms: num("--step-ms")?,
            hold_ms: num("--hold-ms")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let e = Event::new("begin")
            .with("token", 7)
            .with("ok", true)
            .with("at", 12);
        assert_eq!(e.line(), "@begin at=12 ok=true token=7");
        let back = Event::parse(&e.line()).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.u64("token"), Some(7));
        assert_eq!(back.bool("ok"), Some(true));
        assert_eq!(Event::parse("running 1 test"), None);
    }

    #[test]
    fn args_round_trip() {
        let a = Args {
            lock_url: "redis://127.0.0.1:1".into(),
            resource_url: "redis://127.0.0.1:2".into(),
            resource: "r".into(),
            key: "k".into(),
            ttl_ms: 500,
            mode: Mode::Macro,
            steps: 3,
            step_ms: 20,
            hold_ms: 0,
        };
        assert_eq!(Args::parse(&a.to_args()).unwrap(), a);
        assert!(Args::parse(&["--key".into()]).is_err());
    }
}
