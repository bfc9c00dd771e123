//! Short-lived synchronous connections with timeouts, and reply decoding helpers.

use std::collections::HashMap;
use std::time::Duration;

use redis::{RedisResult, Value};

/// Sends one command to `127.0.0.1:port` on a fresh connection.
///
/// `timeout` bounds the connect and each read and write.
pub(crate) fn query(port: u16, args: &[&str], timeout: Duration) -> RedisResult<Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    command(args).query(&mut conn)
}

/// Builds a command from its name and arguments (an empty slice gives an empty `PING`).
pub(crate) fn command(args: &[&str]) -> redis::Cmd {
    let (name, rest) = args.split_first().unwrap_or((&"PING", &[]));
    let mut cmd = redis::cmd(name);
    for a in rest {
        cmd.arg(*a);
    }
    cmd
}

/// Sends one command and decodes a textual reply (status, bulk or verbatim string).
pub(crate) fn query_text(port: u16, args: &[&str], timeout: Duration) -> Option<String> {
    query(port, args, timeout).ok().as_ref().and_then(text)
}

/// A textual reply as a `String`, or `None` for other shapes.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".to_owned()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// An integer reply, also accepting integers sent as strings.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.trim().parse().ok(),
    }
}

/// The value of `field` in an `INFO`-style `field:value` text.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then_some(v.trim())
    })
}

/// A flat `[field, value, field, value, ...]` array (or a RESP3 map) as a map of strings.
pub(crate) fn flat_map(v: &Value) -> HashMap<String, String> {
    let mut out = HashMap::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    if let (Some(k), Some(v)) =
                        (text(k), text(v).or_else(|| int(v).map(|i| i.to_string())))
                    {
                        out.insert(k, v);
                    }
                }
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if let (Some(k), Some(v)) =
                    (text(k), text(v).or_else(|| int(v).map(|i| i.to_string())))
                {
                    out.insert(k, v);
                }
            }
        }
        _ => {}
    }
    out
}

/// One range of `CLUSTER SLOTS`: `start..=end` served by the master at `port`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SlotRange {
    pub(crate) start: u16,
    pub(crate) end: u16,
    pub(crate) master_port: u16,
}

/// Decodes a `CLUSTER SLOTS` reply into sorted ranges; `None` on an unexpected shape.
pub(crate) fn slot_ranges(v: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(entries) = v else {
        return None;
    };
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let Value::Array(fields) = e else {
            return None;
        };
        let [start, end, master, ..] = fields.as_slice() else {
            return None;
        };
        let Value::Array(master) = master else {
            return None;
        };
        let port = master.get(1).and_then(int)?;
        out.push(SlotRange {
            start: u16::try_from(int(start)?).ok()?,
            end: u16::try_from(int(end)?).ok()?,
            master_port: u16::try_from(port).ok()?,
        });
    }
    out.sort();
    Some(out)
}
