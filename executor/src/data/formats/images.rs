//! Images: one JPEG or PNG file decoded in Rust (the `image` crate; its
//! JPEG decoder is zune-jpeg), converted to RGB or grayscale, and put
//! through the spec's deterministic transforms (resize, center crop: every
//! transform before the first random one), as uint8 `[channels, height,
//! width]`. The random transforms and the conversion to floats run per
//! batch ([`crate::data::pixels`]), so a decoded image is a quarter of its
//! float size in the loader's caches and is drawn anew each epoch.
//!
//! An image is hostile input: its file is at most [`MAX_IMAGE_BYTES`], its
//! declared size at most [`MAX_SIDE`] pixels a side and [`MAX_DECODED`]
//! bytes decoded, checked before the decoder allocates.

use super::unreadable;
use crate::data::pixels::TransformError;
use crate::data::samples::DataError;
use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat, ImageReader, Limits};
use trainyard_common::spec::Transform;

/// Largest image file read.
pub const MAX_IMAGE_BYTES: u64 = 64 << 20;
/// Largest side of an image, in pixels.
pub const MAX_SIDE: u32 = 16_384;
/// Most bytes one image may decode to.
pub const MAX_DECODED: u64 = 512 << 20;

/// Whether a file name is an image this reader decodes.
pub fn is_image_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.ends_with(".jpg") || n.ends_with(".jpeg") || n.ends_with(".png")
}

/// How images are decoded: channels and the deterministic transforms.
#[derive(Debug, Clone)]
pub struct ImageRecipe {
    /// 1 or 3.
    pub channels: u32,
    /// The transforms before the first random one.
    pub fixed: Vec<Transform>,
}

impl ImageRecipe {
    /// The recipe of a dataset's `channels` and `transforms`.
    pub fn of(f: &trainyard_common::spec::FileData) -> ImageRecipe {
        ImageRecipe {
            channels: f.image_channels(),
            fixed: f
                .transforms
                .iter()
                .flatten()
                .take_while(|t| !t.is_random())
                .copied()
                .collect(),
        }
    }

    /// Values per sample when the transforms fix the size (a crop after
    /// the last resize, or a random crop later), else `None`.
    pub fn features(&self, all: &[Transform]) -> Option<u64> {
        let side = all.iter().rev().find_map(|t| match t {
            Transform::CenterCrop(n) | Transform::RandomCrop(n) => Some(*n),
            Transform::Resize(_) => Some(0),
            Transform::HorizontalFlip(_) => None,
        })?;
        (side > 0).then(|| u64::from(self.channels) * u64::from(side) * u64::from(side))
    }
}

/// One decoded image: uint8 values, channel-major, and its size.
#[derive(Debug)]
pub struct Decoded {
    /// `[channels, height, width]` values.
    pub values: Vec<u8>,
    /// Height in pixels.
    pub height: u32,
    /// Width in pixels.
    pub width: u32,
}

impl Decoded {
    /// As a uint8 tensor `[channels, height, width]`.
    pub fn tensor(&self, channels: u32) -> tch::Tensor {
        tch::Tensor::from_slice(&self.values).reshape([
            i64::from(channels),
            i64::from(self.height),
            i64::from(self.width),
        ])
    }
}

/// Decodes `bytes` (the image `name` of `url`) and applies the recipe.
pub fn decode(url: &str, name: &str, bytes: &[u8], r: &ImageRecipe) -> Result<Decoded, DataError> {
    let what = |why: String| unreadable(url, format!("image {name}: {why}"));
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(what(format!(
            "{} bytes; an image file is at most {MAX_IMAGE_BYTES}",
            bytes.len()
        )));
    }
    let format = image::guess_format(bytes)
        .ok()
        .filter(|f| matches!(f, ImageFormat::Jpeg | ImageFormat::Png))
        .ok_or_else(|| what("not a JPEG or PNG file".into()))?;
    let mut reader = ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODED);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| what(format!("cannot decode it as {format:?}: {e}")))?;
    let mut img = if r.channels == 1 {
        DynamicImage::ImageLuma8(luma(&img.to_rgb8()))
    } else {
        DynamicImage::ImageRgb8(img.to_rgb8())
    };
    for t in &r.fixed {
        img = apply(img, *t).map_err(|e| what(e.to_string()))?;
    }
    let (width, height) = (img.width(), img.height());
    let hw = (width * height) as usize;
    let c = r.channels as usize;
    let raw = img.into_bytes();
    // Interleaved HWC to planar CHW, as torch lays images out.
    let mut values = vec![0u8; raw.len()];
    for (i, px) in raw.chunks_exact(c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            values[ch * hw + i] = v;
        }
    }
    Ok(Decoded {
        values,
        height,
        width,
    })
}

/// Grayscale as Pillow's `convert("L")` (and so torchvision) computes it:
/// ITU-R 601 weights in 16-bit fixed point, rounded.
fn luma(rgb: &image::RgbImage) -> image::GrayImage {
    image::GrayImage::from_fn(rgb.width(), rgb.height(), |x, y| {
        let [r, g, b] = rgb.get_pixel(x, y).0;
        let l =
            (u32::from(r) * 19_595 + u32::from(g) * 38_470 + u32::from(b) * 7_471 + 0x8000) >> 16;
        image::Luma([l as u8])
    })
}

/// One deterministic transform.
fn apply(img: DynamicImage, t: Transform) -> Result<DynamicImage, TransformError> {
    let (w, h) = (img.width(), img.height());
    match t {
        Transform::Resize(n) => {
            // The shorter side to n, the longer one scaled alike (rounded
            // down, as torchvision's `Resize(int)` does).
            let (nw, nh) = if w <= h {
                (
                    n,
                    ((u64::from(h) * u64::from(n)) / u64::from(w.max(1))) as u32,
                )
            } else {
                (
                    ((u64::from(w) * u64::from(n)) / u64::from(h.max(1))) as u32,
                    n,
                )
            };
            if nw.max(nh) > MAX_SIDE {
                return Err(TransformError::TooLarge {
                    w,
                    h,
                    nw,
                    nh,
                    max: MAX_SIDE,
                });
            }
            Ok(img.resize_exact(nw.max(1), nh.max(1), FilterType::Triangle))
        }
        Transform::CenterCrop(n) => {
            if n > w || n > h {
                return Err(TransformError::SmallerThanCenterCrop { w, h, side: n });
            }
            // torchvision rounds the offset as Python does (ties to even).
            let x = (f64::from(w - n) / 2.0).round_ties_even() as u32;
            let y = (f64::from(h - n) / 2.0).round_ties_even() as u32;
            Ok(img.crop_imm(x, y, n, n))
        }
        Transform::RandomCrop(_) | Transform::HorizontalFlip(_) => {
            Err(TransformError::RandomAtDecoding)
        }
    }
}
