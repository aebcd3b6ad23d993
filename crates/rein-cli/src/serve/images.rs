//! Images in chat requests, for a vision-language model: OpenAI's `image_url` content parts —
//! `data:` URLs, and `file://` paths under `--allowed-local-media-path` (vLLM's flag); never a
//! network fetch — decoded within the server's limits and processed as the model's image
//! processor does, in the HTTP worker, before the request reaches the engine.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rein_model::vision::{ImageLimits, ImageProcessor, ProcessedImage, decode_rgb};
use rein_posttrain::ImageSource;

/// What the server needs to read a request's images.
pub(crate) struct ServedImages {
    /// The model's image processor.
    pub processor: ImageProcessor,
    /// The most bytes and pixels of one image.
    pub limits: ImageLimits,
    /// The most images in one request (`--limit-images-per-prompt`).
    pub max_images: usize,
    /// The directory `file://` URLs may read from, canonical; `None` refuses them.
    pub local_media: Option<PathBuf>,
}

impl ServedImages {
    /// The image at `url`, processed.
    pub(crate) fn read(&self, url: &str) -> Result<ProcessedImage, String> {
        let bytes = match url.split_once(':') {
            Some(("data", rest)) => self.data_url(rest)?,
            Some(("file", rest)) => self.local_file(rest.trim_start_matches("//"))?,
            Some(("http" | "https", _)) => {
                return Err(
                    "image URLs are not fetched (this server makes no network requests): send the \
                            image as a data: URL"
                        .into(),
                );
            }
            _ => return Err(format!("`{}` is not a data: or file: URL", shorten(url))),
        };
        let pixels = decode_rgb(&bytes, self.limits).map_err(|e| e.to_string())?;
        self.processor.process(&pixels)
    }

    /// A `data:[<media type>][;base64],<data>` URL's bytes (base64 only), bounded before
    /// decoding.
    fn data_url(&self, rest: &str) -> Result<Vec<u8>, String> {
        let (header, data) = rest
            .split_once(',')
            .ok_or("a data: URL without a comma before its data")?;
        if !header.ends_with(";base64") {
            return Err(format!("data:{header}: only base64 data URLs are read"));
        }
        let bound = data.len() / 4 * 3;
        if bound > self.limits.max_bytes + 3 {
            return Err(format!(
                "the image is about {bound} bytes, over the limit of {} bytes",
                self.limits.max_bytes
            ));
        }
        (base64::engine::general_purpose::STANDARD.decode(data.trim())).map_err(|e| format!("data:{header}: {e}"))
    }

    /// The file at `path`, if it lies under the allowed directory, read within the byte limit.
    fn local_file(&self, path: &str) -> Result<Vec<u8>, String> {
        let Some(root) = &self.local_media else {
            return Err("file: URLs are refused: start the server with --allowed-local-media-path DIR".into());
        };
        let file = Path::new(path)
            .canonicalize()
            .map_err(|e| format!("file://{path}: {e}"))?;
        if !file.starts_with(root) {
            return Err(format!(
                "file://{path} is outside --allowed-local-media-path {}",
                root.display()
            ));
        }
        ImageSource::Path(file).bytes(self.limits.max_bytes)
    }
}

/// The first characters of `url`, for an error message.
fn shorten(url: &str) -> String {
    match url.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &url[..end]),
        None => url.to_string(),
    }
}
