//! WebDataset shards: tar files whose consecutive members sharing a key
//! (the member's path up to the first `.` of its name) form one sample —
//! here an image (`key.jpg`, `.jpeg` or `.png`) and its class
//! (`key.cls`, an integer in ASCII). A shard's units are runs of
//! [`UNIT_SAMPLES`] samples, so a large shard is decoded a part at a time
//! within the memory budget; counting them reads the tar headers of the
//! shard in the local cache tier, seeking past the members' bytes.
//!
//! Nothing is extracted to disk: member names are only compared, so a name
//! like `../../etc/passwd` is just a key. Each member read is bounded
//! ([`super::images::MAX_IMAGE_BYTES`], [`MAX_CLS_BYTES`]).

use super::images::{decode, is_image_name, ImageRecipe, MAX_IMAGE_BYTES};
use super::unreadable;
use crate::data::samples::DataError;
use std::io::Read;
use std::path::Path;
use tch::Tensor;

/// Samples per unit of a shard.
pub const UNIT_SAMPLES: u64 = 256;
/// Largest `.cls` member read.
pub const MAX_CLS_BYTES: u64 = 64;

/// A sample's members as they are read.
#[derive(Default)]
struct Sample {
    key: String,
    image: Option<(String, Vec<u8>)>,
    class: Option<i64>,
}

/// The key of a member path: its folder and its name up to the first `.`.
fn key_of(path: &str) -> (&str, &str) {
    let (folder_len, name) = match path.rfind('/') {
        Some(i) => (i + 1, &path[i + 1..]),
        None => (0, path),
    };
    match name.find('.') {
        Some(dot) => (&path[..folder_len + dot], &name[dot..]),
        None => (path, ""),
    }
}

/// Walks the samples of the tar at `path`, reading the members of those
/// `want` accepts (by index) and handing each finished one to `take`;
/// stops early when `take` says so. The samples counted.
fn walk(
    path: &Path,
    url: &str,
    want: impl Fn(u64) -> bool,
    mut take: impl FnMut(u64, Sample) -> Result<bool, DataError>,
) -> Result<u64, DataError> {
    let bad = |why: String| unreadable(url, format!("not a readable WebDataset tar: {why}"));
    let file = std::fs::File::open(path).map_err(|e| unreadable(url, e))?;
    let mut archive = tar::Archive::new(file);
    let entries = archive
        .entries_with_seek()
        .map_err(|e| bad(e.to_string()))?;
    let mut index = 0u64;
    let mut current: Option<Sample> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let member = entry
            .path()
            .map_err(|e| bad(e.to_string()))?
            .to_string_lossy()
            .into_owned();
        let (key, ext) = key_of(&member);
        if ext.is_empty() {
            continue;
        }
        if current.as_ref().is_some_and(|s| s.key != key) {
            let done = current.take().expect("checked");
            if want(index) && !take(index, done)? {
                return Ok(index + 1);
            }
            index += 1;
        }
        let sample = current.get_or_insert_with(|| Sample {
            key: key.to_owned(),
            ..Sample::default()
        });
        if !want(index) {
            continue;
        }
        let size = entry.header().size().unwrap_or(u64::MAX);
        let ext = ext.to_ascii_lowercase();
        if ext == ".cls" {
            if size > MAX_CLS_BYTES {
                return Err(bad(format!(
                    "{member} is {size} bytes; a class is a short integer"
                )));
            }
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| bad(format!("{member}: {e}")))?;
            let class = text.trim().parse::<i64>().map_err(|_| {
                bad(format!(
                    "{member} holds {:?}, not an integer class",
                    text.trim()
                ))
            })?;
            sample.class = Some(class);
        } else if is_image_name(&ext) {
            if size > MAX_IMAGE_BYTES {
                return Err(bad(format!(
                    "{member} is {size} bytes; an image is at most {MAX_IMAGE_BYTES}"
                )));
            }
            if sample.image.is_some() {
                return Err(bad(format!("sample {key} has more than one image")));
            }
            let mut bytes = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| bad(format!("{member}: {e}")))?;
            sample.image = Some((member, bytes));
        }
    }
    if let Some(last) = current.take() {
        if want(index) {
            take(index, last)?;
        }
        index += 1;
    }
    Ok(index)
}

/// Samples of the tar at `path` (read from its headers).
pub fn count(path: &Path, url: &str) -> Result<u64, DataError> {
    walk(path, url, |_| false, |_, _| Ok(true))
}

/// Rows per unit of a shard of `samples` samples.
pub fn units_of(samples: u64) -> Vec<u64> {
    let mut units = vec![UNIT_SAMPLES; (samples / UNIT_SAMPLES) as usize];
    if samples % UNIT_SAMPLES > 0 {
        units.push(samples % UNIT_SAMPLES);
    }
    units
}

/// Unit `u` of the tar at `path`: each image uint8 `[c, h, w]` (sizes may
/// differ until the batch's crops), and the int64 classes `[n]`.
pub fn read_unit(
    path: &Path,
    url: &str,
    u: usize,
    recipe: &ImageRecipe,
) -> Result<(Vec<Tensor>, Tensor), DataError> {
    let from = u as u64 * UNIT_SAMPLES;
    let to = from + UNIT_SAMPLES;
    let mut images: Vec<Tensor> = Vec::new();
    let mut classes: Vec<i64> = Vec::new();
    walk(
        path,
        url,
        |i| (from..to).contains(&i),
        |i, s| {
            let (name, bytes) = s.image.ok_or_else(|| {
                DataError::Shape(format!(
                    "{url}: sample {} has no .jpg, .jpeg or .png",
                    s.key
                ))
            })?;
            let class = s.class.ok_or_else(|| {
                DataError::Shape(format!("{url}: sample {} has no .cls (its class)", s.key))
            })?;
            images.push(decode(url, &name, &bytes, recipe)?.tensor(recipe.channels));
            classes.push(class);
            Ok(i + 1 < to)
        },
    )?;
    Ok((images, Tensor::from_slice(&classes)))
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn a_key_is_the_path_up_to_the_first_dot_of_the_name() {
        assert_eq!(key_of("a/b.c/s001.jpg"), ("a/b.c/s001", ".jpg"));
        assert_eq!(key_of("s001.seg.png"), ("s001", ".seg.png"));
        assert_eq!(key_of("../../etc/passwd"), ("../../etc/passwd", ""));
    }
}
