//! The memory packed matrices live in: runs of 64-byte lines carved from shared regions on 2 MiB pages.
//!
//! Decoding streams every packed byte once per token. On 4 KiB pages that is a TLB miss per page (a 72 MiB
//! model is 18,000 pages, past what the TLBs hold) and the hardware prefetchers stop at each page's end; a
//! small model's matrices (SmolLM2's are 0.2-0.5 MiB) are each too small for a 2 MiB page of their own. So
//! matrices take their lines from regions of `REGION_BYTES`, 2 MiB aligned and advised as huge pages
//! (`madvise(MADV_HUGEPAGE)`, before first touch: Debian's `transparent_hugepage` default is `madvise`), one
//! after another as a model loads them; a matrix over half a region gets one of its own. A region is freed
//! when the last matrix in it is dropped (each holds an `Arc`), so unloading a model returns its memory.
//! A region's bytes past its last matrix are never touched, so they take no RAM.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::sync::LockUnpoisoned;

/// One cache line, the unit the packed bytes are allocated in (so every vector is 64-byte aligned).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub [u8; 64]);

/// Bytes of a shared region, and the alignment of every region (a huge page).
const REGION_BYTES: usize = 32 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// Memory of `layout`, allocated but not touched, freed on drop.
struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a region is plain memory; each `Lines` writes only its own disjoint range, through `&mut`.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// A region of at least `bytes` (rounded up to whole huge pages), or `None` when the allocator refuses.
    fn new(bytes: usize) -> Option<Region> {
        let layout = Layout::from_size_align(bytes.max(1).next_multiple_of(HUGE_PAGE), HUGE_PAGE).ok()?;
        // SAFETY: the layout's size is not zero.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        #[cfg(target_os = "linux")]
        // SAFETY: the range is this allocation; MADV_HUGEPAGE changes no contents, and a refusal (a kernel
        // without transparent huge pages) leaves 4 KiB pages, which only costs speed.
        unsafe {
            libc::madvise(ptr.as_ptr() as *mut libc::c_void, layout.size(), libc::MADV_HUGEPAGE);
        }
        Some(Region { ptr, layout })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The region matrices are being carved from, and the bytes of it already given out.
static CURRENT: Mutex<(Weak<Region>, usize)> = Mutex::new((Weak::new(), 0));

/// `len` zeroed lines of one matrix, in a shared region.
pub(super) struct Lines {
    region: Arc<Region>,
    /// Byte offset of the first line in the region.
    at: usize,
    len: usize,
}

impl Lines {
    /// `len` zeroed lines; `None` when memory cannot be had.
    pub(super) fn zeroed(len: usize) -> Option<Lines> {
        let bytes = len.checked_mul(64)?;
        let (region, at) = if bytes > REGION_BYTES / 2 {
            (Arc::new(Region::new(bytes)?), 0)
        } else {
            let mut cur = CURRENT.lock_unpoisoned();
            match cur.0.upgrade() {
                Some(r) if cur.1 + bytes <= r.layout.size() => {
                    let at = cur.1;
                    cur.1 += bytes;
                    (r, at)
                }
                _ => {
                    let r = Arc::new(Region::new(REGION_BYTES)?);
                    *cur = (Arc::downgrade(&r), bytes);
                    (r, 0)
                }
            }
        };
        // SAFETY: `at..at + bytes` lies inside the region and belongs to this `Lines` alone.
        unsafe { std::ptr::write_bytes(region.ptr.as_ptr().add(at), 0, bytes) };
        Some(Lines { region, at, len })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn as_ptr(&self) -> *const Line {
        // SAFETY: `at` is inside the region (see `zeroed`); regions are huge-page aligned, `at` a multiple of 64.
        unsafe { self.region.ptr.as_ptr().add(self.at) as *const Line }
    }

    /// The lines' bytes, to fill while packing.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the range is this `Lines`' alone (see `zeroed`), initialized (zeroed), and `&mut self`
        // makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr().add(self.at), self.len * 64) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_zeroed_aligned_disjoint_and_freed_with_their_last_matrix() {
        let mut a = Lines::zeroed(10).unwrap();
        let mut b = Lines::zeroed(3).unwrap();
        assert!(a.bytes_mut().iter().all(|&x| x == 0) && b.bytes_mut().iter().all(|&x| x == 0));
        assert_eq!((a.as_ptr() as usize % 64, b.as_ptr() as usize % 64), (0, 0));
        a.bytes_mut().fill(0xAA);
        b.bytes_mut().fill(0x55);
        assert!(a.bytes_mut().iter().all(|&x| x == 0xAA), "a neighbour wrote into a matrix's lines");
        // A matrix over half a region gets its own, huge-page aligned.
        let big = Lines::zeroed(REGION_BYTES / 64).unwrap();
        assert_eq!(big.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(Arc::strong_count(&big.region), 1);
        drop((a, b));
        let weak = Arc::downgrade(&big.region);
        drop(big);
        assert!(weak.upgrade().is_none(), "a region outlived its last matrix");
    }
}
