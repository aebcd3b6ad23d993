//! `keep_freed_memory` changes how glibc's allocator serves large blocks. Its own test binary,
//! so the allocator's state is this process's: a fresh glibc maps every block from 128 KiB on
//! (counted in `mallinfo2().hblkhd`) until a freed mapping raises that bound.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn blocks_under_32_mib_come_from_the_heap_not_fresh_mappings() {
    rein_run::memory::keep_freed_memory();
    // SAFETY: `mallinfo2` only reads the allocator's counters.
    let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
    let before = mapped();
    let block = std::hint::black_box(vec![1u8; 8 << 20]);
    let during = mapped();
    drop(block);
    assert_eq!(during, before, "an 8 MiB block was mapped on its own");
    // Above the bound, blocks are still mapped (and returned when freed).
    let large = std::hint::black_box(vec![1u8; 48 << 20]);
    assert!(mapped() >= before + (48 << 20), "a 48 MiB block is its own mapping");
    drop(large);
}
