//! Redis glob patterns, matched as `SCAN MATCH` matches them: for the in-memory backend's
//! `list`, and for names a `SCAN` cannot filter by themselves (Redlock's permit places,
//! matched by the lock they belong to).

/// Whether `s` matches the Redis glob `pattern` (`*`, `?`, `[abc]`, `[^a-z]`, `\\x`), as
/// `SCAN MATCH` decides.
pub(crate) fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    // Backtracking to the last `*` only: O(len(pattern) * len(s)).
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, i));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class(pattern, p, s[i]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == s[i]).then_some(p + 2),
            Some(&c) => (c == s[i]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => (p, i) = (next, i + 1),
            (None, Some((sp, si))) => {
                (p, i) = (sp + 1, si + 1);
                star = Some((sp, si + 1));
            }
            (None, None) => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// The `[...]` class at `pattern[open]` against `c`: the index after the class when it
/// matches (an unclosed class runs to the end, as in Redis).
fn class(pattern: &[u8], open: usize, c: u8) -> Option<usize> {
    let mut p = open + 1;
    let negate = pattern.get(p) == Some(&b'^');
    if negate {
        p += 1;
    }
    let mut hit = false;
    while let Some(&b) = pattern.get(p) {
        match b {
            b']' => break,
            b'\\' if p + 1 < pattern.len() => {
                hit |= pattern[p + 1] == c;
                p += 2;
            }
            _ if pattern.get(p + 1) == Some(&b'-') && p + 2 < pattern.len() => {
                let (lo, hi) = (b.min(pattern[p + 2]), b.max(pattern[p + 2]));
                hit |= (lo..=hi).contains(&c);
                p += 3;
            }
            _ => {
                hit |= b == c;
                p += 1;
            }
        }
    }
    (hit != negate).then_some(p + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_scan_match_does() {
        let m = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes());
        assert!(m("lock:*", "lock:buy_{42}") && m("*", "") && m("a*b*c", "aXXbYc"));
        assert!(!m("lock:*", "other:x") && !m("a*b", "a") && !m("?", ""));
        assert!(m("buy_{4?}", "buy_{42}") && m("[ab]x", "bx") && !m("[^ab]x", "bx"));
        assert!(m("[a-c]", "b") && !m("[a-c]", "d") && m("lock\\*x", "lock*x"));
        assert!(!m("lock\\*x", "lockyx") && m("x[", "x[") == m("x[", "x["));
    }
}
