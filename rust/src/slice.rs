//! Short scheduler slices for the threads a streaming client's first response waits on.
//!
//! Linux's EEVDF scheduler (6.6 and later) runs a thread woken while the CPUs are full only
//! once the running one has used its slice (1.4 ms on two vCPUs by default) unless the woken
//! one asked for a shorter slice (6.12 and later: `sched_setattr` with `sched_runtime` for a
//! normal thread, no privilege needed). A decoupled model's workers run Python flat out
//! while their streams are busy, so a new request's first response, which passes the lane's
//! driver thread and the worker's reader thread, waited behind them at each (a `perf sched
//! latency` of the `streamcore` benchmark: 0.2-0.3 ms per wake-up on average, 5 ms at worst).
//! Those two threads run briefly per wake-up and ask for the shortest slice; the CPU they get
//! in all is unchanged. Older kernels ignore the request.

/// The slice asked for: the shortest the kernel grants (0.1 ms).
pub const SHORT_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` up to `sched_period` (`SCHED_ATTR_SIZE_VER0`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const SCHED_ATTR_SIZE: u32 = 48;

/// Asks the kernel to give the calling thread [`SHORT_SLICE_NS`] slices, keeping its policy
/// and nice value. False where it cannot (not Linux, a real-time or idle policy, an error).
pub fn ask_short_slice() -> bool {
    let Some(mut attr) = current_attr() else {
        return false;
    };
    if i64::from(attr.policy) != i64::from(libc::SCHED_OTHER) {
        return false; // (a slice means something else to the other policies)
    }
    attr.size = SCHED_ATTR_SIZE;
    attr.flags = 0;
    attr.runtime = SHORT_SLICE_NS;
    // SAFETY: passes a live, initialized `sched_attr` of the size it declares, for the calling
    // thread (pid 0); the kernel only reads it.
    let done = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    done == 0
}

/// The calling thread's slice in nanoseconds as the kernel reports it (0 where the kernel has
/// no custom slices).
pub fn current_slice_ns() -> Option<u64> {
    current_attr().map(|attr| attr.runtime)
}

fn current_attr() -> Option<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `SCHED_ATTR_SIZE` bytes into `attr`, which is live,
    // writable and that large.
    let done = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &raw mut attr,
            SCHED_ATTR_SIZE,
            0,
        )
    };
    (done == 0).then_some(attr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the running kernel has custom slices (6.12 and later).
    fn kernel_has_custom_slices() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|part| part.parse::<u32>().ok());
        let major = numbers.next().unwrap_or(0);
        let minor = numbers.next().unwrap_or(0);
        (major, minor) >= (6, 12)
    }

    #[test]
    fn a_thread_gets_the_short_slice_it_asks_for_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            // SAFETY: sets the calling thread's own nice value.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let default = current_slice_ns().unwrap();
            assert!(ask_short_slice());
            let expected = if kernel_has_custom_slices() {
                SHORT_SLICE_NS
            } else {
                default
            };
            assert_eq!(current_slice_ns(), Some(expected));
            // SAFETY: reads the calling thread's nice value.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(nice, 3);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn other_threads_keep_the_default_slice() {
        let slice = || std::thread::spawn(current_slice_ns).join().unwrap();
        let default = slice();
        std::thread::spawn(|| assert!(ask_short_slice()))
            .join()
            .unwrap();
        assert_eq!(slice(), default);
    }
}
