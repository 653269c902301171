//! Human units for sizes (`64MiB`, `2G`) and rates (`5Gbps`, `800MB/s`).

use wirerate_engine::error::{Error, Result};

pub use wirerate_engine::units::{eta, fmt_bytes, gbps, rate};

/// Parses a byte size: a number with an optional SI (k, M, G, T = 1000^n) or
/// IEC (KiB, MiB, GiB, TiB = 1024^n) suffix; a bare `K`/`M`/`G` means IEC,
/// as people mean it for buffers and files.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        Error::Config(format!(
            "{s:?} is not a size; write e.g. 4096, 64MiB or 2GiB"
        ))
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(Error::Config(format!(
                "unknown size unit {other:?} in {s:?}; use B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB)"
            )));
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(Error::Config(format!("size {s:?} is out of range")));
    }
    Ok(bytes.round() as u64)
}

/// Parses a rate into bytes per second: `5Gbps`, `800Mbps`, `1.5GB/s`, `100MiB/s`.
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let bits = |suffix: &str, mult: f64| -> Option<Result<u64>> {
        lower.strip_suffix(suffix).map(|n| {
            n.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(|v| (v * mult / 8.0).round() as u64)
                .ok_or_else(|| Error::Config(format!("{s:?} is not a rate; write e.g. 5Gbps")))
        })
    };
    for (suffix, mult) in [("tbps", 1e12), ("gbps", 1e9), ("mbps", 1e6), ("kbps", 1e3)] {
        if let Some(r) = bits(suffix, mult) {
            return r;
        }
    }
    if let Some(n) = lower.strip_suffix("/s") {
        return parse_size(n).and_then(|v| {
            if v == 0 {
                Err(Error::Config(format!("rate {s:?} must be above zero")))
            } else {
                Ok(v)
            }
        });
    }
    Err(Error::Config(format!(
        "{s:?} is not a rate; write e.g. 5Gbps, 800Mbps or 1GB/s"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2 GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("8Gbps").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("800 Mbps").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1GB/s").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("100MiB/s").unwrap(), 100 << 20);
        assert!(parse_rate("0Gbps").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_bytes(10), "10 B");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
        assert!((gbps(1_250_000_000, 1.0) - 10.0).abs() < 1e-9);
    }
}
