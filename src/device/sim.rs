//! The faults of a simulated GPU: memory held by another process, failing free-memory samples, failing
//! allocations; applied now or when a sequence reaches a given length. Written as text for the CLI
//! (`--sim-fault 1:leave-free-mib=64@tokens=2048`, or one per line in a `--sim-faults` file).

use super::DeviceError;

const MIB: u64 = 1 << 20;

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Another process holds this many bytes (replaces the previous amount; 0 ends the pressure).
    PressureBytes(u64),
    /// Another process takes whatever leaves exactly this many bytes free now.
    LeaveFreeBytes(u64),
    /// The next k free-memory samples fail.
    FailSamples(u32),
    /// The next k allocations fail (as a driver's out-of-memory would).
    FailAllocs(u32),
    /// The GPU's context faults for good (an `emu` device; a sticky error such as an illegal address):
    /// every later call on it fails.
    FaultContext,
}

/// A fault aimed at device `device` of the set, now or at a sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    pub device: usize,
    pub fault: Fault,
    pub at_tokens: Option<usize>,
}

impl FaultSpec {
    /// Parses `DEVICE:WHAT=N[@tokens=T]` where WHAT is `pressure-mib`, `leave-free-mib`, `fail-samples`,
    /// `fail-allocs` or `fault-context` (=1; emu devices only).
    pub fn parse(s: &str) -> Result<FaultSpec, DeviceError> {
        let bad = |why: &str| DeviceError::BadFault { spec: s.to_owned(), why: why.to_owned() };
        let (body, at) = match s.trim().split_once('@') {
            Some((b, a)) => (b, Some(a)),
            None => (s.trim(), None),
        };
        let (dev, action) =
            body.split_once(':').ok_or_else(|| bad("expected DEVICE:WHAT=N, e.g. 1:pressure-mib=300"))?;
        let device: usize = dev.trim().parse().map_err(|_| bad("DEVICE is the device's index in --devices"))?;
        let (what, n) = action.split_once('=').ok_or_else(|| bad("expected WHAT=N"))?;
        let n: u64 = n.trim().parse().map_err(|_| bad("N is a whole number"))?;
        let count = || u32::try_from(n).map_err(|_| bad("count too large"));
        let fault = match what.trim() {
            "pressure-mib" => Fault::PressureBytes(n.saturating_mul(MIB)),
            "leave-free-mib" => Fault::LeaveFreeBytes(n.saturating_mul(MIB)),
            "fail-samples" => Fault::FailSamples(count()?),
            "fail-allocs" => Fault::FailAllocs(count()?),
            "fault-context" if n == 1 => Fault::FaultContext,
            "fault-context" => return Err(bad("fault-context takes =1")),
            _ => return Err(bad("WHAT is pressure-mib, leave-free-mib, fail-samples, fail-allocs or fault-context")),
        };
        let at_tokens = match at {
            None => None,
            Some(a) => {
                let t = a.trim().strip_prefix("tokens=").ok_or_else(|| bad("a trigger is @tokens=T"))?;
                Some(t.parse().map_err(|_| bad("T in @tokens=T is a whole number"))?)
            }
        };
        Ok(FaultSpec { device, fault, at_tokens })
    }

    /// Parses a fault file: one spec per line; blank lines and `#` comments are skipped.
    pub fn parse_file_text(text: &str) -> Result<Vec<FaultSpec>, DeviceError> {
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(FaultSpec::parse)
            .collect()
    }
}

/// A sim device's fault state.
#[derive(Default)]
pub(super) struct SimState {
    pressure_bytes: u64,
    fail_samples: u32,
    fail_allocs: u32,
    pub(super) scheduled: Vec<(usize, Fault)>,
}

impl SimState {
    /// Capacity minus Strata's bytes minus the other process's (never below zero: it cannot take what
    /// Strata holds).
    pub(super) fn true_free(&self, capacity_bytes: u64, allocated_bytes: u64) -> u64 {
        capacity_bytes.saturating_sub(allocated_bytes).saturating_sub(self.pressure_bytes)
    }

    /// A free-memory sample, or `None` when a sample fault is armed.
    pub(super) fn sample(&mut self, capacity_bytes: u64, allocated_bytes: u64) -> Option<u64> {
        if self.fail_samples > 0 {
            self.fail_samples -= 1;
            return None;
        }
        Some(self.true_free(capacity_bytes, allocated_bytes))
    }

    /// True (and one fewer armed) when a sample fault is armed.
    pub(super) fn take_sample_failure(&mut self) -> bool {
        if self.fail_samples > 0 {
            self.fail_samples -= 1;
            return true;
        }
        false
    }

    pub(super) fn take_alloc_failure(&mut self) -> bool {
        if self.fail_allocs > 0 {
            self.fail_allocs -= 1;
            return true;
        }
        false
    }

    pub(super) fn apply(&mut self, fault: Fault, capacity_bytes: u64, allocated_bytes: u64) {
        match fault {
            Fault::PressureBytes(b) => self.pressure_bytes = b,
            Fault::LeaveFreeBytes(b) => {
                self.pressure_bytes = capacity_bytes.saturating_sub(allocated_bytes).saturating_sub(b)
            }
            Fault::FailSamples(k) => self.fail_samples = k,
            Fault::FailAllocs(k) => self.fail_allocs = k,
            Fault::FaultContext => {}
        }
    }

    /// Takes the scheduled faults due at `tokens`, in order.
    pub(super) fn take_due(&mut self, tokens: usize) -> Vec<Fault> {
        let (due, later): (Vec<_>, Vec<_>) = self.scheduled.drain(..).partition(|(at, _)| *at <= tokens);
        self.scheduled = later;
        due.into_iter().map(|(_, f)| f).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fault_specs() {
        let f = FaultSpec::parse("1:leave-free-mib=64@tokens=2048").unwrap();
        assert_eq!(f, FaultSpec { device: 1, fault: Fault::LeaveFreeBytes(64 * MIB), at_tokens: Some(2048) });
        assert_eq!(FaultSpec::parse("0:fail-allocs=2").unwrap().fault, Fault::FailAllocs(2));
        assert_eq!(FaultSpec::parse(" 0 : pressure-mib = 300 ").unwrap().fault, Fault::PressureBytes(300 * MIB));
        for bad in ["", "1", "x:pressure-mib=1", "1:pressure=1", "1:fail-samples=-1", "1:fail-allocs=1@5"] {
            assert!(FaultSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
        let file = "# pressure on the second card\n1:pressure-mib=100\n\n0:fail-samples=1 # once\n";
        assert_eq!(FaultSpec::parse_file_text(file).unwrap().len(), 2);
    }
}
