//! The process's peak resident memory, per training step: the kernel's high-water mark
//! (`VmHWM` in `/proc/self/status`), reset before each step (`5` written to
//! `/proc/self/clear_refs`, Linux ≥ 4.0) so each step's figure is its own, not the run's.
//! Elsewhere (no `/proc`) both are no-ops and nothing is reported. And how the C allocator
//! treats what a step frees ([`keep_freed_memory`]), and what can still be allocated
//! ([`available_bytes`]).

/// Asks glibc's allocator to keep freed blocks of up to 32 MiB for the next step instead of
/// handing them back to the kernel. By default it maps blocks from 128 KiB on afresh and returns
/// them when freed, so every activation, gradient and product output of every step is a new
/// mapping whose pages the kernel zeroes on first touch: 12 % of a SmolLM2 LoRA GRPO step's
/// samples in `perf` were that zeroing, 3.5 % with this. Peak memory is unchanged: a step
/// reuses what the last one freed. A no-op on other C libraries. For binaries, at start.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before the allocations it affects.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Resets the peak resident set to the current one.
pub fn reset_peak_rss() {
    // Not being able to reset (no /proc, a sandbox refusing the write) only makes the next
    // figure the peak since start instead of since this step: a figure, not a failure.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident set since start or the last [`reset_peak_rss`], in MiB; `None` where
/// there is no `/proc/self/status`.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The memory the kernel says can be allocated without swapping (`MemAvailable` in
/// `/proc/meminfo`), in bytes; `None` where there is no `/proc/meminfo`.
pub fn available_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable:")
}

/// The machine's memory (`MemTotal` in `/proc/meminfo`), in bytes; `None` where there is no
/// `/proc/meminfo`.
pub fn total_bytes() -> Option<u64> {
    meminfo_bytes("MemTotal:")
}

fn meminfo_bytes(key: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Touching 256 MiB raises the peak by about as much; a reset brings it back down.
    #[test]
    #[cfg(target_os = "linux")]
    fn the_peak_follows_an_allocation_and_resets() {
        reset_peak_rss();
        let before = peak_rss_mib().expect("linux has /proc/self/status");
        let mut block = vec![0u8; 256 << 20];
        for page in block.chunks_mut(4096) {
            page[0] = 1;
        }
        std::hint::black_box(&block);
        let during = peak_rss_mib().unwrap();
        drop(block);
        reset_peak_rss();
        let after = peak_rss_mib().unwrap();
        assert!(
            during - before > 200.0,
            "peak {before} → {during} MiB after touching 256 MiB"
        );
        assert!(during - after > 200.0, "peak {during} → {after} MiB after a reset");
    }
}
