//! NumPy `.npz` and safetensors files: their metadata read from the zip
//! directory and `.npy` headers, or from the safetensors JSON header, with
//! range requests alone. A whole file is one unit, decoded by libtorch.

use super::{le_u16, le_u32, le_u64, unreadable, Columns, MAX_HEADER_BYTES};
use crate::data::samples::DataError;
use crate::storage::Fetcher;
use std::collections::HashMap;

/// Rows per unit, values per sample, bytes: of an npz, from its zip
/// directory and the `.npy` headers of `x` and `y`.
pub(crate) fn npz_meta(
    url: &str,
    fetcher: &Fetcher,
    columns: &Columns,
) -> Result<(Vec<u64>, Option<u64>, u64), DataError> {
    let bad = |why: &str| unreadable(url, format!("not a readable npz: {why}"));
    let (cd, size) = zip_directory(url, fetcher)?;
    let entries = zip_entries(&cd);
    let shape_of = |name: &str| -> Result<Vec<u64>, DataError> {
        let (method, local) = entries
            .get(&format!("{name}.npy"))
            .or_else(|| entries.get(name))
            .copied()
            .ok_or_else(|| {
                DataError::Shape(format!(
                    "{url} has no array named {name:?} (found {:?})",
                    entries.keys().collect::<Vec<_>>()
                ))
            })?;
        let head = npy_head(url, fetcher, (method, local), size)?;
        npy_shape(&head).ok_or_else(|| bad(&format!("{name}.npy has no readable header")))
    };
    let y = shape_of(&columns.y)?;
    let x = shape_of(columns.x.first().map_or("x", String::as_str))?;
    let rows = *y.first().ok_or_else(|| bad("y is a scalar"))?;
    if x.first() != Some(&rows) {
        return Err(DataError::Shape(format!(
            "{url}: x has shape {x:?} and y {y:?}: they need the same number of samples"
        )));
    }
    Ok((vec![rows], Some(x[1..].iter().product()), size))
}

/// The zip central directory of the npz at `url` (found from its end
/// record, zip64 included), and the file's size.
fn zip_directory(url: &str, fetcher: &Fetcher) -> Result<(Vec<u8>, u64), DataError> {
    let bad = |why: &str| unreadable(url, format!("not a readable npz: {why}"));
    let tail_len = 65_557 + 20;
    let (tail, size) = fetcher
        .read_tail(url, tail_len)
        .map_err(|e| unreadable(url, e))?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..i + 4] == *b"PK\x05\x06")
        .ok_or_else(|| bad("no zip directory"))?;
    let mut cd_size = le_u32(&tail, eocd + 12).ok_or_else(|| bad("short"))?;
    let mut cd_off = le_u32(&tail, eocd + 16).ok_or_else(|| bad("short"))?;
    if cd_off == 0xFFFF_FFFF || cd_size == 0xFFFF_FFFF {
        // Zip64: the locator sits just before the end record.
        let loc = eocd
            .checked_sub(20)
            .ok_or_else(|| bad("zip64 without a locator"))?;
        if tail[loc..loc + 4] != *b"PK\x06\x07" {
            return Err(bad("zip64 without a locator"));
        }
        let rec = le_u64(&tail, loc + 8).ok_or_else(|| bad("short"))?;
        let r = fetcher
            .read_range(url, rec..rec + 56)
            .map_err(|e| unreadable(url, e))?;
        if r.len() < 56 || r[..4] != *b"PK\x06\x06" {
            return Err(bad("broken zip64 record"));
        }
        cd_size = le_u64(&r, 40).ok_or_else(|| bad("short"))?;
        cd_off = le_u64(&r, 48).ok_or_else(|| bad("short"))?;
    }
    if cd_size > MAX_HEADER_BYTES || cd_off + cd_size > size {
        return Err(bad("zip directory out of bounds"));
    }
    let cd = fetcher
        .read_range(url, cd_off..cd_off + cd_size)
        .map_err(|e| unreadable(url, e))?;
    Ok((cd.to_vec(), size))
}

/// The entries of a zip central directory: name → (compression method,
/// local header offset).
fn zip_entries(cd: &[u8]) -> HashMap<String, (u64, u64)> {
    let mut entries: HashMap<String, (u64, u64)> = HashMap::new();
    let mut at = 0usize;
    while at + 46 <= cd.len() && cd[at..at + 4] == *b"PK\x01\x02" {
        let method = le_u16(cd, at + 10).unwrap_or(0);
        let name_len = le_u16(cd, at + 28).unwrap_or(0) as usize;
        let extra_len = le_u16(cd, at + 30).unwrap_or(0) as usize;
        let comment_len = le_u16(cd, at + 32).unwrap_or(0) as usize;
        let (usize32, csize32) = (le_u32(cd, at + 24), le_u32(cd, at + 20));
        let mut local = le_u32(cd, at + 42).unwrap_or(0);
        let name = String::from_utf8_lossy(cd.get(at + 46..at + 46 + name_len).unwrap_or(&[]))
            .into_owned();
        if local == 0xFFFF_FFFF {
            // The zip64 extra field lists, in order, the sizes and offset
            // that did not fit their 32-bit fields.
            let extra = cd
                .get(at + 46 + name_len..at + 46 + name_len + extra_len)
                .unwrap_or(&[]);
            let mut e = 0;
            while e + 4 <= extra.len() {
                let (id, len) = (
                    le_u16(extra, e).unwrap_or(0),
                    le_u16(extra, e + 2).unwrap_or(0),
                );
                if id == 1 {
                    let mut f = e + 4;
                    if usize32 == Some(0xFFFF_FFFF) {
                        f += 8;
                    }
                    if csize32 == Some(0xFFFF_FFFF) {
                        f += 8;
                    }
                    local = le_u64(extra, f).unwrap_or(u64::MAX);
                }
                e += 4 + len as usize;
            }
        }
        entries.insert(name, (method, local));
        at += 46 + name_len + extra_len + comment_len;
    }
    entries
}

/// The first 4 KiB of the entry at `local` (stored or deflated), where
/// its `.npy` header is.
fn npy_head(
    url: &str,
    fetcher: &Fetcher,
    (method, local): (u64, u64),
    size: u64,
) -> Result<Vec<u8>, DataError> {
    let bad = |why: &str| unreadable(url, format!("not a readable npz: {why}"));
    let h = fetcher
        .read_range(url, local..local + 30)
        .map_err(|e| unreadable(url, e))?;
    if h.len() < 30 || h[..4] != *b"PK\x03\x04" {
        return Err(bad("broken local header"));
    }
    let start = local + 30 + le_u16(&h, 26).unwrap_or(0) + le_u16(&h, 28).unwrap_or(0);
    let raw = fetcher
        .read_range(url, start..(start + 4096).min(size))
        .map_err(|e| unreadable(url, e))?;
    match method {
        0 => Ok(raw.to_vec()),
        8 => {
            let mut out = vec![0u8; 4096];
            let mut d = flate2::Decompress::new(false);
            let _ = d.decompress(&raw, &mut out, flate2::FlushDecompress::None);
            out.truncate(d.total_out() as usize);
            Ok(out)
        }
        m => Err(bad(&format!(
            "compression method {m} (stored or deflate only)"
        ))),
    }
}

/// The shape in a `.npy` header.
pub(crate) fn npy_shape(head: &[u8]) -> Option<Vec<u64>> {
    if head.len() < 10 || head[..6] != *b"\x93NUMPY" {
        return None;
    }
    let (len, from) = if head[6] == 1 {
        (le_u16(head, 8)? as usize, 10)
    } else {
        (le_u32(head, 8)? as usize, 12)
    };
    let text = std::str::from_utf8(head.get(from..from + len)?).ok()?;
    let shape = text.split("'shape':").nth(1)?;
    let inner = shape.split_once('(')?.1.split_once(')')?.0;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect()
}

/// Rows, values per sample, bytes of a safetensors file, from its header.
pub(crate) fn safetensors_meta(
    url: &str,
    fetcher: &Fetcher,
    columns: &Columns,
) -> Result<(Vec<u64>, Option<u64>, u64), DataError> {
    let len = fetcher
        .read_range(url, 0..8)
        .map_err(|e| unreadable(url, e))?;
    let n = le_u64(&len, 0).ok_or_else(|| unreadable(url, "not safetensors"))?;
    if n > MAX_HEADER_BYTES {
        return Err(unreadable(url, "not safetensors (header too long)"));
    }
    let head = fetcher
        .read_range(url, 8..8 + n)
        .map_err(|e| unreadable(url, e))?;
    let v: serde_json::Value = serde_json::from_slice(&head)
        .map_err(|e| unreadable(url, format!("not safetensors: {e}")))?;
    let shape = |name: &str| -> Result<Vec<u64>, DataError> {
        v.get(name)
            .and_then(|t| t.get("shape"))
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .ok_or_else(|| DataError::Shape(format!("{url} has no tensor named {name:?}")))
    };
    let y = shape(&columns.y)?;
    let x = shape(columns.x.first().map_or("x", String::as_str))?;
    let rows = *y
        .first()
        .ok_or_else(|| DataError::Shape(format!("{url}: y is a scalar")))?;
    if x.first() != Some(&rows) {
        return Err(DataError::Shape(format!(
            "{url}: x has shape {x:?} and y {y:?}: they need the same number of samples"
        )));
    }
    Ok((vec![rows], Some(x[1..].iter().product()), 8 + n))
}
