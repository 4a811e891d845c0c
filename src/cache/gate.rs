//! The restore gate: a restore that needs `need_d` bytes on device d is admitted only if, on every device of
//! the split, `free_d - need_d >= reserve_d` with `free_d` sampled now, plus what the live sequence holds
//! there (it is released only once the restore is admitted). A device whose sample fails does not refuse
//! (the restore goes ahead as before the gate existed); the failure is reported.

use std::sync::Arc;

use crate::device::Device;
use crate::telemetry::Telemetry;

/// What a restore needs on one device, and what it frees there first (the live sequence's KV).
#[derive(Clone, Debug)]
pub struct Need {
    pub device: Arc<Device>,
    pub need_bytes: u64,
    pub credit_bytes: u64,
}

/// The gate's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateDecision {
    /// Restore. `failed_samples`: devices whose sample failed (admitted without one).
    Admit { failed_samples: Vec<usize> },
    /// Do not restore: the first device that would fall under its reserve (`free_bytes` includes the credit).
    Refuse { device: usize, free_bytes: u64, need_bytes: u64, reserve_bytes: u64 },
}

/// Samples every device in `needs` (each device of the split with the bytes the restore needs there),
/// records the samples in `telemetry`, and decides.
pub fn decide(needs: &[Need], telemetry: &Telemetry) -> GateDecision {
    let mut failed_samples = Vec::new();
    let mut refuse = None;
    for Need { device, need_bytes, credit_bytes } in needs {
        match device.sample_free() {
            Ok(sampled) => {
                telemetry.sample(device.index, Some(sampled), device.total_bytes());
                let free_bytes = sampled.saturating_add(*credit_bytes);
                let ok = free_bytes.checked_sub(*need_bytes).is_some_and(|left| left >= device.reserve_bytes);
                if !ok && refuse.is_none() {
                    refuse = Some(GateDecision::Refuse {
                        device: device.index,
                        free_bytes,
                        need_bytes: *need_bytes,
                        reserve_bytes: device.reserve_bytes,
                    });
                }
            }
            Err(_) => {
                telemetry.sample(device.index, None, device.total_bytes());
                failed_samples.push(device.index);
            }
        }
    }
    refuse.unwrap_or(GateDecision::Admit { failed_samples })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Fault, Purpose};

    const MIB: u64 = 1 << 20;

    #[test]
    fn admits_only_when_every_device_keeps_its_reserve() {
        let t = Telemetry::new();
        let d0 = Device::sim(0, 100 * MIB, 10 * MIB);
        let d1 = Device::sim(1, 100 * MIB, 10 * MIB);
        let _held = d1.alloc(Purpose::Weights, 60 * MIB).unwrap();
        let n = |d: &Arc<Device>, need_bytes, credit_bytes| Need { device: d.clone(), need_bytes, credit_bytes };
        let needs = [n(&d0, 50 * MIB, 0), n(&d1, 30 * MIB, 0)];
        assert_eq!(decide(&needs, &t), GateDecision::Admit { failed_samples: vec![] });
        // What the live sequence holds there counts as free: it is released once admitted.
        assert_eq!(decide(&[n(&d1, 40 * MIB, 10 * MIB)], &t), GateDecision::Admit { failed_samples: vec![] });
        let needs = [n(&d0, 50 * MIB, 0), n(&d1, 31 * MIB, 0)];
        assert_eq!(
            decide(&needs, &t),
            GateDecision::Refuse { device: 1, free_bytes: 40 * MIB, need_bytes: 31 * MIB, reserve_bytes: 10 * MIB }
        );
        // Need beyond free: refused, no underflow.
        assert!(matches!(decide(&[n(&d0, 200 * MIB, 0)], &t), GateDecision::Refuse { device: 0, .. }));
        // A failed sample admits and is reported; the other devices still decide.
        d1.inject(Fault::FailSamples(1)).unwrap();
        assert_eq!(decide(&needs, &t), GateDecision::Admit { failed_samples: vec![1] });
        d1.inject(Fault::FailSamples(1)).unwrap();
        assert!(matches!(decide(&[n(&d0, 95 * MIB, 0), n(&d1, 1, 0)], &t), GateDecision::Refuse { device: 0, .. }));
        let (samples, _) = t.since(-1.0);
        assert_eq!(samples.len(), 10, "every decision records the samples it used");
        assert!(samples.iter().any(|s| s.free_bytes.is_none()));
    }
}
