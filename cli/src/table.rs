//! How the client commands print values: aligned tables, ages, sizes, and
//! enum names and timestamps exactly as the API writes them on the wire.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::io::Write;

/// `v` as the API writes it, without JSON's quotes: an enum's name
/// (`parameter_server`, `live`), a timestamp in RFC 3339.
pub fn wire(v: &impl Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// A number as JSON writes it (`2.0`, not `2`).
pub fn json_number(x: f64) -> String {
    serde_json::Value::from(x).to_string()
}

/// How long ago `t` was: `42s`, `5m`, `3h`, `2d`.
pub fn age(t: DateTime<Utc>) -> String {
    let s = (Utc::now() - t).num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A size: `1.5 GiB` from 1 GiB up, else `512 MiB`.
pub fn bytes(b: f64) -> String {
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b / (1u64 << 20) as f64)
    }
}

/// Prints `rows` (the first is the header) as left-aligned columns two
/// spaces apart.
pub fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i + 1 == N {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_common::spec::Strategy;

    #[test]
    fn values_print_as_the_api_writes_them() {
        assert_eq!(wire(&Strategy::ParameterServer), "parameter_server");
        let t: DateTime<Utc> = "2026-12-01T09:41:55.123456Z".parse().unwrap();
        assert_eq!(wire(&t), "2026-12-01T09:41:55.123456Z");
        assert_eq!(wire(&Option::<DateTime<Utc>>::None), "null");
        assert_eq!(json_number(2.0), "2.0");
        assert_eq!(json_number(0.5), "0.5");
        assert_eq!(bytes(512.0 * 1048576.0), "512 MiB");
        assert_eq!(bytes(1.5 * 1073741824.0), "1.5 GiB");
    }
}
