//! redlock's fault-injection suite: real redis-server processes, real holder processes,
//! killed (-9), paused (SIGSTOP), cut off by a proxy, failed over; every contended workload
//! checked by the history checker of `redlock_faults::history`.
//!
//! One module per scenario of issue 8, plus `s10_nemesis` (issue 11: random operations of
//! several clients under random faults, checked for overlaps of belief and fencing
//! order); each test prints what it observed (rounds, overlaps, violations), so
//! `cargo test -p redlock-faults -- --nocapture` is the report.
//!
//! * The default run is bounded (a few rounds per scenario, well under five minutes on two
//!   cores). `REDLOCK_SOAK=1` runs many more rounds of every scenario.
//! * The scenarios that start several servers or measure deadlines take a global async
//!   lock ([`support::HEAVY`]) so they do not run at the same time.
//! * Every loop is bounded in count and time; processes are stopped by pid, never by name.

mod support;
mod workload;

mod s10_nemesis;
mod s11_leader;
mod s1_kill;
mod s2_pause;
mod s3_partition;
mod s4_sentinel;
mod s5_redlock;
mod s6_cluster;
mod s7_cancel;
mod s8_hostile;
mod s9_acl;
