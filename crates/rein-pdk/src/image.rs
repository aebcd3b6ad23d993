//! Images a plugin receives (a prompt's, a row's) or returns (a tool's output, an environment's
//! reply): a file's bytes with their media type, as the host carries them.
//!
//! [`Image::size`] reads a PNG, JPEG, GIF or WebP file's dimensions from its header, without
//! decoding it. With the `decode` feature, [`Image::decode_rgb`] gives its pixels and
//! [`Image::png_from_rgb`] writes pixels back as a PNG (for a tool that crops or draws).
//!
//! Where an image goes in a text is an `<image>` marker ([`IMAGE_MARKER`]): each marker stands
//! for the next image of the list beside the text, in order.

/// The marker that stands for the next image in a text.
pub const IMAGE_MARKER: &str = "<image>";

/// An image as a file holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp` (the host refuses others, and a
    /// type that does not match the bytes).
    pub media_type: String,
    /// The file's bytes.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Image({}, {} bytes)", self.media_type, self.data.len())
    }
}

impl Image {
    /// A PNG file.
    pub fn png(data: Vec<u8>) -> Self {
        Self {
            media_type: "image/png".into(),
            data,
        }
    }

    /// A JPEG file.
    pub fn jpeg(data: Vec<u8>) -> Self {
        Self {
            media_type: "image/jpeg".into(),
            data,
        }
    }

    /// Its width and height in pixels, read from the file's header; `None` when the bytes are
    /// not a PNG, JPEG, GIF or WebP file the header of which can be read.
    pub fn size(&self) -> Option<(u32, u32)> {
        let d = &self.data;
        let be16 = |at: usize| Some(u32::from(u16::from_be_bytes(d.get(at..at + 2)?.try_into().ok()?)));
        let le16 = |at: usize| Some(u32::from(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?)));
        let le24 = |at: usize| {
            let b = d.get(at..at + 3)?;
            Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
        };
        if d.starts_with(b"\x89PNG\r\n\x1a\n") && d.get(12..16) == Some(b"IHDR") {
            let be32 = |at: usize| Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?));
            return Some((be32(16)?, be32(20)?));
        }
        if d.starts_with(b"GIF87a") || d.starts_with(b"GIF89a") {
            return Some((le16(6)?, le16(8)?));
        }
        if d.starts_with(b"RIFF") && d.get(8..12) == Some(b"WEBP") {
            return match d.get(12..16)? {
                b"VP8 " => Some((le16(26)? & 0x3fff, le16(28)? & 0x3fff)),
                b"VP8L" => {
                    let bits = u32::from_le_bytes(d.get(21..25)?.try_into().ok()?);
                    Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
                }
                b"VP8X" => Some((le24(24)? + 1, le24(27)? + 1)),
                _ => None,
            };
        }
        if d.starts_with(b"\xff\xd8") {
            // Walk the segments to the first start-of-frame (SOF0..SOF15, but not DHT, JPG or DAC).
            let mut at = 2;
            while at + 4 <= d.len() {
                if d[at] != 0xff {
                    return None;
                }
                let marker = d[at + 1];
                if marker == 0xff {
                    at += 1;
                    continue;
                }
                let length = be16(at + 2)? as usize;
                if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
                    return Some((be16(at + 7)?, be16(at + 5)?));
                }
                at += 2 + length;
            }
        }
        None
    }
}

use crate::__private::reward::rein::plugin::types::Image as WitImage;

impl From<WitImage> for Image {
    fn from(image: WitImage) -> Self {
        Self {
            media_type: image.media_type,
            data: image.data,
        }
    }
}

impl From<Image> for WitImage {
    fn from(image: Image) -> Self {
        Self {
            media_type: image.media_type,
            data: image.data,
        }
    }
}

/// An image's pixels: `width × height` RGB triples, row by row.
#[cfg(feature = "decode")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbPixels {
    /// Its width.
    pub width: u32,
    /// Its height.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub rgb: Vec<u8>,
}

#[cfg(feature = "decode")]
impl RgbPixels {
    /// The colour at column `x`, row `y` (`None` outside the image).
    pub fn pixel(&self, x: u32, y: u32) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let at = (y as usize * self.width as usize + x as usize) * 3;
        Some([self.rgb[at], self.rgb[at + 1], self.rgb[at + 2]])
    }
}

#[cfg(feature = "decode")]
impl Image {
    /// Most pixels [`Image::decode_rgb`] decodes (a 4096 × 4096 image): a larger header is an
    /// error before anything is allocated, so a hostile image cannot exhaust the sandbox.
    pub const MAX_PIXELS: u64 = 4096 * 4096;

    /// Its pixels as RGB (alpha dropped, grey expanded); an error names what could not be read
    /// or the [`Image::MAX_PIXELS`] limit.
    pub fn decode_rgb(&self) -> Result<RgbPixels, String> {
        let (width, height) = self.size().ok_or_else(|| format!("{self:?} has no readable header"))?;
        if u64::from(width) * u64::from(height) > Self::MAX_PIXELS {
            return Err(format!(
                "{self:?} is {width}x{height}, over the {} pixels `Image::decode_rgb` decodes",
                Self::MAX_PIXELS
            ));
        }
        let decoded = image::load_from_memory(&self.data).map_err(|e| format!("{self:?}: {e}"))?;
        let rgb = decoded.to_rgb8();
        Ok(RgbPixels {
            width: rgb.width(),
            height: rgb.height(),
            rgb: rgb.into_raw(),
        })
    }

    /// `pixels` written as a PNG file.
    pub fn png_from_rgb(pixels: &RgbPixels) -> Result<Self, String> {
        let mut data = Vec::new();
        let encoder = image::codecs::png::PngEncoder::new(&mut data);
        image::ImageEncoder::write_image(
            encoder,
            &pixels.rgb,
            pixels.width,
            pixels.height,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| format!("cannot write a {}x{} PNG: {e}", pixels.width, pixels.height))?;
        Ok(Self::png(data))
    }
}

#[cfg(all(test, feature = "decode"))]
mod tests {
    use super::*;

    fn pixels(width: u32, height: u32) -> RgbPixels {
        let rgb = (0..width * height * 3).map(|i| (i * 7 % 251) as u8).collect();
        RgbPixels { width, height, rgb }
    }

    fn encoded(format: image::ImageFormat, width: u32, height: u32) -> Vec<u8> {
        let p = pixels(width, height);
        let buffer = image::RgbImage::from_raw(width, height, p.rgb).unwrap();
        let mut out = std::io::Cursor::new(Vec::new());
        image::DynamicImage::ImageRgb8(buffer)
            .write_to(&mut out, format)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn sizes_are_read_from_the_headers_of_every_format() {
        use image::ImageFormat as F;
        for (format, media_type) in [
            (F::Png, "image/png"),
            (F::Jpeg, "image/jpeg"),
            (F::Gif, "image/gif"),
            (F::WebP, "image/webp"),
        ] {
            let image = Image {
                media_type: media_type.into(),
                data: encoded(format, 37, 21),
            };
            assert_eq!(image.size(), Some((37, 21)), "{media_type}");
        }
        assert_eq!(Image::png(b"not a png".to_vec()).size(), None);
        assert_eq!(Image::jpeg(b"\xff\xd8\xff".to_vec()).size(), None);
    }

    #[test]
    fn pixels_round_trip_through_png() {
        let original = pixels(5, 3);
        let image = Image::png_from_rgb(&original).unwrap();
        assert_eq!(image.size(), Some((5, 3)));
        let decoded = image.decode_rgb().unwrap();
        assert_eq!(decoded, original);
        assert_eq!(decoded.pixel(4, 2), Some(original.rgb[42..45].try_into().unwrap()));
        assert_eq!(decoded.pixel(5, 0), None);
    }

    #[test]
    fn a_huge_header_is_refused_before_decoding() {
        let mut data = encoded(image::ImageFormat::Png, 2, 2);
        data[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        data[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let error = Image::png(data).decode_rgb().unwrap_err();
        assert!(error.contains("100000x100000, over the"), "{error}");
    }
}
