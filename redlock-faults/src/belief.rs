//! The checker of the randomized nemesis: grants and beliefs, overlap of belief, fencing
//! order (DESIGN.md's safety invariants 1 and 2).
//!
//! Every client records each [`Grant`] it got: the key, the fencing token, when the call
//! that produced it started (`sent`, read *before* the call, so at or before the request
//! that won left) and when it returned (`returned`, read *after* the future returned), and
//! the last instant its `is_held()` answered true (`last_held`, the clock read *before*
//! calling `is_held()`, since the belief already held at that earlier instant). All
//! instants are [`now_ns`](crate::clock::now_ns) readings of one process, so they are on
//! one monotonic time line.
//!
//! [`check`] then reports, conservatively (no false positives):
//!
//! * an **overlap of belief** when, for two grants A and B of one key, B's call started
//!   after A's returned (so the server granted B after A) and B had returned at or before
//!   an instant at which A's `is_held()` was still true: at that instant A believed it held
//!   the lock while the server had already given it to B;
//! * a **fencing violation** when a token is 0, two grants of a key share a token, or a
//!   grant that certainly came later (its call started after the other's returned) has a
//!   token that is not larger.
//!
//! Pairs whose order on the server is unknown (their calls overlapped in time) are not
//! judged: that is what keeps the checker free of false positives.

use std::collections::BTreeMap;
use std::fmt;

use crate::clock;

/// One successful acquisition, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Which client (manager) got it.
    pub client: usize,
    /// The lock's key.
    pub key: String,
    /// Its fencing token.
    pub token: u64,
    /// Read before the acquire call was made.
    pub sent: u64,
    /// Read after the acquire call returned the guard.
    pub returned: u64,
    /// The last instant (read before the call) at which `is_held()` answered true;
    /// `None` when it never did.
    pub last_held: Option<u64>,
}

impl Grant {
    /// A grant with no belief sampled yet.
    pub fn new(
        client: usize,
        key: impl Into<String>,
        token: u64,
        sent: u64,
        returned: u64,
    ) -> Self {
        Self {
            client,
            key: key.into(),
            token,
            sent,
            returned,
            last_held: None,
        }
    }

    /// Notes that `is_held()` answered true when called at or after `at`.
    pub fn held_at(&mut self, at: u64) {
        self.last_held = Some(self.last_held.map_or(at, |l| l.max(at)));
    }
}

/// A breach of invariant 1 or 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `earlier`'s holder still believed it held the lock after `later` had been granted.
    Overlap {
        /// The grant whose holder kept believing.
        earlier: Grant,
        /// The grant made after it, returned while the first still believed.
        later: Grant,
    },
    /// A fencing token that is 0, shared, or not larger than an earlier grant's.
    Fencing {
        /// The earlier grant (`None` for a token of 0).
        earlier: Option<Grant>,
        /// The grant with the offending token.
        later: Grant,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { earlier, later } => {
                let held = earlier.last_held.unwrap_or(0);
                write!(
                    f,
                    "overlap of belief on {}: client {} (token {}, acquire {:.1}..{:.1} ms) \
                     still had is_held() == true at {:.1} ms, {:.1} ms after client {} \
                     (token {}, acquire started {:.1} ms, returned {:.1} ms) was granted",
                    earlier.key,
                    earlier.client,
                    earlier.token,
                    rel(earlier, earlier.sent),
                    rel(earlier, earlier.returned),
                    rel(earlier, held),
                    clock::ms(later.returned, held),
                    later.client,
                    later.token,
                    rel(earlier, later.sent),
                    rel(earlier, later.returned),
                )
            }
            Violation::Fencing {
                earlier: None,
                later,
            } => write!(
                f,
                "fencing token 0 on {} (client {})",
                later.key, later.client
            ),
            Violation::Fencing {
                earlier: Some(earlier),
                later,
            } => write!(
                f,
                "fencing order on {}: client {} got token {} (acquire {:.1}..{:.1} ms), \
                 then client {} got token {} (acquire {:.1}..{:.1} ms)",
                later.key,
                earlier.client,
                earlier.token,
                rel(earlier, earlier.sent),
                rel(earlier, earlier.returned),
                later.client,
                later.token,
                rel(earlier, later.sent),
                rel(earlier, later.returned),
            ),
        }
    }
}

/// `t` in ms relative to `base`'s acquire start, for reports.
fn rel(base: &Grant, t: u64) -> f64 {
    clock::ms(base.sent, t)
}

/// Checks every grant of every client for overlaps of belief and fencing violations;
/// returns them (overlaps first, then fencing), each pair reported once.
pub fn check(grants: &[Grant]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        by_key.entry(g.key.as_str()).or_default().push(g);
    }
    let mut overlaps = Vec::new();
    let mut fencing = Vec::new();
    for key_grants in by_key.values() {
        check_key(key_grants, &mut overlaps, &mut fencing);
    }
    overlaps.extend(fencing);
    overlaps
}

fn check_key(grants: &[&Grant], overlaps: &mut Vec<Violation>, fencing: &mut Vec<Violation>) {
    for a in grants {
        if a.token == 0 {
            fencing.push(Violation::Fencing {
                earlier: None,
                later: (*a).clone(),
            });
        }
    }
    // O(n^2) over the grants of one key: a few thousand at most per run.
    for (i, a) in grants.iter().enumerate() {
        for (j, b) in grants.iter().enumerate() {
            if i == j {
                continue;
            }
            if a.token == b.token {
                // Reported once per pair.
                if i < j {
                    let (earlier, later) = if a.sent <= b.sent { (a, b) } else { (b, a) };
                    fencing.push(Violation::Fencing {
                        earlier: Some((*earlier).clone()),
                        later: (*later).clone(),
                    });
                }
                continue;
            }
            // B certainly after A on the server: B's call started after A's returned.
            if b.sent < a.returned {
                continue;
            }
            if b.token <= a.token {
                fencing.push(Violation::Fencing {
                    earlier: Some((*a).clone()),
                    later: (*b).clone(),
                });
            }
            if a.last_held.is_some_and(|held| held >= b.returned) {
                overlaps.push(Violation::Overlap {
                    earlier: (*a).clone(),
                    later: (*b).clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(client: usize, token: u64, sent: u64, returned: u64, held: Option<u64>) -> Grant {
        let mut g = Grant::new(client, "k", token, sent, returned);
        if let Some(h) = held {
            g.held_at(h);
        }
        g
    }

    #[test]
    fn sequential_grants_pass() {
        let grants = vec![
            grant(0, 1, 0, 10, Some(50)),
            grant(1, 2, 20, 60, Some(90)),
            grant(0, 5, 70, 100, None),
        ];
        assert_eq!(check(&grants), vec![]);
    }

    #[test]
    fn belief_after_a_later_grant_is_an_overlap() {
        let grants = vec![grant(0, 1, 0, 10, Some(61)), grant(1, 2, 20, 60, Some(90))];
        let v = check(&grants);
        assert_eq!(v.len(), 1);
        assert!(
            matches!(&v[0], Violation::Overlap { earlier, later } if earlier.client == 0 && later.client == 1)
        );
        assert!(v[0].to_string().contains("overlap of belief"), "{}", v[0]);
    }

    #[test]
    fn belief_at_the_later_grants_return_counts() {
        let grants = vec![grant(0, 1, 0, 10, Some(60)), grant(1, 2, 20, 60, None)];
        assert_eq!(check(&grants).len(), 1);
    }

    #[test]
    fn calls_that_overlapped_in_time_are_not_judged() {
        // B's call started before A's returned: the server may have granted B first.
        let grants = vec![grant(0, 2, 0, 30, Some(100)), grant(1, 1, 20, 40, Some(35))];
        assert_eq!(check(&grants), vec![]);
    }

    #[test]
    fn fencing_order_zero_and_duplicates() {
        let grants = vec![grant(0, 5, 0, 10, None), grant(1, 5, 20, 30, None)];
        let v = check(&grants);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].to_string().contains("fencing order"));

        let grants = vec![grant(0, 7, 0, 10, None), grant(1, 3, 20, 30, None)];
        assert_eq!(check(&grants).len(), 1);

        let grants = vec![grant(0, 0, 0, 10, None)];
        let v = check(&grants);
        assert_eq!(v.len(), 1);
        assert!(v[0].to_string().contains("token 0"));
    }

    #[test]
    fn keys_are_independent() {
        let mut a = grant(0, 1, 0, 10, Some(100));
        a.key = "a".into();
        let mut b = grant(1, 1, 20, 60, None);
        b.key = "b".into();
        assert_eq!(check(&[a, b]), vec![]);
    }
}
