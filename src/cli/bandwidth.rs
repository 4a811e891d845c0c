//! `strata bench --bandwidth`: the memory figures the speed of a GPU run is judged against. Per GPU of the
//! set: device memory bandwidth (a device-to-device copy, bytes read + written), host-to-device bandwidth
//! from pinned and from pageable memory, and the decode floor (weight bytes over device bandwidth: no
//! decoder reads its weights faster). For the model: parking a conversation's KV to host memory and
//! restoring it, in GB/s, against the pinned host-to-device figure.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use strata::device::cuda::gpu::{Buffer, Gpu};
use strata::device::Device;
use strata::model::{KvType, Model};
use strata::threadpool::ThreadPool;

const GB: f64 = 1e9;

#[derive(serde::Serialize)]
pub struct GpuBandwidth {
    pub device: String,
    pub name: String,
    /// Device memory: bytes read plus bytes written per second by a device-to-device copy.
    pub device_gbps: f64,
    pub h2d_pinned_gbps: f64,
    pub h2d_pageable_gbps: f64,
}

/// Seconds of the fastest of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// This machine's memory read bandwidth in GB/s with the pool's threads: each thread sums its share of a
/// 512 MiB buffer (far past any cache) of u64s; the best of 5 passes after one that faults the pages in.
/// The CPU's decode floor is the bytes one token reads over this.
pub fn measure_host(pool: &ThreadPool) -> f64 {
    const BYTES: usize = 512 << 20;
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let n_chunks = pool.n_threads();
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..n_chunks).map(|_| Default::default()).collect();
    let mut best_s = f64::INFINITY;
    for _ in 0..6 {
        let t = Instant::now();
        pool.run(n_chunks, |c| {
            let share = strata::threadpool::split_range(c, n_chunks, buf.len());
            // Eight independent lanes: the sum vectorizes and is bound by memory, not by an add chain.
            let mut lanes = [0u64; 8];
            for block in buf[share].chunks_exact(8) {
                for (l, &v) in lanes.iter_mut().zip(block) {
                    *l = l.wrapping_add(v);
                }
            }
            let sum = lanes.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            sums[c].store(sum, std::sync::atomic::Ordering::Relaxed);
        });
        best_s = best_s.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&sums);
    BYTES as f64 / best_s / GB
}

/// Bandwidths of `device`'s GPU over buffers of up to `max_bytes` (two on the device: a quarter of its
/// free memory at most).
pub fn measure_gpu(device: &Arc<Device>, max_bytes: u64) -> anyhow::Result<GpuBandwidth> {
    let gpu: &Arc<dyn Gpu> = device.gpu().context("not a GPU")?;
    let free = device.sample_free()?;
    let bytes = max_bytes.min(free / 4) & !0xfff;
    anyhow::ensure!(bytes >= 1 << 20, "{}: too little free memory to measure bandwidth", device.name());
    let (a, b) = (Buffer::device(gpu, bytes)?, Buffer::device(gpu, bytes)?);
    let pinned = Buffer::pinned_host(gpu, bytes)?;
    // SAFETY: pinned host memory of `bytes` bytes, mapped at the same address on the host; nothing else
    // uses it while this slice lives.
    let pinned_slice = unsafe { std::slice::from_raw_parts_mut(pinned.ptr() as *mut u8, bytes as usize) };
    pinned_slice.fill(1);
    let pageable = vec![1u8; bytes as usize];
    // SAFETY: `a` and `b` are live device buffers of `bytes` bytes each.
    let copy_once = || unsafe { gpu.dtod(b.ptr(), a.ptr(), bytes) };
    copy_once()?;
    gpu.synchronize()?;
    let copy = best(5, || {
        copy_once()?;
        Ok(gpu.synchronize()?)
    })?;
    let h2d_pinned = best(5, || Ok(a.write_at(0, pinned_slice)?))?;
    let h2d_pageable = best(5, || Ok(a.write_at(0, &pageable)?))?;
    Ok(GpuBandwidth {
        device: device.name(),
        name: gpu.describe(),
        device_gbps: 2.0 * bytes as f64 / copy / GB,
        h2d_pinned_gbps: bytes as f64 / h2d_pinned / GB,
        h2d_pageable_gbps: bytes as f64 / h2d_pageable / GB,
    })
}

#[derive(serde::Serialize)]
pub struct KvCopies {
    pub tokens: usize,
    pub bytes: u64,
    /// Park: KV pages to a new host snapshot; again into the buffers of the previous one.
    pub park_gbps: f64,
    pub park_reused_gbps: f64,
    /// Restore: the snapshot back into a new cache (page allocation included).
    pub restore_gbps: f64,
}

/// Parks and restores a `tokens`-position conversation of random tokens on `model`'s devices.
pub fn measure_kv(
    model: &Model,
    pool: &ThreadPool,
    kv: KvType,
    batch: usize,
    tokens: usize,
) -> anyhow::Result<KvCopies> {
    let mut seq = model.new_kv(kv, tokens)?;
    let ids: Vec<u32> = (0..tokens).map(|i| (i * 7919 % model.cfg.n_vocab) as u32).collect();
    for chunk in ids.chunks(batch.max(1)) {
        model.forward(pool, &mut seq, chunk, &[])?;
    }
    let bytes = seq.snapshot_bytes();
    let t = Instant::now();
    let mut snap = seq.snapshot()?;
    let park = t.elapsed().as_secs_f64();
    let park_reused = best(3, || {
        let prev = std::mem::replace(&mut snap, seq.snapshot()?);
        snap = seq.snapshot_into(Some(prev))?;
        Ok(())
    })? / 2.0;
    drop(seq);
    let mut back = model.new_kv(kv, tokens)?;
    back.restore(&snap, tokens)?; // warm-up: first use of the pages' memory
    let restore = best(3, || {
        back.clear();
        Ok(back.restore(&snap, tokens)?)
    })?;
    Ok(KvCopies {
        tokens,
        bytes,
        park_gbps: bytes as f64 / park / GB,
        park_reused_gbps: bytes as f64 / park_reused / GB,
        restore_gbps: bytes as f64 / restore / GB,
    })
}
