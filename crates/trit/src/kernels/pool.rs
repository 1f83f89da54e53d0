//! Persistent worker pool behind `crate::threadpool` (it lives here because handing a borrowed
//! closure to long-lived threads needs one `unsafe` lifetime erasure, and `unsafe` is confined to
//! `kernels/`).
//!
//! Why not rayon per matmul: decode issues ~200 small matmuls per token and a fork/join costs
//! 10–34 µs against 20–70 µs kernels. Here a job is published by bumping a generation number;
//! workers that finished the previous job spin on it for a short while (so back-to-back matmuls
//! start within a cache-line transfer) and only then park on a condvar.
//!
//! A job is split into `n_threads` parts. The caller runs part 0, and the other parts are
//! *claimed* (one atomic compare-and-swap each) by whichever thread gets there first, the caller
//! included. So a worker that is descheduled or still waking up never stalls a matmul: the caller
//! takes its part, and the late worker finds nothing left and goes back to waiting. The caller
//! only waits for parts that were actually claimed.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The closure of the job in flight, with its borrow lifetime erased (see `ThreadPool::run`).
type JobPtr = *const (dyn Fn(usize, usize) + Sync + 'static);

/// How long an idle thread spins before parking. Long enough to bridge the gap between two
/// matmuls of one decode step (norms, attention, RoPE run on the caller in between), short
/// enough not to burn a core between requests.
fn spin_budget() -> Duration {
    let us = std::env::var("TRIT_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(200);
    Duration::from_micros(us)
}

/// `state` packs the job generation (high 32 bits) and the next unclaimed part (low 32 bits).
const PART_BITS: u32 = 32;
const PART_MASK: u64 = (1 << PART_BITS) - 1;

struct Shared {
    n_threads: usize,
    /// Generation and next unclaimed part of the current job.
    state: AtomicU64,
    /// Written by the caller before `state` is published (SeqCst store), read by a worker only
    /// after it claimed a part of that job (compare-and-swap on `state`); cleared only after
    /// every part has finished.
    job: UnsafeCell<Option<JobPtr>>,
    /// Parts of the current job that have finished.
    done: AtomicUsize,
    shutdown: AtomicBool,
    /// Parked workers (Dekker-style handshake with `state`, both SeqCst).
    sleepers: AtomicUsize,
    wake_lock: Mutex<()>,
    wake_cv: Condvar,
    /// Whether the caller parked waiting for `done == n_threads`.
    caller_sleeping: AtomicBool,
    done_lock: Mutex<()>,
    done_cv: Condvar,
    /// First panic payload of the current job, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    spin: Duration,
}

// SAFETY: `job` is the only non-Sync field; see its comment for the protocol that orders every
// access to it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claims the next part of the current job, if any: (generation, part).
    fn claim(&self) -> Option<(u64, usize)> {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let part = (s & PART_MASK) as usize;
            if part >= self.n_threads {
                return None;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some((s >> PART_BITS, part)),
                Err(now) => s = now,
            }
        }
    }

    /// Runs part `part` of the current job and counts it as done.
    fn run_part(&self, part: usize) {
        // SAFETY: the job was stored before its generation was published, and it stays valid
        // until `done` reaches n_threads, which cannot happen before this part finishes.
        let job = unsafe { *self.job.get() };
        if let Some(job) = job {
            // SAFETY: as above, the closure outlives this call.
            let f = unsafe { &*job };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(part, self.n_threads))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
        }
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.n_threads
            && self.caller_sleeping.load(Ordering::SeqCst)
        {
            let _l = self.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.done_cv.notify_all();
        }
    }
}

thread_local! {
    /// Address of the pool whose job this thread is executing (0 = none); nested `run` calls on
    /// the same pool execute serially instead of deadlocking.
    static ACTIVE_POOL: Cell<usize> = const { Cell::new(0) };
}

/// A fixed set of persistent threads; `run` executes a closure once for each part.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total, the calling thread included (0 is treated as 1).
    pub fn new(n_threads: usize) -> Self {
        Self::with_spin(n_threads, spin_budget())
    }

    /// `new` with an explicit spin-before-park budget (tests use 0 to exercise parking).
    pub fn with_spin(n_threads: usize, spin: Duration) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            // No job yet: generation 0 with every part already taken.
            state: AtomicU64::new(n_threads as u64),
            job: UnsafeCell::new(None),
            done: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake_lock: Mutex::new(()),
            wake_cv: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            panic: Mutex::new(None),
            spin,
        });
        let workers = (1..n_threads)
            .map(|idx| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("trit-worker-{idx}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("failed to spawn a thread-pool worker")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Calls `f(i, n_threads)` once for every part `i` in `0..n_threads` and returns when all
    /// calls have returned. Part 0 runs on the caller; the others run on whichever pool thread
    /// claims them first (normally one part per thread). A panic in any part is re-raised here
    /// after every part has finished, and the pool stays usable.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        let pool_id = Arc::as_ptr(&self.shared) as usize;
        if n == 1 || ACTIVE_POOL.with(|a| a.get()) == pool_id {
            // Single thread, or nested inside one of our own jobs: the workers are busy (or are
            // us), so run every part here.
            for i in 0..n {
                f(i, n);
            }
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: erasing the borrow's lifetime is sound because this function does not return
        // (not even by unwinding: every part runs under catch_unwind) before all parts have
        // finished, and no thread dereferences the pointer without holding an unfinished part.
        let ptr: JobPtr = unsafe {
            std::mem::transmute::<
                &(dyn Fn(usize, usize) + Sync),
                &'static (dyn Fn(usize, usize) + Sync),
            >(f)
        };
        // SAFETY: no part of the previous job is unfinished, so nobody reads `job` now.
        unsafe { *sh.job.get() = Some(ptr) };
        sh.done.store(0, Ordering::Relaxed);
        let generation = (sh.state.load(Ordering::Relaxed) >> PART_BITS) + 1;
        // Part 0 is reserved for the caller.
        sh.state
            .store((generation << PART_BITS) | 1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake_cv.notify_all();
        }

        let prev = ACTIVE_POOL.with(|a| a.replace(pool_id));
        sh.run_part(0);
        while let Some((_, part)) = sh.claim() {
            sh.run_part(part);
        }
        ACTIVE_POOL.with(|a| a.set(prev));

        self.wait_parts();
        // SAFETY: every part has finished; late workers find no part to claim.
        unsafe { *sh.job.get() = None };
        if let Some(p) = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
    }

    fn wait_parts(&self) {
        let sh = &*self.shared;
        let n = sh.n_threads;
        let start = Instant::now();
        let mut spins = 0u32;
        while sh.done.load(Ordering::Acquire) != n {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || start.elapsed() < sh.spin {
                std::hint::spin_loop();
                continue;
            }
            let mut guard = sh.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.caller_sleeping.store(true, Ordering::SeqCst);
            while sh.done.load(Ordering::SeqCst) != n {
                guard = sh.done_cv.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            sh.caller_sleeping.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        // A new generation with no claimable part wakes everyone without giving them work.
        let generation = (sh.state.load(Ordering::Relaxed) >> PART_BITS) + 1;
        sh.state.store(
            (generation << PART_BITS) | sh.n_threads as u64,
            Ordering::SeqCst,
        );
        {
            let _l = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker_loop(sh: &Shared) {
    let pool_id = sh as *const Shared as usize;
    ACTIVE_POOL.with(|a| a.set(pool_id));
    let mut seen = 0;
    loop {
        seen = wait_for_job(sh, seen);
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        while let Some((generation, part)) = sh.claim() {
            seen = seen.max(generation);
            sh.run_part(part);
        }
    }
}

/// Spins, then parks, until the job generation differs from `seen`; returns the new one.
fn wait_for_job(sh: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let now = sh.state.load(Ordering::Acquire) >> PART_BITS;
        if now != seen {
            return now;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) || start.elapsed() < sh.spin {
            std::hint::spin_loop();
            continue;
        }
        let mut guard = sh.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let now = sh.state.load(Ordering::SeqCst) >> PART_BITS;
            if now != seen {
                sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                return now;
            }
            guard = sh.wake_cv.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Number of physical cores this process may use: distinct (package, core) pairs in sysfs
/// topology, capped by `available_parallelism` (affinity / cgroup limits). SMT siblings share
/// the integer dot-product units, so one thread per core is the right default for these kernels.
pub fn default_threads() -> usize {
    let avail = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    match physical_cores() {
        Some(p) if p > 0 => p.min(avail),
        _ => avail,
    }
}

fn physical_cores() -> Option<usize> {
    let mut cores = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str()?;
        let Some(num) = name.strip_prefix("cpu") else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let topo = entry.path().join("topology");
        let read = |f: &str| {
            std::fs::read_to_string(topo.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        // Offline CPUs have no topology directory; skip them.
        if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((pkg, core));
        }
    }
    Some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_exactly_once_per_call() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let caller = std::thread::current().id();
            for _ in 0..2000 {
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    if i == 0 {
                        assert_eq!(
                            std::thread::current().id(),
                            caller,
                            "part 0 runs on the caller"
                        );
                    }
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            for c in &counts {
                assert_eq!(c.load(Ordering::Relaxed), 2000);
            }
        }
    }

    #[test]
    fn parallel_sum_is_correct_and_sees_caller_data() {
        let pool = ThreadPool::new(3);
        let data: Vec<u64> = (0..100_000).collect();
        for round in 0..200u64 {
            let total = AtomicU64::new(0);
            pool.run(&|i, n| {
                let chunk = data.len().div_ceil(n);
                let s: u64 = data
                    .iter()
                    .skip(i * chunk)
                    .take(chunk)
                    .map(|v| v + round)
                    .sum();
                total.fetch_add(s, Ordering::Relaxed);
            });
            let expect: u64 = data.iter().map(|v| v + round).sum();
            assert_eq!(total.load(Ordering::Relaxed), expect);
        }
    }

    #[test]
    fn nested_runs_execute_serially_without_deadlock() {
        let outer = ThreadPool::new(2);
        let inner = ThreadPool::new(3);
        let hits = AtomicUsize::new(0);
        outer.run(&|_, _| {
            // Same pool: nested, must run all indices inline.
            outer.run(&|_, n| {
                assert_eq!(n, 2);
                hits.fetch_add(1, Ordering::Relaxed);
            });
            // Another pool from inside a job (both outer threads contend for it).
            inner.run(&|_, _| {
                hits.fetch_add(10, Ordering::Relaxed);
            });
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2 * 2 + 2 * 30);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::with_spin(2, Duration::ZERO);
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(2));
            let hits = AtomicUsize::new(0);
            pool.run(&|_, _| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 2);
        }
    }

    #[test]
    fn panics_propagate_and_pool_survives() {
        let pool = ThreadPool::new(2);
        for bad in [0usize, 1] {
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|i, _| {
                    if i == bad {
                        panic!("job {i} fails");
                    }
                })
            }));
            assert!(r.is_err(), "panic on thread {bad} must reach the caller");
        }
        let hits = AtomicUsize::new(0);
        pool.run(&|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn concurrent_callers_share_one_pool() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..300 {
                        pool.run(&|_, _| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 300 * 2);
    }

    #[test]
    fn default_threads_is_sane() {
        let n = default_threads();
        let avail = std::thread::available_parallelism()
            .map(|v| v.get())
            .unwrap_or(1);
        assert!(n >= 1 && n <= avail, "{n} threads with {avail} available");
    }
}
