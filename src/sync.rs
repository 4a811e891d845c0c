//! Locks taken whatever a panic did: `m.lock_unpoisoned()` is `m.lock()` that takes a poisoned lock as it
//! is, and `c.wait_unpoisoned(guard)` the same for a condition variable's wait. Every lock of the engine guards data that stays consistent between statements (a ring, a table, a
//! counter replaced whole), so a thread that panicked while holding one must not take down the threads
//! that share it; the panic itself is reported where it happened.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

pub trait LockUnpoisoned<T: ?Sized> {
    /// The guard, whether or not another thread panicked while holding the lock.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockUnpoisoned<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub trait WaitUnpoisoned {
    /// Waits for a notification and takes the lock back, whether or not another thread panicked holding it.
    fn wait_unpoisoned<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
}

impl WaitUnpoisoned for Condvar {
    fn wait_unpoisoned<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 2;
            panic!("poisons the lock");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_unpoisoned(), 2);
    }
}
