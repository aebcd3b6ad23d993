//! Images that cross the sandbox: a file's bytes (PNG, JPEG, GIF or WebP) with their media type,
//! beside text whose `<image>` markers show where each one goes.
//!
//! Nothing here decodes pixels: a reward that reads an image decodes it itself, and a
//! vision-language model's processor decodes what the model sees. An [`Image`] only checks that
//! its bytes start as its media type says, so a plugin cannot pass one kind of file off as
//! another.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The marker that stands for the next image in a text that carries images.
pub const IMAGE_MARKER: &str = "<image>";

/// The media types an [`Image`] may have, each with how its files start.
const SIGNATURES: [(&str, &[u8]); 5] = [
    ("image/png", b"\x89PNG\r\n\x1a\n"),
    ("image/jpeg", b"\xff\xd8\xff"),
    ("image/gif", b"GIF87a"),
    ("image/gif", b"GIF89a"),
    ("image/webp", b"RIFF"),
];

/// The media type `bytes` start as, or `None` when they are none of [`Image`]'s.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    let webp = |b: &[u8]| b.len() >= 12 && &b[8..12] == b"WEBP";
    (SIGNATURES.iter())
        .find(|(media_type, signature)| bytes.starts_with(signature) && (*media_type != "image/webp" || webp(bytes)))
        .map(|(media_type, _)| *media_type)
}

/// An image as a file holds it. Cloning shares the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    media_type: &'static str,
    bytes: Arc<[u8]>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Image({}, {} bytes)", self.media_type, self.bytes.len())
    }
}

impl Image {
    /// The image whose file is `bytes`, its media type read from their signature; an error
    /// says they are not a PNG, JPEG, GIF or WebP file.
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Result<Self, String> {
        let bytes = bytes.into();
        match sniff(&bytes) {
            Some(media_type) => Ok(Self { media_type, bytes }),
            None => Err(format!(
                "{} bytes that are not a PNG, JPEG, GIF or WebP file",
                bytes.len()
            )),
        }
    }

    /// The image `bytes` said to be of `media_type`: an error names the media type when rein
    /// does not carry it or when the bytes are not of it.
    pub fn with_media_type(media_type: &str, bytes: impl Into<Arc<[u8]>>) -> Result<Self, String> {
        if !SIGNATURES.iter().any(|(known, _)| *known == media_type) {
            let known: Vec<&str> = SIGNATURES.iter().map(|(m, _)| *m).collect();
            return Err(format!("media type `{media_type}` is not one of {}", known.join(", ")));
        }
        let image = Self::new(bytes).map_err(|e| format!("said to be {media_type}, but {e}"))?;
        match image.media_type == media_type {
            true => Ok(image),
            false => Err(format!(
                "said to be {media_type}, but its bytes are {}",
                image.media_type
            )),
        }
    }

    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub fn media_type(&self) -> &'static str {
        self.media_type
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The image as a data URL (`data:image/png;base64,…`).
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.media_type, STANDARD.encode(&self.bytes))
    }

    /// The image in a data URL; an error says what is wrong with the URL or its bytes.
    pub fn from_data_url(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("data:")
            .ok_or_else(|| "an image must be a data URL (`data:image/png;base64,…`)".to_string())?;
        let (media_type, data) = rest
            .split_once(";base64,")
            .ok_or_else(|| "an image's data URL must be base64 (`data:image/png;base64,…`)".to_string())?;
        let bytes = STANDARD
            .decode(data)
            .map_err(|e| format!("the image's base64 is invalid: {e}"))?;
        Self::with_media_type(media_type, bytes)
    }
}

/// How many `<image>` markers `texts` hold together.
pub fn count_markers<'a>(texts: impl IntoIterator<Item = &'a str>) -> usize {
    texts.into_iter().map(|t| t.matches(IMAGE_MARKER).count()).sum()
}

/// An image serialises as its data URL, as OpenAI's `image_url` parts carry images.
impl Serialize for Image {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.data_url())
    }
}

impl<'de> Deserialize<'de> for Image {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let url = String::deserialize(deserializer)?;
        Image::from_data_url(&url).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    #[test]
    fn the_media_type_is_read_from_the_signature() {
        assert_eq!(Image::new(PNG.to_vec()).unwrap().media_type(), "image/png");
        assert_eq!(
            Image::new(b"\xff\xd8\xff\xe0".to_vec()).unwrap().media_type(),
            "image/jpeg"
        );
        assert_eq!(Image::new(b"GIF89a..".to_vec()).unwrap().media_type(), "image/gif");
        assert_eq!(
            Image::new(b"RIFF\0\0\0\0WEBPVP8 ".to_vec()).unwrap().media_type(),
            "image/webp"
        );
        assert!(Image::new(b"RIFF\0\0\0\0WAVEfmt ".to_vec()).is_err());
        let text = Image::new(b"hello".to_vec()).unwrap_err();
        assert!(text.contains("5 bytes that are not a PNG"), "{text}");
    }

    #[test]
    fn a_declared_media_type_must_match_the_bytes() {
        assert!(Image::with_media_type("image/png", PNG.to_vec()).is_ok());
        let lie = Image::with_media_type("image/jpeg", PNG.to_vec()).unwrap_err();
        assert!(
            lie.contains("said to be image/jpeg, but its bytes are image/png"),
            "{lie}"
        );
        let unknown = Image::with_media_type("image/tiff", PNG.to_vec()).unwrap_err();
        assert!(unknown.contains("`image/tiff` is not one of"), "{unknown}");
    }

    #[test]
    fn images_round_trip_through_data_urls() {
        let image = Image::new(PNG.to_vec()).unwrap();
        let json = serde_json::to_string(&image).unwrap();
        assert!(json.starts_with("\"data:image/png;base64,"), "{json}");
        assert_eq!(serde_json::from_str::<Image>(&json).unwrap(), image);
        let bad = serde_json::from_str::<Image>("\"data:image/png;base64,@@\"").unwrap_err();
        assert!(bad.to_string().contains("base64 is invalid"), "{bad}");
        let path = serde_json::from_str::<Image>("\"board.png\"").unwrap_err();
        assert!(path.to_string().contains("must be a data URL"), "{path}");
    }

    #[test]
    fn markers_are_counted_across_texts() {
        assert_eq!(count_markers(["<image>a", "b<image><image>", "c"]), 3);
        assert_eq!(count_markers([]), 0);
    }
}
