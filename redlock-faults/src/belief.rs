//! The checker of the randomized nemesis: grants and beliefs, overlap of belief, fencing
//! order (DESIGN.md's safety invariants 1 and 2), for every kind of lock.
//!
//! Every client records each [`Grant`] it got: the key, what it holds there ([`Hold`]:
//! the key alone, a reader's place, one of `n` permits), the fencing token, when the call
//! that produced it started (`sent`, read *before* the call, so at or before the request
//! that won left) and when it returned (`returned`, read *after* the future returned), and
//! the last instant its `is_held()` answered true (`last_held`, the clock read *before*
//! calling `is_held()`, since the belief already held at that earlier instant). A
//! `MultiGuard` of `lock_all` is one exclusive grant per key, all with the guard's
//! `is_held()`. All instants are [`now_ns`](crate::clock::now_ns) readings of one
//! process, so they are on one monotonic time line.
//!
//! A grant's **belief interval** is `returned ..= last_held`: the server granted it
//! before `returned`, and its holder still believed at `last_held`. Two grants *conflict*
//! when they are on one key and at least one is exclusive while the other is exclusive or
//! a reader (readers share a key with each other, never with an exclusive holder; permits
//! are only counted among permits). [`check`] then reports, conservatively (no false
//! positives):
//!
//! * an **overlap of belief** when, for two conflicting grants A and B, B's call started
//!   after A's returned (so the server granted B after A) and B had returned at or before
//!   an instant at which A's `is_held()` was still true: at that instant A believed it held
//!   the lock while the server had already given it to B;
//! * **concurrent beliefs** when two conflicting grants' belief intervals share an
//!   instant *t* (whatever the order of their calls): both had been granted by *t*, and
//!   both holders believed at or after *t*, so whichever the server granted second, the
//!   other's holder believed after that grant;
//! * **too many permits** when more than `n` grants of a key's `n` permits had been
//!   granted by an instant *t* (the `returned` of one of them) and all but at most the
//!   last granted still believed at or after *t*: at most `n` were live on the server at
//!   *t*, so some holder believed after its permit had expired (a lease is never held
//!   again once it lapsed: each attempt has a fresh owner token). *t* is the `returned`
//!   of a grant B, and the others count when their belief interval contains *t* and they
//!   were certainly granted before B (returned before B's call started), or, when B
//!   itself believed at *t*, granted by *t* at all;
//! * a **fencing violation** when a token is 0, when a grant that certainly came later
//!   (its call started after the other's returned) has a token that is not larger, or when
//!   two grants of a key share a token — except, with [`Tokens::SharedMayRepeat`]
//!   (Redlock, see "On Redlock" in docs/usage.md), two readers or two permits whose calls
//!   overlapped in time: different majorities granting them at once can report the same
//!   highest counter. An exclusive grant's token is still unique and above every
//!   grant's that certainly came before it.
//!
//! Pairs whose order on the server is unknown (their calls overlapped in time) are not
//! judged by order, only by beliefs held at one instant; and a belief counts only from
//! `returned` (after the grant) to `last_held` (before the `is_held()` call that answered
//! true): that is what keeps the checker free of false positives.

use std::collections::BTreeMap;
use std::fmt;

use crate::clock;

/// What a grant holds on its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The key alone: `lock`, `write`, or one key of a `lock_all` (`MultiGuard`).
    Exclusive,
    /// One of the key's readers (`read`).
    Read,
    /// One of the key's `n` permits (`permit(k, n)`).
    Permit(u32),
}

impl Hold {
    /// Whether two grants of one key, holding `self` and `other`, may never be believed
    /// at once: an exclusive holder against an exclusive holder or a reader.
    fn conflicts(self, other: Hold) -> bool {
        matches!(
            (self, other),
            (Hold::Exclusive, Hold::Exclusive | Hold::Read) | (Hold::Read, Hold::Exclusive)
        )
    }

    fn is_shared(self) -> bool {
        !matches!(self, Hold::Exclusive)
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hold::Exclusive => f.write_str("exclusive"),
            Hold::Read => f.write_str("read"),
            Hold::Permit(n) => write!(f, "permit of {n}"),
        }
    }
}

/// Which fencing tokens may repeat on a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// Every grant has a token of its own (one server, Redis Cluster).
    Unique,
    /// Two readers, or two permits, whose calls overlapped in time may share a token
    /// (Redlock); exclusive grants still have unique tokens.
    SharedMayRepeat,
}

/// One successful acquisition, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Which client (task) got it.
    pub client: usize,
    /// The lock's key.
    pub key: String,
    /// What it holds there.
    pub hold: Hold,
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
    /// An exclusive grant with no belief sampled yet.
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
            hold: Hold::Exclusive,
            token,
            sent,
            returned,
            last_held: None,
        }
    }

    /// The same grant holding `hold`.
    #[must_use]
    pub fn holding(mut self, hold: Hold) -> Self {
        self.hold = hold;
        self
    }

    /// Notes that `is_held()` answered true when called at or after `at`.
    pub fn held_at(&mut self, at: u64) {
        self.last_held = Some(self.last_held.map_or(at, |l| l.max(at)));
    }

    /// Whether its holder believed at or after `t`, having been granted by `t`.
    fn believes_at(&self, t: u64) -> bool {
        self.returned <= t && self.last_held.is_some_and(|h| h >= t)
    }

    /// Whether `later`'s call certainly reached the server after this grant.
    fn certainly_before(&self, later: &Grant) -> bool {
        later.sent >= self.returned
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
    /// Two conflicting grants whose holders both believed at `at` (the later `returned`
    /// of the two), their calls' order unknown.
    Concurrent {
        /// The grant returned first.
        first: Grant,
        /// The grant returned second.
        second: Grant,
        /// An instant both believed at or after, both granted by then.
        at: u64,
    },
    /// More than `n` permit grants of a key granted by `at`, believed at or after it.
    Permits {
        /// The key's number of permits (the anchoring grant's `n`).
        n: u32,
        /// The instant: the last grant's `returned`.
        at: u64,
        /// The grants, the anchoring one (returned at `at`) last.
        grants: Vec<Grant>,
    },
    /// A fencing token that is 0, shared, or not larger than an earlier grant's.
    Fencing {
        /// The earlier grant (`None` for a token of 0).
        earlier: Option<Grant>,
        /// The grant with the offending token.
        later: Grant,
    },
}

impl Violation {
    /// The grants involved, the one whose holder is suspect first (for reports).
    pub fn grants(&self) -> Vec<&Grant> {
        match self {
            Violation::Overlap { earlier, later } => vec![earlier, later],
            Violation::Concurrent { first, second, .. } => vec![first, second],
            Violation::Permits { grants, .. } => grants.iter().collect(),
            Violation::Fencing {
                earlier: Some(earlier),
                later,
            } => vec![later, earlier],
            Violation::Fencing {
                earlier: None,
                later,
            } => vec![later],
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { earlier, later } => {
                let held = earlier.last_held.unwrap_or(0);
                write!(
                    f,
                    "overlap of belief on {}: client {} ({}, token {}, acquire {:.1}..{:.1} ms) \
                     still had is_held() == true at {:.1} ms, {:.1} ms after client {} \
                     ({}, token {}, acquire started {:.1} ms, returned {:.1} ms) was granted",
                    earlier.key,
                    earlier.client,
                    earlier.hold,
                    earlier.token,
                    rel(earlier, earlier.sent),
                    rel(earlier, earlier.returned),
                    rel(earlier, held),
                    clock::ms(later.returned, held),
                    later.client,
                    later.hold,
                    later.token,
                    rel(earlier, later.sent),
                    rel(earlier, later.returned),
                )
            }
            Violation::Concurrent { first, second, at } => write!(
                f,
                "concurrent beliefs on {} at {:.1} ms: {} and {}",
                first.key,
                rel(first, *at),
                Described(first, first),
                Described(second, first),
            ),
            Violation::Permits { n, at, grants } => {
                let base = &grants[0];
                write!(
                    f,
                    "too many permits on {}: {} of {n} granted by {:.1} ms, each believed at or \
                     after it (the last may not have):",
                    base.key,
                    grants.len(),
                    rel(base, *at),
                )?;
                for g in grants {
                    write!(f, " {};", Described(g, base))?;
                }
                Ok(())
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
                "fencing order on {}: client {} got token {} ({}, acquire {:.1}..{:.1} ms), \
                 then client {} got token {} ({}, acquire {:.1}..{:.1} ms)",
                later.key,
                earlier.client,
                earlier.token,
                earlier.hold,
                rel(earlier, earlier.sent),
                rel(earlier, earlier.returned),
                later.client,
                later.token,
                later.hold,
                rel(earlier, later.sent),
                rel(earlier, later.returned),
            ),
        }
    }
}

/// A grant in a report, its times in ms from the second grant's acquire start.
struct Described<'a>(&'a Grant, &'a Grant);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Described(g, base) = *self;
        write!(
            f,
            "client {} ({}, token {}, acquire {:.1}..{:.1} ms, last is_held() true at ",
            g.client,
            g.hold,
            g.token,
            rel(base, g.sent),
            rel(base, g.returned),
        )?;
        match g.last_held {
            Some(h) => write!(f, "{:.1} ms)", rel(base, h)),
            None => f.write_str("never)"),
        }
    }
}

/// `t` in ms relative to `base`'s acquire start, for reports.
fn rel(base: &Grant, t: u64) -> f64 {
    clock::ms(base.sent, t)
}

/// Checks every grant of every client for overlaps of belief, too many permits and
/// fencing violations, `tokens` telling which tokens may repeat; returns them (beliefs
/// first, then fencing), each pair (or permit anchor) reported once.
pub fn check(grants: &[Grant], tokens: Tokens) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        by_key.entry(g.key.as_str()).or_default().push(g);
    }
    let mut beliefs = Vec::new();
    let mut fencing = Vec::new();
    for key_grants in by_key.values() {
        check_key(key_grants, tokens, &mut beliefs, &mut fencing);
    }
    beliefs.extend(fencing);
    beliefs
}

fn check_key(
    grants: &[&Grant],
    tokens: Tokens,
    beliefs: &mut Vec<Violation>,
    fencing: &mut Vec<Violation>,
) {
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
        for b in &grants[i + 1..] {
            let (a, b) = if a.sent <= b.sent { (*a, *b) } else { (*b, *a) };
            let ordered = a.certainly_before(b);
            if a.token == b.token {
                let may_repeat = tokens == Tokens::SharedMayRepeat
                    && !ordered
                    && a.hold.is_shared()
                    && std::mem::discriminant(&a.hold) == std::mem::discriminant(&b.hold);
                if !may_repeat {
                    fencing.push(Violation::Fencing {
                        earlier: Some(a.clone()),
                        later: b.clone(),
                    });
                }
                continue;
            }
            if ordered && b.token <= a.token {
                fencing.push(Violation::Fencing {
                    earlier: Some(a.clone()),
                    later: b.clone(),
                });
            }
            if !a.hold.conflicts(b.hold) {
                continue;
            }
            // B certainly after A on the server: B's call started after A's returned.
            if ordered && a.last_held.is_some_and(|held| held >= b.returned) {
                beliefs.push(Violation::Overlap {
                    earlier: a.clone(),
                    later: b.clone(),
                });
                continue;
            }
            let (first, second) = if a.returned <= b.returned {
                (a, b)
            } else {
                (b, a)
            };
            if first.believes_at(second.returned) && second.believes_at(second.returned) {
                beliefs.push(Violation::Concurrent {
                    first: first.clone(),
                    second: second.clone(),
                    at: second.returned,
                });
            }
        }
    }
    for (i, b) in grants.iter().enumerate() {
        let Hold::Permit(n) = b.hold else { continue };
        let at = b.returned;
        let b_believes = b.believes_at(at);
        let mut together: Vec<Grant> = grants
            .iter()
            .enumerate()
            .filter(|&(j, g)| {
                j != i
                    && matches!(g.hold, Hold::Permit(_))
                    && g.believes_at(at)
                    && (g.certainly_before(b) || b_believes)
            })
            .map(|(_, g)| (*g).clone())
            .collect();
        if together.len() >= usize::try_from(n).unwrap_or(usize::MAX) {
            together.sort_by_key(|g| g.returned);
            together.push((*b).clone());
            beliefs.push(Violation::Permits {
                n,
                at,
                grants: together,
            });
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

    fn read(client: usize, token: u64, sent: u64, returned: u64, held: Option<u64>) -> Grant {
        grant(client, token, sent, returned, held).holding(Hold::Read)
    }

    fn permit(client: usize, token: u64, sent: u64, returned: u64, held: Option<u64>) -> Grant {
        grant(client, token, sent, returned, held).holding(Hold::Permit(2))
    }

    fn unique(grants: &[Grant]) -> Vec<Violation> {
        check(grants, Tokens::Unique)
    }

    #[test]
    fn sequential_grants_pass() {
        let grants = vec![
            grant(0, 1, 0, 10, Some(50)),
            grant(1, 2, 20, 60, Some(90)),
            grant(0, 5, 70, 100, None),
        ];
        assert_eq!(unique(&grants), vec![]);
    }

    #[test]
    fn belief_after_a_later_grant_is_an_overlap() {
        let grants = vec![grant(0, 1, 0, 10, Some(61)), grant(1, 2, 20, 60, Some(90))];
        let v = unique(&grants);
        assert_eq!(v.len(), 1);
        assert!(
            matches!(&v[0], Violation::Overlap { earlier, later } if earlier.client == 0 && later.client == 1)
        );
        assert!(v[0].to_string().contains("overlap of belief"), "{}", v[0]);
    }

    #[test]
    fn belief_at_the_later_grants_return_counts() {
        let grants = vec![grant(0, 1, 0, 10, Some(60)), grant(1, 2, 20, 60, None)];
        assert_eq!(unique(&grants).len(), 1);
    }

    #[test]
    fn calls_that_overlapped_in_time_are_not_judged_by_order() {
        // B's call started before A's returned: the server may have granted B first, and
        // B never believed once A had returned.
        let grants = vec![grant(0, 2, 0, 30, Some(100)), grant(1, 1, 20, 40, Some(35))];
        assert_eq!(unique(&grants), vec![]);
    }

    #[test]
    fn beliefs_at_one_instant_are_concurrent_whatever_the_order() {
        // Calls overlapped (order unknown), but both believed at 40, both granted by then.
        let grants = vec![grant(0, 2, 0, 30, Some(100)), grant(1, 1, 20, 40, Some(45))];
        let v = unique(&grants);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            matches!(&v[0], Violation::Concurrent { first, second, at: 40 } if first.client == 0 && second.client == 1)
        );
        assert!(v[0].to_string().contains("concurrent beliefs"), "{}", v[0]);
        // One belief ending before the other grant returned: no instant in common.
        let grants = vec![grant(0, 2, 0, 30, Some(39)), grant(1, 1, 20, 40, Some(45))];
        assert_eq!(unique(&grants), vec![]);
    }

    #[test]
    fn readers_share_a_key_but_never_with_a_writer() {
        // Three readers believing together: fine.
        let readers = vec![
            read(0, 1, 0, 10, Some(100)),
            read(1, 3, 20, 30, Some(100)),
            read(2, 2, 5, 15, Some(100)),
        ];
        assert_eq!(unique(&readers), vec![]);

        // A writer granted after a reader returned, the reader still believing.
        let grants = vec![read(0, 1, 0, 10, Some(61)), grant(1, 2, 20, 60, Some(62))];
        let v = unique(&grants);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            matches!(&v[0], Violation::Overlap { earlier, later } if earlier.hold == Hold::Read && later.hold == Hold::Exclusive)
        );
        assert!(v[0].to_string().contains("(read, token 1"), "{}", v[0]);

        // A reader granted after a writer returned, the writer still believing.
        let grants = vec![grant(0, 1, 0, 10, Some(61)), read(1, 2, 20, 60, None)];
        assert_eq!(unique(&grants).len(), 1);

        // A reader and a writer whose calls overlapped, believing at one instant.
        let grants = vec![read(0, 2, 0, 30, Some(50)), grant(1, 1, 20, 40, Some(41))];
        let v = unique(&grants);
        assert!(matches!(&v[..], [Violation::Concurrent { .. }]), "{v:?}");
    }

    #[test]
    fn a_multi_guard_is_exclusive_on_each_of_its_keys() {
        // lock_all(["a", "b"]): two exclusive grants of one call, one belief.
        let mut a = grant(0, 4, 0, 10, Some(80));
        a.key = "a".into();
        let mut b = grant(0, 9, 0, 10, Some(80));
        b.key = "b".into();
        assert_eq!(unique(&[a.clone(), b.clone()]), vec![]);
        // A reader of "b" granted while the MultiGuard believed.
        let mut r = read(1, 10, 20, 30, Some(31));
        r.key = "b".into();
        let v = unique(&[a, b, r]);
        assert!(
            matches!(&v[..], [Violation::Overlap { earlier, later }] if earlier.key == "b" && later.hold == Hold::Read),
            "{v:?}"
        );
    }

    #[test]
    fn more_permits_believed_at_once_than_the_key_has() {
        // Two of two, believing together: fine.
        let two = vec![
            permit(0, 1, 0, 10, Some(100)),
            permit(1, 2, 5, 20, Some(100)),
        ];
        assert_eq!(unique(&two), vec![]);

        // A third believing with them (its call overlapped both: the order is unknown).
        let mut three = two.clone();
        three.push(permit(2, 3, 8, 30, Some(35)));
        let v = unique(&three);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            matches!(&v[0], Violation::Permits { n: 2, at: 30, grants } if grants.len() == 3 && grants[2].client == 2),
            "{v:?}"
        );
        assert!(v[0].to_string().contains("too many permits"), "{}", v[0]);

        // A third granted after both returned, both still believing after it returned:
        // a violation even though it never believed itself.
        let mut late = two.clone();
        late.push(permit(2, 3, 25, 30, None));
        assert!(matches!(&unique(&late)[..], [Violation::Permits { .. }]));

        // The same, but its call started before the second returned and it never
        // believed: the server may have granted it before the second, after the first
        // had expired; not judged.
        let mut unsure = two.clone();
        unsure.push(permit(2, 3, 15, 30, None));
        assert_eq!(unique(&unsure), vec![]);

        // One of the two stopped believing before the third returned: fine.
        let mut ended = two;
        ended[0].last_held = Some(29);
        ended.push(permit(2, 3, 25, 30, Some(90)));
        assert_eq!(unique(&ended), vec![]);
    }

    #[test]
    fn fencing_order_zero_and_duplicates() {
        let grants = vec![grant(0, 5, 0, 10, None), grant(1, 5, 20, 30, None)];
        let v = unique(&grants);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].to_string().contains("fencing order"));

        let grants = vec![grant(0, 7, 0, 10, None), grant(1, 3, 20, 30, None)];
        assert_eq!(unique(&grants).len(), 1);

        let grants = vec![grant(0, 0, 0, 10, None)];
        let v = unique(&grants);
        assert_eq!(v.len(), 1);
        assert!(v[0].to_string().contains("token 0"));
    }

    #[test]
    fn fencing_order_holds_for_every_kind() {
        // A writer after a reader, a reader after a writer, a permit after a permit.
        for grants in [
            vec![read(0, 7, 0, 10, None), grant(1, 3, 20, 30, None)],
            vec![grant(0, 7, 0, 10, None), read(1, 3, 20, 30, None)],
            vec![permit(0, 7, 0, 10, None), permit(1, 3, 20, 30, None)],
        ] {
            let v = check(&grants, Tokens::SharedMayRepeat);
            assert!(matches!(&v[..], [Violation::Fencing { .. }]), "{v:?}");
        }
    }

    #[test]
    fn on_redlock_only_concurrent_shared_grants_may_share_a_token() {
        let readers = vec![read(0, 5, 0, 10, Some(50)), read(1, 5, 5, 15, Some(50))];
        assert_eq!(check(&readers, Tokens::SharedMayRepeat), vec![]);
        assert_eq!(check(&readers, Tokens::Unique).len(), 1);
        let permits = vec![permit(0, 5, 0, 10, None), permit(1, 5, 5, 15, None)];
        assert_eq!(check(&permits, Tokens::SharedMayRepeat), vec![]);

        // Certainly one after the other: never the same token.
        let ordered = vec![read(0, 5, 0, 10, None), read(1, 5, 20, 30, None)];
        assert_eq!(check(&ordered, Tokens::SharedMayRepeat).len(), 1);
        // A writer shares its token with nobody.
        let mixed = vec![read(0, 5, 0, 10, None), grant(1, 5, 5, 15, None)];
        assert_eq!(check(&mixed, Tokens::SharedMayRepeat).len(), 1);
    }

    #[test]
    fn keys_are_independent() {
        let mut a = grant(0, 1, 0, 10, Some(100));
        a.key = "a".into();
        let mut b = grant(1, 1, 20, 60, None);
        b.key = "b".into();
        assert_eq!(unique(&[a, b]), vec![]);
    }
}
