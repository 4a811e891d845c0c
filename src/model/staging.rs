//! Copies from a GPU into pageable host memory through two pinned host buffers: how a conversation's KV
//! crosses when it is parked. A copy into pageable memory goes at a fraction of the bus's speed and waits
//! for itself, and a parked cache is many pages (one copy each where they are not adjacent): on an H200 that
//! parked at 0.8-1.0 GB/s against 55 GB/s for pinned memory. Here a piece crosses into a pinned buffer by an
//! asynchronous copy or, for a layer's pages, by one gathering kernel (`kv_gather`; kernels write pinned
//! memory at 51 GB/s there), with one wait per buffer, and the memcpy from one buffer to the pageable side
//! overlaps the transfer of the other. The buffers are kept by their owner (a sequence's KV cache): pinning
//! memory is slow (0.7 ms per MiB there).

use std::sync::Arc;

use crate::device::cuda::gpu::{launch, Arg, Dims, Gpu, GpuError};
use crate::device::{Allocation, Device, DeviceError, Purpose};

/// Bytes of each of the two buffers, at most.
pub const STAGING_BYTES: usize = 16 << 20;

/// Two pinned buffers on the host's ledger (as `Purpose::Staging`) for copies with one GPU.
pub struct Staging {
    gpu: Arc<dyn Gpu>,
    bufs: [Allocation; 2],
    cap: usize,
}

/// Where a piece of a download comes from.
#[derive(Clone, Copy)]
pub enum Source {
    /// Device bytes from this address on.
    At(u64),
    /// Rows from `row0` on of one side of a layer's pages, through its page table on the device (rows of
    /// `row_bytes`; the piece is a whole number of them).
    Pages { table: u64, row0: usize, row_bytes: usize },
}

/// A stretch of one piece that goes through one buffer: `len` bytes at `at` in piece `piece`, at
/// `buf_at` in the buffer.
struct Segment {
    piece: usize,
    at: usize,
    len: usize,
    buf_at: usize,
}

/// The pieces of lengths `lens`, in order, cut into buffer loads of at most `cap` bytes.
fn loads(lens: impl Iterator<Item = usize>, cap: usize) -> Vec<Vec<Segment>> {
    let mut out: Vec<Vec<Segment>> = vec![Vec::new()];
    let mut fill = 0;
    for (piece, len) in lens.enumerate() {
        let mut at = 0;
        while at < len {
            if fill == cap {
                out.push(Vec::new());
                fill = 0;
            }
            let n = (len - at).min(cap - fill);
            out.last_mut().expect("one load at least").push(Segment { piece, at, len: n, buf_at: fill });
            (at, fill) = (at + n, fill + n);
        }
    }
    out.retain(|l| !l.is_empty());
    out
}

/// The buffer size for copying `total_bytes` in whole `unit`s: `STAGING_BYTES` at most (at least one unit).
fn cap_for(total_bytes: usize, unit: usize) -> usize {
    total_bytes.clamp(4096, STAGING_BYTES.max(unit)) / unit * unit
}

impl Staging {
    /// Two buffers of `STAGING_BYTES`, or of `total_bytes` when there is less to copy, a whole number of
    /// `unit`s each (pieces are cut only there: a row is never split).
    pub fn new(
        host: &Arc<Device>,
        gpu: &Arc<dyn Gpu>,
        total_bytes: usize,
        unit: usize,
    ) -> Result<Staging, DeviceError> {
        Staging::with_cap(host, gpu, cap_for(total_bytes, unit))
    }

    /// Whether it does for copying `total_bytes` with `gpu` in whole `unit`s as well as `new` would.
    pub fn suits(&self, gpu: &Arc<dyn Gpu>, total_bytes: usize, unit: usize) -> bool {
        Arc::ptr_eq(&self.gpu, gpu) && self.cap.is_multiple_of(unit) && self.cap >= cap_for(total_bytes, unit)
    }

    fn with_cap(host: &Arc<Device>, gpu: &Arc<dyn Gpu>, cap: usize) -> Result<Staging, DeviceError> {
        let a = host.alloc_pinned(gpu, Purpose::Staging, cap as u64)?;
        let b = host.alloc_pinned(gpu, Purpose::Staging, cap as u64)?;
        Ok(Staging { gpu: gpu.clone(), bufs: [a, b], cap })
    }

    fn buf(&self, i: usize) -> (u64, *mut u8) {
        let ptr = self.bufs[i % 2].mem().expect("pinned allocations have memory").ptr();
        // Pinned host memory is mapped at the same address for the host and the device (`Gpu::alloc_host`).
        (ptr, ptr as *mut u8)
    }

    /// Fills each piece's host slice from its source.
    pub fn download(&self, pieces: &mut [(Source, &mut [u8])]) -> Result<(), GpuError> {
        let loads = loads(pieces.iter().map(|p| p.1.len()), self.cap);
        let enqueue = |pieces: &[(Source, &mut [u8])], i: usize| -> Result<(), GpuError> {
            let (buf, _) = self.buf(i);
            for s in &loads[i] {
                let dst = buf + s.buf_at as u64;
                match pieces[s.piece].0 {
                    // SAFETY: the address starts the piece's live device bytes and the segment lies inside
                    // them; the buffer holds `cap` bytes and the segment lies inside it.
                    Source::At(addr) => unsafe { self.gpu.dtod(dst, addr + s.at as u64, s.len as u64)? },
                    Source::Pages { table, row0, row_bytes } => {
                        let rows = s.len / row_bytes;
                        let args = [
                            Arg::Ptr(table),
                            Arg::Ptr(dst),
                            Arg::I32((row0 + s.at / row_bytes) as i32),
                            Arg::I32(rows as i32),
                            Arg::I32(row_bytes as i32),
                        ];
                        let dims = Dims::over(rows * row_bytes / 2, 256);
                        // SAFETY: the table lists live pages holding these rows (the caller's), and the
                        // segment's `rows * row_bytes` bytes lie inside the buffer.
                        unsafe { launch(&*self.gpu, "kv_gather", dims, &args)? };
                    }
                }
            }
            Ok(())
        };
        if loads.is_empty() {
            return Ok(());
        }
        enqueue(pieces, 0)?;
        self.gpu.synchronize()?;
        for i in 0..loads.len() {
            if i + 1 < loads.len() {
                enqueue(pieces, i + 1)?; // the other buffer: its last load was taken out in the previous turn
            }
            let (_, host) = self.buf(i);
            for s in &loads[i] {
                // SAFETY: load `i` is complete (the synchronize before this turn) and nothing queued writes
                // this buffer; the segment lies inside both the buffer and the piece.
                let src = unsafe { std::slice::from_raw_parts(host.add(s.buf_at), s.len) };
                pieces[s.piece].1[s.at..s.at + s.len].copy_from_slice(src);
            }
            self.gpu.synchronize()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(loads: &[Vec<Segment>]) -> Vec<Vec<(usize, usize, usize, usize)>> {
        loads.iter().map(|l| l.iter().map(|s| (s.piece, s.at, s.len, s.buf_at)).collect()).collect()
    }

    #[test]
    fn pieces_are_cut_at_buffer_ends_and_nothing_is_lost() {
        let l = loads([5, 0, 12, 3].into_iter(), 8);
        assert_eq!(
            lens(&l),
            vec![vec![(0, 0, 5, 0), (2, 0, 3, 5)], vec![(2, 3, 8, 0)], vec![(2, 11, 1, 0), (3, 0, 3, 1)]]
        );
        assert!(loads([0, 0].into_iter(), 8).is_empty());
    }

    /// Staging made for a copy suits the same copy again (a KV cache keeps it: pinning is slow), and a
    /// smaller one, but not a copy in other units or one it would take in smaller loads than a new one.
    #[test]
    fn staging_made_for_a_copy_suits_it_again() {
        use crate::device::DeviceKind;
        let host = Device::new(0, DeviceKind::Cpu, 0).unwrap();
        let emu = Device::new(1, DeviceKind::Emu { capacity_bytes: 16 << 20 }, 0).unwrap();
        let gpu = emu.gpu().unwrap().clone();
        let row = 34 * 6;
        let big = Staging::new(&host, &gpu, 100 << 20, row).unwrap();
        assert!(big.cap <= STAGING_BYTES && big.cap.is_multiple_of(row));
        assert!(big.suits(&gpu, 100 << 20, row) && big.suits(&gpu, 1 << 20, row));
        assert!(!big.suits(&gpu, 100 << 20, 34 * 5));
        let small = Staging::new(&host, &gpu, 50 * row, row).unwrap();
        assert!(small.suits(&gpu, 50 * row, row) && !small.suits(&gpu, 100 << 20, row));
    }

    /// Scattered device pieces down into one host buffer, through buffers far smaller than the whole (many
    /// loads, both buffers in turn), on the emulated GPU: every byte where it belongs.
    #[test]
    fn pieces_come_down_through_many_loads() {
        use crate::device::cuda::gpu::Buffer;
        use crate::device::DeviceKind;
        let host = Device::new(0, DeviceKind::Cpu, 0).unwrap();
        let emu = Device::new(1, DeviceKind::Emu { capacity_bytes: 16 << 20 }, 0).unwrap();
        let gpu = emu.gpu().unwrap().clone();
        let staging = Staging::with_cap(&host, &gpu, 1000).unwrap();
        let mem = Buffer::device(&gpu, 40_000).unwrap();
        let want: Vec<u8> = (0..40_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        // Pieces of uneven sizes, placed on the device in another order than on the host.
        let cuts = [0, 1, 999, 1000, 3333, 7000, 7001, 20_000, 40_000];
        let spans: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        let at = |i: usize| (40_000 - spans[i].1) as u64; // reversed on the device
        for (i, &(a, b)) in spans.iter().enumerate() {
            mem.write_at(at(i), &want[a..b]).unwrap();
        }
        let mut got = vec![0u8; 40_000];
        let mut rest = &mut got[..];
        let mut pieces: Vec<(Source, &mut [u8])> = Vec::new();
        for (i, &(a, b)) in spans.iter().enumerate() {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(b - a);
            pieces.push((Source::At(mem.ptr() + at(i)), piece));
            rest = tail;
        }
        staging.download(&mut pieces).unwrap();
        assert!(got == want, "every piece where it belongs");
    }

    /// Rows gathered through a page table (pages out of order in memory, one half-filled) come out in row
    /// order, also when a buffer load ends between two rows of one piece.
    #[test]
    fn pages_are_gathered_in_row_order() {
        use crate::device::cuda::gpu::Buffer;
        use crate::device::DeviceKind;
        const ROW: usize = 34 * 2; // two q8_0 blocks
        let host = Device::new(0, DeviceKind::Cpu, 0).unwrap();
        let emu = Device::new(1, DeviceKind::Emu { capacity_bytes: 16 << 20 }, 0).unwrap();
        let gpu = emu.gpu().unwrap().clone();
        let rows = 3 * 64 - 20; // three pages, the last not full
        let want: Vec<u8> = (0..rows * ROW).map(|i| (i * 7 % 251) as u8).collect();
        let pages: Vec<Buffer> = (0..3).map(|_| Buffer::device(&gpu, (64 * ROW) as u64).unwrap()).collect();
        for (i, page) in pages.iter().enumerate() {
            let n = (rows - i * 64).min(64) * ROW;
            page.write_at(0, &want[i * 64 * ROW..i * 64 * ROW + n]).unwrap();
        }
        // The table lists them in row order; in memory they lie wherever the allocator put them.
        let addrs: Vec<u64> = pages.iter().map(Buffer::ptr).collect();
        let table = Buffer::device(&gpu, 24).unwrap();
        table.write_at(0, bytemuck::cast_slice(&addrs)).unwrap();
        // 10 rows per buffer load: pieces cut inside pages and across them.
        let staging = Staging::with_cap(&host, &gpu, 10 * ROW).unwrap();
        let mut got = vec![0u8; rows * ROW];
        let (a, b) = got.split_at_mut(50 * ROW);
        let mut pieces = [
            (Source::Pages { table: table.ptr(), row0: 0, row_bytes: ROW }, a),
            (Source::Pages { table: table.ptr(), row0: 50, row_bytes: ROW }, b),
        ];
        staging.download(&mut pieces).unwrap();
        assert!(got == want, "gathered rows in order");
    }
}
