//! A history of critical sections and the checker of the suite's invariants.
//!
//! Every contended workload records, for each critical section, who held the lock
//! (`client`), with which fencing token, when it entered and left (on the machine-wide
//! monotonic [`crate::clock`]), whether the holder lost its lease meanwhile, and
//! how its accesses to the fenced [`Resource`](crate::resource::Resource) went.
//! [`History::check`] then verifies, in the style of Jepsen's and etcd's robustness
//! checkers:
//!
//! 1. **Mutual exclusion.** No two sections overlap in time, unless one of them lost its
//!    lease (the library said so, or the process was killed or paused) *and* the fenced
//!    resource protected the other: the stale holder's commit was rejected, never sent,
//!    or applied before the newer holder began.
//! 2. **Fencing order.** Tokens strictly increase in grant order: when a section ended
//!    before another began, its token is smaller. Two sections never share a token.
//! 3. **Exact counter.** Checked with the resource's own journal
//!    ([`State::problems`](crate::resource::State::problems)): the counter equals the
//!    number of accepted commits.
//!
//! Times are recorded conservatively: `enter` after the lock was granted, `exit` before
//! it is released, a commit's time after its reply, a begin's time before its request.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use crate::clock;

/// One critical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Who held the lock (a process, manager or task name).
    pub client: String,
    /// The fencing token of the acquisition.
    pub token: u64,
    /// When the lock was known granted (after `lock()` returned).
    pub enter: u64,
    /// When the section ended: before the release was sent, or when the process was
    /// killed; `u64::MAX` when it never ended (the process was left paused).
    pub exit: u64,
    /// The holder lost its lease during the section (reported lost, killed, paused past
    /// its ttl, or cut off).
    pub lost: bool,
    /// Each `begin`: when it was sent, and whether it was granted.
    pub begins: Vec<(u64, bool)>,
    /// Each `commit` whose reply came: when, and whether it was accepted.
    pub commits: Vec<(u64, bool)>,
    /// A commit was sent but the holder died or was cut off before its reply, so it may
    /// have been applied at any time after.
    pub commit_unknown: bool,
}

impl Section {
    /// A section from `enter` to `exit` with no resource access recorded yet.
    pub fn new(client: impl Into<String>, token: u64, enter: u64, exit: u64) -> Self {
        Self {
            client: client.into(),
            token,
            enter,
            exit,
            lost: false,
            begins: Vec::new(),
            commits: Vec::new(),
            commit_unknown: false,
        }
    }

    /// Whether the commit may have been applied after `t` (accepted late, or unknown).
    fn commit_may_land_after(&self, t: u64) -> bool {
        if self.commit_unknown {
            return true;
        }
        self.commits.iter().any(|&(at, ok)| ok && at > t)
    }

    /// When the first granted `begin` was sent.
    fn first_begin(&self) -> Option<u64> {
        self.begins.iter().filter(|b| b.1).map(|b| b.0).min()
    }
}

/// Sections recorded by many tasks.
#[derive(Debug, Default)]
pub struct History {
    sections: Mutex<Vec<Section>>,
}

/// What [`History::check`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Sections checked.
    pub sections: usize,
    /// Pairs of sections that overlapped in time.
    pub overlaps: usize,
    /// Of those, the ones a lost lease plus the fenced resource made harmless.
    pub excused: usize,
    /// Broken invariants, one line each.
    pub violations: Vec<String>,
    /// Of those, overlaps not excused (mutual exclusion broken for the resource).
    pub exclusion_violations: usize,
    /// Of those, tokens out of grant order or issued twice.
    pub token_violations: usize,
}

impl Report {
    /// Whether no invariant was broken.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sections, {} overlaps ({} excused by a lost lease + fencing), {} violations \
             ({} of mutual exclusion, {} of token order)",
            self.sections,
            self.overlaps,
            self.excused,
            self.violations.len(),
            self.exclusion_violations,
            self.token_violations
        )?;
        for v in self.violations.iter().take(10) {
            write!(f, "\n  violation: {v}")?;
        }
        if self.violations.len() > 10 {
            write!(f, "\n  ... {} more", self.violations.len() - 10)?;
        }
        Ok(())
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one section.
    pub fn record(&self, section: Section) {
        self.sections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(section);
    }

    /// A copy of the sections recorded so far.
    pub fn sections(&self) -> Vec<Section> {
        self.sections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Settles the commits of unknown fate with the resource's journal (the tokens of the
    /// accepted commits, [`State::accepted`](crate::resource::State::accepted)): a section
    /// whose token appears in the journal no more often than the section saw commits
    /// accepted had its in-flight commit rejected or never applied.
    pub fn settle(&self, journal: &[u64]) {
        let mut sections = self.sections.lock().unwrap_or_else(PoisonError::into_inner);
        for s in sections.iter_mut().filter(|s| s.commit_unknown) {
            let applied = journal.iter().filter(|&&t| t == s.token).count();
            let seen = s.commits.iter().filter(|c| c.1).count();
            if applied <= seen {
                s.commit_unknown = false;
            }
        }
    }

    /// Checks mutual exclusion and fencing order (see the module docs).
    pub fn check(&self) -> Report {
        check(&self.sections())
    }
}

/// Checks a list of sections (see the module docs).
pub fn check(sections: &[Section]) -> Report {
    let mut by_enter: Vec<&Section> = sections.iter().collect();
    by_enter.sort_by_key(|s| (s.enter, s.token));
    let mut report = Report {
        sections: sections.len(),
        ..Report::default()
    };
    // 1. Overlaps. Sweep in enter order; sections still open are the candidates.
    let mut open: Vec<&Section> = Vec::new();
    for &b in &by_enter {
        open.retain(|a| a.exit > b.enter);
        for &a in &open {
            report.overlaps += 1;
            if excused(a, b) {
                report.excused += 1;
            } else {
                report.exclusion_violations += 1;
                report.violations.push(format!(
                    "{} (token {}) and {} (token {}) held the lock together for {:.1} ms",
                    a.client,
                    a.token,
                    b.client,
                    b.token,
                    clock::ms(b.enter, a.exit.min(b.exit))
                ));
            }
        }
        open.push(b);
    }
    // 2. Fencing order: every section that ended before b entered has a smaller token.
    //    Sweep in enter order over the sections sorted by exit, keeping the max token.
    let mut by_exit: Vec<&Section> = sections.iter().collect();
    by_exit.sort_by_key(|s| s.exit);
    let mut i = 0;
    let mut max_before: Option<&Section> = None;
    for &b in &by_enter {
        while i < by_exit.len() && by_exit[i].exit <= b.enter {
            let a = by_exit[i];
            if max_before.is_none_or(|m| a.token > m.token) {
                max_before = Some(a);
            }
            i += 1;
        }
        if let Some(a) = max_before {
            if a.token >= b.token {
                report.token_violations += 1;
                report.violations.push(format!(
                    "{} got token {} after {} had token {} (grant order)",
                    b.client, b.token, a.client, a.token
                ));
            }
        }
    }
    let mut tokens: Vec<(u64, &str)> = sections
        .iter()
        .map(|s| (s.token, s.client.as_str()))
        .collect();
    tokens.sort_unstable();
    for w in tokens.windows(2) {
        if w[0].0 == w[1].0 {
            report.token_violations += 1;
            report.violations.push(format!(
                "token {} was issued twice ({} and {})",
                w[0].0, w[0].1, w[1].1
            ));
        }
    }
    report
}

/// Two overlapping sections are harmless when one of them had lost its lease and cannot
/// have changed the resource after the other began.
fn excused(a: &Section, b: &Section) -> bool {
    let stale_is_harmless = |stale: &Section, fresh: &Section| {
        if !stale.lost {
            return false;
        }
        match fresh.first_begin() {
            // The newer holder began: no stale commit may land after that.
            Some(begun) => !stale.commit_may_land_after(begun),
            // The newer holder never touched the resource: nothing to protect.
            None => true,
        }
    };
    stale_is_harmless(a, b) || stale_is_harmless(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(client: &str, token: u64, enter: u64, exit: u64) -> Section {
        Section::new(client, token, enter, exit)
    }

    #[test]
    fn disjoint_increasing_is_ok() {
        let r = check(&[s("a", 1, 0, 10), s("b", 2, 10, 20), s("a", 3, 25, 30)]);
        assert!(r.ok(), "{r}");
        assert_eq!(r.overlaps, 0);
    }

    #[test]
    fn overlap_is_a_violation() {
        let r = check(&[s("a", 1, 0, 10), s("b", 2, 5, 20)]);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.violations.len(), 1, "{r}");
    }

    #[test]
    fn overlap_of_a_lost_holder_rejected_by_the_resource_is_excused() {
        let mut a = s("a", 1, 0, 100);
        a.lost = true;
        a.begins = vec![(1, true)];
        a.commits = vec![(90, false)];
        let mut b = s("b", 2, 50, 60);
        b.begins = vec![(51, true)];
        b.commits = vec![(52, true)];
        let r = check(&[a.clone(), b.clone()]);
        assert!(r.ok(), "{r}");
        assert_eq!(r.excused, 1);
        // Accepted after the newer holder began: a lost update, not excused.
        a.commits = vec![(90, true)];
        assert!(!check(&[a.clone(), b.clone()]).ok());
        // Accepted before the newer holder began: harmless.
        a.commits = vec![(40, true), (95, false)];
        assert!(check(&[a.clone(), b.clone()]).ok());
        // Unknown fate counts as possibly late.
        a.commits.clear();
        a.commit_unknown = true;
        assert!(!check(&[a.clone(), b.clone()]).ok());
        // Not lost: never excused.
        a.commit_unknown = false;
        a.lost = false;
        assert!(!check(&[a, b]).ok());
    }

    #[test]
    fn tokens_must_increase_in_grant_order() {
        let r = check(&[s("a", 5, 0, 10), s("b", 4, 11, 20)]);
        assert_eq!(r.violations.len(), 1, "{r}");
        let r = check(&[s("a", 5, 0, 10), s("b", 5, 11, 20)]);
        assert_eq!(r.violations.len(), 2, "{r}"); // order + reuse
        let r = check(&[s("a", 2, 0, 10), s("c", 9, 1, 5), s("b", 10, 11, 20)]);
        assert_eq!(r.overlaps, 1);
    }

    #[test]
    fn open_sections_overlap_everything_after() {
        let mut a = s("a", 1, 0, u64::MAX);
        a.lost = true;
        let r = check(&[a, s("b", 2, 5, 6), s("c", 3, 7, 8)]);
        assert_eq!(r.overlaps, 2);
        assert!(r.ok(), "{r}");
    }
}
