//! Byte counts and rates for people.

/// Formats a byte count with a binary unit, for people.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// Gigabits per second for `bytes` moved in `secs`.
pub fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 * 8.0 / secs / 1e9
    }
}

/// Bytes per second of a counter that went from `before` to `after` in
/// `secs` (at least a millisecond, so a reading taken twice at once is
/// not a division by zero).
pub fn rate(before: u64, after: u64, secs: f64) -> f64 {
    after.saturating_sub(before) as f64 / secs.max(1e-3)
}

/// Seconds until `remaining` bytes are moved at `bytes_per_sec`, or none
/// while nothing moves.
pub fn eta(remaining: u64, bytes_per_sec: f64) -> Option<f64> {
    (bytes_per_sec > 0.0).then(|| remaining as f64 / bytes_per_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_etas() {
        assert_eq!(rate(100, 1100, 2.0), 500.0);
        assert_eq!(
            rate(1100, 100, 2.0),
            0.0,
            "a counter that went back moved nothing"
        );
        assert_eq!(rate(0, 1, 0.0), 1000.0, "no division by zero");
        assert_eq!(eta(1000, 500.0), Some(2.0));
        assert_eq!(eta(1000, 0.0), None);
        assert_eq!(gbps(125_000_000, 1.0), 1.0);
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
    }
}
