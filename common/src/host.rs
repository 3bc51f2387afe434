//! What the machine a process runs on offers: its available memory, as the
//! kernel reports it in `/proc/meminfo`. The API sizes its embedded
//! executor's share from it and an executor advertises it when it
//! registers; both read it here.

/// The machine's available memory in bytes (`MemAvailable`), or `None`
/// where `/proc/meminfo` is missing or does not say.
pub fn available_memory() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The `MemAvailable` line of a `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_available_line_is_read_in_bytes() {
        let text =
            "MemTotal:       24598432 kB\nMemFree:         1234 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        assert_eq!(mem_available("MemAvailable: 12\n"), None, "no unit");
        assert_eq!(
            mem_available(&format!("MemAvailable: {} kB\n", u64::MAX)),
            None
        );
    }

    #[test]
    fn this_machine_says() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_memory().is_some_and(|b| b > 0));
        }
    }
}
