//! A size-class allocator for a sink's instance: small blocks (up to
//! [`LARGEST_CLASS`] bytes) come from per-size free lists carved out of
//! 64 KiB chunks; larger ones from the toolchain's `malloc`.
//!
//! A sink's instance lives for one batch, and a batch allocates many small
//! blocks: every string of every event as the host hands the batch over,
//! every header name and value of every request, every answer's headers.
//! wasi-libc's `dlmalloc` spends about 330 WebAssembly instructions on
//! each allocation and its free; here it is a few loads and stores. The
//! shipped `webhook` sink went from 185,100 to 165,100 instructions a
//! request, and from 33.7 to 29.7 µs of CPU a request
//! (bench/results/2026-12-05-guest-allocator.md).
//!
//! The price: a freed block is reused only by a block of its own class
//! (16, 32, …, 4096 bytes, a request rounded up to a power of two), and
//! chunks are never returned. For an instance that lives one batch that is
//! at most twice the small blocks it holds at its peak, plus one partly
//! used chunk per 64 KiB.
//!
//! Use it in a sink built for `wasm32-wasip2`:
//!
//! ```ignore
//! #[cfg(target_arch = "wasm32")]
//! #[global_allocator]
//! static ALLOCATOR: outboxd_sink::alloc::SizeClasses = outboxd_sink::alloc::SizeClasses::new();
//! ```
//!
//! Must never: be shared between threads (it is `Sync` only on a
//! WebAssembly target without threads, where there is one), or hand out a
//! block that is not aligned to its layout.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// The largest block served from a free list, in bytes; larger ones go to
/// the system allocator.
pub const LARGEST_CLASS: usize = 4096;

/// The smallest block: room for the free list's link.
const SMALLEST_CLASS: usize = 16;

/// Classes 16, 32, …, [`LARGEST_CLASS`].
const CLASSES: usize = (LARGEST_CLASS / SMALLEST_CLASS).trailing_zeros() as usize + 1;

/// Bytes taken from the system allocator at a time for small blocks. Every
/// class is a multiple of 16 bytes, so blocks carved one after another
/// from a chunk aligned to 16 are all aligned to 16.
const CHUNK: usize = 64 * 1024;

/// The allocator; see the module note.
pub struct SizeClasses {
    state: UnsafeCell<State>,
}

struct State {
    /// Head of each class's list of freed blocks; a freed block holds the
    /// next one's address in its first bytes.
    free: [*mut u8; CLASSES],
    /// The unused rest of the current chunk, from `next` to `end`.
    next: *mut u8,
    end: *mut u8,
}

// SAFETY: a WebAssembly instance without the threads proposal runs one
// thread, so the state is never touched from two at once.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    /// An allocator holding no memory yet.
    pub const fn new() -> SizeClasses {
        SizeClasses {
            state: UnsafeCell::new(State {
                free: [ptr::null_mut(); CLASSES],
                next: ptr::null_mut(),
                end: ptr::null_mut(),
            }),
        }
    }
}

impl Default for SizeClasses {
    fn default() -> SizeClasses {
        SizeClasses::new()
    }
}

/// The class of `layout` (0 for 16 bytes, 1 for 32, …), or `None` when it
/// is larger than [`LARGEST_CLASS`] or asks for an alignment above 16
/// bytes (rare: those go to the system allocator, so that every class
/// block needs only 16-byte alignment and chunks carry no padding).
#[inline]
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size().max(SMALLEST_CLASS);
    if size > LARGEST_CLASS || layout.align() > SMALLEST_CLASS {
        return None;
    }
    let rounded = size.next_power_of_two();
    Some((rounded / SMALLEST_CLASS).trailing_zeros() as usize)
}

unsafe impl GlobalAlloc for SizeClasses {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class(layout) else {
            return System.alloc(layout);
        };
        let state = &mut *self.state.get();
        let head = state.free[class];
        if !head.is_null() {
            state.free[class] = *head.cast::<*mut u8>();
            return head;
        }
        let size = SMALLEST_CLASS << class;
        if (state.end as usize) - (state.next as usize) < size {
            // The rest of the old chunk (less than one block of this class)
            // stays unused.
            let chunk = System.alloc(Layout::from_size_align_unchecked(CHUNK, SMALLEST_CLASS));
            if chunk.is_null() {
                return chunk;
            }
            state.next = chunk;
            state.end = chunk.add(CHUNK);
        }
        let block = state.next;
        state.next = block.add(size);
        block
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = class(layout) else {
            return System.dealloc(block, layout);
        };
        let state = &mut *self.state.get();
        *block.cast::<*mut u8>() = state.free[class];
        state.free[class] = block;
    }

    #[inline]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class(layout), class(new_layout)) {
            (Some(old), Some(new)) if old == new => block,
            (None, None) => System.realloc(block, layout, new_size),
            _ => {
                let moved = self.alloc(new_layout);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    self.dealloc(block, layout);
                }
                moved
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_are_powers_of_two_from_16_to_4096() {
        assert_eq!(CLASSES, 9);
        assert_eq!(class(layout(1, 1)), Some(0));
        assert_eq!(class(layout(16, 8)), Some(0));
        assert_eq!(class(layout(17, 1)), Some(1));
        assert_eq!(class(layout(8, 16)), Some(0));
        assert_eq!(
            class(layout(8, 64)),
            None,
            "above 16-byte alignment: the system's"
        );
        assert_eq!(class(layout(4096, 1)), Some(8));
        assert_eq!(class(layout(4097, 1)), None);
        assert_eq!(class(layout(8, 8192)), None);
    }

    #[test]
    fn every_block_is_aligned_and_distinct_until_freed_then_reused() {
        let a = SizeClasses::new();
        unsafe {
            let mut blocks = Vec::new();
            for size in [1, 7, 16, 24, 100, 1000, 4096] {
                for align in [1, 8, 16, 64] {
                    let l = layout(size, align);
                    let p = a.alloc(l);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size}/{align}");
                    // Writable over its whole size, and not overlapping another.
                    ptr::write_bytes(p, 0xAB, size);
                    blocks.push((p, l));
                }
            }
            let mut starts: Vec<usize> = blocks.iter().map(|(p, _)| *p as usize).collect();
            starts.sort();
            starts.dedup();
            assert_eq!(starts.len(), blocks.len());
            let (p, l) = blocks[10];
            a.dealloc(p, l);
            assert_eq!(a.alloc(l), p, "a freed block is the next of its class");
            for (p, l) in blocks {
                a.dealloc(p, l);
            }
        }
    }

    #[test]
    fn more_than_a_chunk_of_small_blocks_takes_another_chunk() {
        let a = SizeClasses::new();
        let l = layout(4096, 1);
        unsafe {
            let blocks: Vec<*mut u8> = (0..(3 * CHUNK / 4096)).map(|_| a.alloc(l)).collect();
            for (i, &p) in blocks.iter().enumerate() {
                ptr::write_bytes(p, i as u8, 4096);
            }
            for (i, &p) in blocks.iter().enumerate() {
                assert_eq!(*p.add(4095), i as u8, "block {i} was overwritten");
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_within_a_class_across_classes_and_to_the_system() {
        let a = SizeClasses::new();
        unsafe {
            let l = layout(20, 1);
            let p = a.alloc(l);
            ptr::copy_nonoverlapping(b"twenty bytes of data".as_ptr(), p, 20);
            assert_eq!(a.realloc(p, l, 30), p, "20 and 30 bytes are one class");
            let q = a.realloc(p, layout(30, 1), 100);
            assert_ne!(q, p);
            let r = a.realloc(q, layout(100, 1), 10_000);
            assert_eq!(std::slice::from_raw_parts(r, 20), b"twenty bytes of data");
            let s = a.realloc(r, layout(10_000, 1), 20);
            assert_eq!(std::slice::from_raw_parts(s, 20), b"twenty bytes of data");
            a.dealloc(s, layout(20, 1));
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_even_when_reused() {
        let a = SizeClasses::new();
        let l = layout(64, 8);
        unsafe {
            let p = a.alloc(l);
            ptr::write_bytes(p, 0xFF, 64);
            a.dealloc(p, l);
            let z = a.alloc_zeroed(l);
            assert_eq!(z, p);
            assert!(std::slice::from_raw_parts(z, 64).iter().all(|&b| b == 0));
        }
    }
}
