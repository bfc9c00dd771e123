//! A contended workload for the failure scenarios: many tasks on several managers lock a
//! few keys over and over and run a fenced critical section under each lock, recording
//! every section for the history checker, every error by kind, and when each section
//! completed (for throughput).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockManager, LockOptions};
use redlock_faults::clock::now_ns;
use redlock_faults::history::{History, Report, Section};
use redlock_faults::resource::{Begin, Resource, State};

/// What the workload records, per key.
pub struct Workload {
    pub keys: Vec<String>,
    pub histories: Vec<History>,
    pub resources: Vec<Resource>,
    errors: Mutex<BTreeMap<&'static str, usize>>,
    error_log: Mutex<Vec<(Instant, String)>>,
    completions: Mutex<Vec<Instant>>,
    stop: AtomicBool,
}

impl Workload {
    /// One fenced resource per key on the server at `resource_url`.
    pub async fn new(keys: Vec<String>, resource_url: &str) -> Arc<Self> {
        let mut resources = Vec::new();
        for k in &keys {
            resources.push(Resource::open(resource_url, k).await.expect("resource"));
        }
        Arc::new(Self {
            histories: keys.iter().map(|_| History::new()).collect(),
            keys,
            resources,
            errors: Mutex::new(BTreeMap::new()),
            error_log: Mutex::new(Vec::new()),
            completions: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        })
    }

    /// Starts `tasks` tasks on each manager; they run until [`stop`](Self::stop) or
    /// `limit`, whichever comes first.
    pub fn start(
        self: &Arc<Self>,
        managers: &[LockManager],
        tasks: usize,
        opts: LockOptions,
        limit: Duration,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let until = Instant::now() + limit;
        let mut handles = Vec::new();
        for (m, locks) in managers.iter().enumerate() {
            for t in 0..tasks {
                let (w, locks, opts) = (self.clone(), locks.clone(), opts.clone());
                let client = format!("m{m}t{t}");
                handles.push(tokio::spawn(async move {
                    // Bounded by the stop flag and the time limit.
                    while !w.stop.load(Ordering::Relaxed) && Instant::now() < until {
                        w.one(&locks, &client, opts.clone()).await;
                    }
                }));
            }
        }
        handles
    }

    /// Asks the tasks to finish their current section and stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    async fn one(&self, locks: &LockManager, client: &str, opts: LockOptions) {
        let k = fastrand::usize(0..self.keys.len());
        let guard = match locks.lock_with(&self.keys[k], opts).await {
            Ok(g) => g,
            Err(e) => {
                *self.errors.lock().unwrap().entry(e.kind()).or_default() += 1;
                self.error_log
                    .lock()
                    .unwrap()
                    .push((Instant::now(), e.to_string()));
                // Errors can be instant (a dead node): do not spin.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return;
            }
        };
        let token = guard.fencing_token();
        let mut s = Section::new(client, token, now_ns(), 0);
        let at = now_ns();
        let resource = &self.resources[k];
        match resource.begin(token).await {
            Ok(Begin::Granted(v)) => {
                s.begins.push((at, true));
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..8))).await;
                match resource.commit(token, v + 1).await {
                    Ok(ok) => s.commits.push((now_ns(), ok)),
                    Err(_) => s.commit_unknown = true,
                }
            }
            Ok(Begin::Rejected(_)) => s.begins.push((at, false)),
            Err(_) => {}
        }
        let held = guard.is_held();
        s.exit = now_ns();
        let released = guard.release().await;
        s.lost = !held || matches!(released, Err(LockError::Lost { .. }));
        if let Err(e) = &released {
            *self
                .errors
                .lock()
                .unwrap()
                .entry(match e {
                    LockError::Lost { .. } => "release: lost",
                    _ => "release: other",
                })
                .or_default() += 1;
        }
        self.histories[k].record(s);
        self.completions.lock().unwrap().push(Instant::now());
    }

    /// Errors by kind.
    pub fn errors(&self) -> BTreeMap<&'static str, usize> {
        self.errors.lock().unwrap().clone()
    }

    /// Every acquisition error, with when it happened.
    pub fn error_log(&self) -> Vec<(Instant, String)> {
        self.error_log.lock().unwrap().clone()
    }

    /// Sections completed within `[from, to)`.
    pub fn completed_between(&self, from: Instant, to: Instant) -> usize {
        self.completions
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t >= from && t < to)
            .count()
    }

    /// Settles unknown commits with each resource's journal, checks every key's history,
    /// and sums the reports; also returns every resource's problems.
    pub async fn check(&self) -> (Report, Vec<String>, Vec<State>) {
        let mut total = Report::default();
        let mut problems = Vec::new();
        let mut states = Vec::new();
        for (h, r) in self.histories.iter().zip(&self.resources) {
            let state = r.state().await.expect("resource state");
            h.settle(&state.accepted);
            let report = h.check();
            total.sections += report.sections;
            total.overlaps += report.overlaps;
            total.excused += report.excused;
            total.exclusion_violations += report.exclusion_violations;
            total.token_violations += report.token_violations;
            total.violations.extend(report.violations);
            problems.extend(state.problems());
            states.push(state);
        }
        (total, problems, states)
    }
}
