//! A small fixed thread pool for the forward pass: `run(n_chunks, |chunk| ..)` runs a closure once for every
//! chunk index, on all threads at once, and returns when every chunk is done; and `SharedMut`, the view
//! through which a region's chunks write disjoint parts of one slice.
//!
//! Why not rayon: one generated token makes about 200 parallel regions of a few microseconds each, and a
//! work-stealing pool's wake-up cost is of the same order. Here workers spin briefly on an epoch counter
//! between regions (back-to-back regions cost well under a microsecond) and sleep on a condvar when the
//! engine goes idle, so an idle Strata burns no CPU. Chunks are claimed from an atomic counter, so a
//! worker that the OS has descheduled (another program busy on the core) never holds a region up: the
//! caller's thread does its share. Results do not depend on which thread ran a chunk.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::sync::{LockUnpoisoned, WaitUnpoisoned};

/// Iterations a worker spins waiting for the next region before it sleeps (about 50-200 us).
const SPIN_ITERS: u32 = 20_000;
/// Set in `entered` when a region is closed to newcomers.
const CLOSED: usize = 1 << (usize::BITS - 1);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// Incremented once per region; workers look for work when they see it change.
    epoch: AtomicU64,
    /// The current job; valid while the region is open or a worker that entered it is still inside.
    job: UnsafeCell<Option<*const Job>>,
    n_chunks: AtomicUsize,
    next_chunk: AtomicUsize,
    done_chunks: AtomicUsize,
    /// Workers inside the current region, plus the CLOSED bit once the owner closed it.
    entered: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the pool's owner while the region is closed and no worker is inside it
// (`entered == CLOSED`), and read by workers only between entering an open region and leaving it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A pool of `n_threads` threads (the caller's thread counts as one of them).
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Set while a region runs.
    busy: AtomicBool,
}

/// Clears `busy` when a region ends, also by a panic.
struct BusyGuard<'a>(&'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl ThreadPool {
    /// A pool that runs regions on `n_threads` threads (at least 1). If the system refuses to start a
    /// thread, the pool runs with those it has (and says so on stderr).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            n_chunks: AtomicUsize::new(0),
            next_chunk: AtomicUsize::new(0),
            done_chunks: AtomicUsize::new(0),
            entered: AtomicUsize::new(CLOSED),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut handles = Vec::with_capacity(n_threads - 1);
        for idx in 1..n_threads {
            let shared = shared.clone();
            match std::thread::Builder::new().name(format!("strata-worker-{idx}")).spawn(move || worker(shared)) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    eprintln!("strata: warning: could not start worker thread {idx} ({e}); using {idx} threads");
                    break;
                }
            }
        }
        let n_threads = handles.len() + 1;
        ThreadPool { shared, handles, n_threads, busy: AtomicBool::new(false) }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// A good number of chunks for `n_units` units of equal work: a few per thread, so a late thread
    /// costs little, but not so many that claiming them costs more than the work.
    pub fn chunks_for(&self, n_units: usize) -> usize {
        if self.n_threads == 1 {
            return n_units.min(1);
        }
        n_units.min(self.n_threads * 8)
    }

    /// Runs `f(chunk)` once for every `chunk` in `0..n_chunks`, spread over the pool's threads, and returns
    /// when all calls have returned. A panic in any call is re-raised here.
    pub fn run<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        // One region at a time: a call from inside a job, or from a second thread while a region runs,
        // is done serially on the caller's thread instead of touching the shared slot.
        if self.n_threads == 1 || n_chunks <= 1 || self.busy.swap(true, Ordering::Acquire) {
            (0..n_chunks).for_each(f);
            return;
        }
        let _busy = BusyGuard(&self.busy);
        let s = &*self.shared;
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: workers use the pointer only inside the region, and this function returns only after
        // closing the region and seeing every worker that entered it leave, so `f` outlives every use.
        let job: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(job) };
        unsafe { *s.job.get() = Some(job) };
        s.n_chunks.store(n_chunks, Ordering::SeqCst);
        s.next_chunk.store(0, Ordering::SeqCst);
        s.done_chunks.store(0, Ordering::SeqCst);
        // Open: clear only the CLOSED bit, so a late worker's passing +1/-1 stays balanced.
        s.entered.fetch_and(!CLOSED, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock_unpoisoned();
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim_chunks(s, job)));
        wait_until(|| s.done_chunks.load(Ordering::Acquire) >= n_chunks || mine.is_err());
        s.entered.fetch_or(CLOSED, Ordering::SeqCst);
        wait_until(|| s.entered.load(Ordering::Acquire) == CLOSED);
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a strata worker thread panicked");
        }
    }
}

/// Spins on `done`, yielding the core after a while so a descheduled worker can finish its chunk.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins += 1;
        if spins < 2_000 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Claims and runs chunks of the current region until none are left.
fn claim_chunks(s: &Shared, job: *const Job) {
    // SAFETY: the caller is inside the region (the owner, or a worker counted in `entered`).
    let job: &Job = unsafe { &*job };
    let n = s.n_chunks.load(Ordering::Acquire);
    loop {
        let c = s.next_chunk.fetch_add(1, Ordering::AcqRel);
        if c >= n {
            return;
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(c)));
        if r.is_err() {
            s.panicked.store(true, Ordering::SeqCst);
        }
        s.done_chunks.fetch_add(1, Ordering::AcqRel);
    }
}

/// Range `idx` of `0..n` split into `parts` contiguous parts.
pub fn split_range(idx: usize, parts: usize, n: usize) -> std::ops::Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = idx * base + idx.min(extra);
    let len = base + usize::from(idx < extra);
    start..start + len
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin first, then sleep.
        let mut spins = 0;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.lock.lock_unpoisoned();
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = if s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                s.wake.wait_unpoisoned(guard)
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            spins = 0;
        }
        // Enter the region unless it is already closed (then its work is done without us).
        if s.entered.fetch_add(1, Ordering::SeqCst) & CLOSED != 0 {
            s.entered.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        // SAFETY: we are counted in `entered` of an open region, so the job stays valid until we leave.
        if let Some(job) = unsafe { *s.job.get() } {
            claim_chunks(&s, job);
        }
        s.entered.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A raw view of a mutable slice shared by threads that write disjoint elements.
/// It borrows the slice for `'a`, so it cannot outlive it.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Clone for SharedMut<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<'_, T> {}

// SAFETY: it only hands out `&mut T` to disjoint parts (the contract of `slice`), which is what `&mut [T]`
// split across threads allows when `T: Send`.
unsafe impl<T: Send> Send for SharedMut<'_, T> {}
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        SharedMut { ptr: s.as_mut_ptr(), len: s.len(), _borrow: std::marker::PhantomData }
    }
    /// The sub-slice `start..start + len`.
    ///
    /// # Safety
    /// No two threads may hold overlapping sub-slices at the same time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "SharedMut::slice out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock_unpoisoned();
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_exactly_once() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 2, 7, 100] {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..200 {
                pool.run(n, |c| {
                    counts[c].fetch_add(1, Ordering::Relaxed);
                });
            }
            for c in &counts {
                assert_eq!(c.load(Ordering::Relaxed), 200);
            }
        }
    }

    #[test]
    fn regions_after_sleep_still_run() {
        let pool = ThreadPool::new(2);
        let n = AtomicUsize::new(0);
        pool.run(4, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        pool.run(4, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn more_than_one_thread_takes_part() {
        let pool = ThreadPool::new(2);
        let ids = Mutex::new(std::collections::HashSet::new());
        for _ in 0..200 {
            pool.run(64, |_| {
                std::thread::sleep(std::time::Duration::from_micros(20));
                ids.lock().unwrap().insert(std::thread::current().id());
            });
        }
        assert_eq!(ids.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_region_started_inside_a_region_runs_serially() {
        let pool = ThreadPool::new(2);
        let n = AtomicUsize::new(0);
        pool.run(4, |_| {
            pool.run(3, |_| {
                n.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(n.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn split_range_covers_everything_once() {
        for parts in 1..5 {
            for n in 0..20 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(i, parts, n);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn a_panicking_chunk_is_reported_not_hung() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(8, |c| {
                if c == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool is still usable.
        let n = AtomicUsize::new(0);
        pool.run(3, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 3);
    }
}
