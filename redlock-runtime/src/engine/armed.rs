//! [`Armed`]: the one drop guard that hands work to the background task when a request
//! is cut short (its future dropped, its reply lost, its outcome unknown).

/// Runs its job when dropped while armed: the caller arms it before a request whose
/// effect on the server would otherwise be left behind (an attempt that may have taken
/// the key, a writer's intent that may be registered, a release that may not have
/// happened), and disarms it once the outcome is known and nothing is left behind.
///
/// The job runs in `Drop`, so it must neither block nor panic: it hands a job to the
/// background task (an unbounded send) and returns. A job is built only when it runs,
/// so an armed guard costs nothing on the path that disarms it.
pub(crate) struct Armed<F: FnOnce()> {
    job: Option<F>,
    armed: bool,
}

impl<F: FnOnce()> Armed<F> {
    /// A guard that runs `job` if dropped before [`disarm`](Self::disarm).
    pub(crate) fn new(job: F) -> Self {
        Self {
            job: Some(job),
            armed: true,
        }
    }

    /// A guard that runs `job` only if dropped after [`arm`](Self::arm).
    pub(crate) fn disarmed(job: F) -> Self {
        Self {
            job: Some(job),
            armed: false,
        }
    }

    /// From now on, dropping the guard runs its job.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// From now on, dropping the guard does nothing (until armed again).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<F: FnOnce()> Drop for Armed<F> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(job) = self.job.take() {
            job();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn runs_its_job_only_when_dropped_armed() {
        let ran = Cell::new(0);
        drop(Armed::new(|| ran.set(ran.get() + 1)));
        assert_eq!(ran.get(), 1);

        let mut guard = Armed::new(|| ran.set(ran.get() + 1));
        guard.disarm();
        drop(guard);
        assert_eq!(ran.get(), 1, "disarmed");

        drop(Armed::disarmed(|| ran.set(ran.get() + 1)));
        assert_eq!(ran.get(), 1, "never armed");

        let mut guard = Armed::disarmed(|| ran.set(ran.get() + 1));
        guard.arm();
        guard.disarm();
        guard.arm();
        drop(guard);
        assert_eq!(ran.get(), 2, "armed again");
    }
}
