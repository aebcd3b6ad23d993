//! Encoded images (PNG, JPEG, GIF, WebP) to 8-bit RGB pixels, bounded before anything is
//! allocated, and converted to RGB as transformers' `convert_to_rgb` does: an image with other
//! channels is laid over a white background (Pillow's `alpha_composite` in its integer
//! arithmetic), so a transparent pixel is white, not black.

use std::io::Cursor;

use super::resample::Pixels;

/// How large an image may be. Both are checked before the pixels are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// The most bytes of an encoded image.
    pub max_bytes: usize,
    /// The most pixels (width × height) of a decoded image.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 32 MiB encoded and Pillow's decompression-bomb bound of 89,478,485 pixels.
    fn default() -> Self {
        Self {
            max_bytes: 32 << 20,
            max_pixels: 89_478_485,
        }
    }
}

/// Why an image cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The encoded image is larger than [`ImageLimits::max_bytes`].
    #[error("the image is {bytes} bytes, over the limit of {limit} bytes")]
    TooManyBytes {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The decoded image would be larger than [`ImageLimits::max_pixels`].
    #[error("the image is {width}x{height} pixels, over the limit of {limit} pixels")]
    TooManyPixels {
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
        /// The limit.
        limit: u64,
    },
    /// Not an image in a format rein reads, or a corrupt one.
    #[error("cannot decode the image: {0}")]
    Decode(String),
}

/// The RGB pixels of the encoded image `bytes`.
pub fn decode_rgb(bytes: &[u8], limits: ImageLimits) -> Result<Pixels, ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let decode = |e: image::ImageError| ImageError::Decode(e.to_string());
    let reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    let (width, height) = reader.into_dimensions().map_err(decode)?;
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            limit: limits.max_pixels,
        });
    }
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    let mut bounds = image::Limits::default();
    bounds.max_image_width = Some(width);
    bounds.max_image_height = Some(height);
    bounds.max_alloc = Some(limits.max_pixels.saturating_mul(16));
    reader.limits(bounds);
    let image = reader.decode().map_err(decode)?;
    let (width, height) = (width as usize, height as usize);
    let data = match image {
        image::DynamicImage::ImageRgb8(rgb) => rgb.into_raw(),
        other => on_white(&other.into_rgba8().into_raw()),
    };
    Ok(Pixels {
        width,
        height,
        channels: 3,
        data,
    })
}

/// RGBA samples laid over white, as Pillow's `alpha_composite(white, image)` (7 fraction bits,
/// divisions by 255 by shifts), then the alpha dropped.
fn on_white(rgba: &[u8]) -> Vec<u8> {
    const BITS: u32 = 7;
    let div255 = |a: u32| ((a >> 8) + a) >> 8;
    let mut rgb = Vec::with_capacity(rgba.len() / 4 * 3);
    for pixel in rgba.chunks_exact(4) {
        let alpha = u32::from(pixel[3]);
        if alpha == 0 {
            rgb.extend_from_slice(&[255, 255, 255]);
            continue;
        }
        let out_alpha = alpha * 255 + 255 * (255 - alpha);
        let source = alpha * 255 * 255 * (1 << BITS) / out_alpha;
        let white = 255 * (1 << BITS) - source;
        for &channel in &pixel[..3] {
            let sum = u32::from(channel) * source + 255 * white;
            rgb.push((div255(sum + (0x80 << BITS)) >> BITS) as u8);
        }
    }
    rgb
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32, rgba: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let image = image::RgbaImage::from_raw(width, height, rgba.to_vec()).unwrap();
        image
            .write_to(&mut Cursor::new(&mut bytes), image::ImageFormat::Png)
            .unwrap();
        bytes
    }

    #[test]
    fn transparency_is_white_and_opaque_pixels_keep_their_colour() {
        let bytes = png(3, 1, &[10, 20, 30, 255, 10, 20, 30, 0, 0, 0, 0, 128]);
        let pixels = decode_rgb(&bytes, ImageLimits::default()).unwrap();
        assert_eq!(pixels.data[..6], [10, 20, 30, 255, 255, 255]);
        // Black at half opacity over white: mid grey.
        assert_eq!(pixels.data[6..], [127, 127, 127]);
    }

    #[test]
    fn limits_are_checked_before_decoding() {
        let bytes = png(40, 30, &[7; 40 * 30 * 4]);
        let few_pixels = ImageLimits {
            max_pixels: 1000,
            ..ImageLimits::default()
        };
        assert_eq!(
            decode_rgb(&bytes, few_pixels),
            Err(ImageError::TooManyPixels {
                width: 40,
                height: 30,
                limit: 1000
            })
        );
        let few_bytes = ImageLimits {
            max_bytes: 10,
            ..ImageLimits::default()
        };
        assert!(matches!(
            decode_rgb(&bytes, few_bytes),
            Err(ImageError::TooManyBytes { limit: 10, .. })
        ));
        assert!(matches!(
            decode_rgb(b"not an image", ImageLimits::default()),
            Err(ImageError::Decode(_))
        ));
        assert!(matches!(
            decode_rgb(&bytes[..bytes.len() / 2], ImageLimits::default()),
            Err(ImageError::Decode(_))
        ));
    }
}
