//! Where the CPU forward pass spends its time, by kind of work (`strata bench --type-report`).
//!
//! A process-wide switch and one nanosecond counter per `Part`: the forward pass wraps each kind of work in
//! a `time(part)` guard, which reads the clock only while the switch is on (one relaxed atomic load
//! otherwise). The bench turns it on for its timed repetitions, reads the counters with `take`, and prints
//! each part's share beside the weight types its matrices use.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A kind of work in the forward pass (its index in `Part::ALL` is its discriminant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Q, K, V and output projections (activation quantization included).
    AttnProducts,
    /// RoPE, KV writes and the attention itself.
    Attention,
    /// Gate, up and down projections (activation quantization and SwiGLU included).
    FfnProducts,
    /// The output head's vocabulary projection (activation quantization included).
    Output,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::AttnProducts, Part::Attention, Part::FfnProducts, Part::Output];

    pub fn name(self) -> &'static str {
        match self {
            Part::AttnProducts => "attention products",
            Part::Attention => "attention",
            Part::FfnProducts => "FFN products",
            Part::Output => "output",
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Turns the timers on or off (and clears the counters when turning on).
pub fn set_enabled(on: bool) {
    if on {
        take();
    }
    ON.store(on, Ordering::Relaxed);
}

/// Seconds per part since the last `take` (or `set_enabled(true)`), in `Part::ALL` order; clears them.
pub fn take() -> [f64; 4] {
    std::array::from_fn(|i| NANOS[i].swap(0, Ordering::Relaxed) as f64 / 1e9)
}

/// A running timer: adds the time since its start to its part when dropped.
pub struct Timer(Option<(Part, Instant)>);

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((part, start)) = self.0 {
            NANOS[part as usize].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// Times `part` until the returned guard drops (nothing while the timers are off).
#[inline]
pub fn time(part: Part) -> Timer {
    Timer(ON.load(Ordering::Relaxed).then(|| (part, Instant::now())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_count_only_while_on_and_per_part() {
        set_enabled(false);
        take();
        {
            let _t = time(Part::Output);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(take(), [0.0; 4], "off: nothing counted");
        set_enabled(true);
        {
            let _t = time(Part::Attention);
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        let got = take();
        set_enabled(false);
        // (Other tests may run forward passes on other threads meanwhile and add to any part; they cannot
        // take this timer's 3 ms away.)
        assert!(got[Part::Attention as usize] >= 0.003, "attention counted {got:?}");
        assert!(take()[Part::Attention as usize] < 0.003, "take clears");
    }
}
