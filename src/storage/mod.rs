//! Storage: segment files of CRC-checked frames and small atomically replaced files.
//! Owned by the partition layer on its core; nothing here is shared between cores.

pub mod atomic_file;
pub mod backend;
pub mod frame;
pub mod log;
pub mod runs;
pub mod sim;

#[cfg(test)]
mod fault_tests;

/// Milliseconds since the Unix epoch (record timestamps, retention).
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
