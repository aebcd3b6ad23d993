//! Resizing 8-bit images exactly as Pillow's `Image.resize` does (`libImaging/Resample.c`), so
//! that an image processor written against PIL gives the same pixels here.
//!
//! Pillow resamples separably — a horizontal pass over the rows the vertical pass will read, then
//! a vertical pass; or, since Pillow 13, the vertical pass first when the height shrinks by more
//! than twice what the width does — each output sample a weighted sum of its input samples. The weights are the
//! filter evaluated at the input samples' centres (stretched by the scale when shrinking),
//! normalised to sum to 1, then rounded to fixed point with 22 fraction bits; sums start at ½ and
//! are clipped to `0..=255` after each pass. Every step below is that arithmetic, in that order
//! (`f64` where Pillow uses `double`, `i32` where it uses `int`), so results are bit-identical.

/// Fraction bits of the fixed-point weights (`PRECISION_BITS` in Pillow: 32 − 8 − 2).
const PRECISION_BITS: u32 = 22;

/// A resampling filter, numbered as PIL's `Image.Resampling` (and transformers' `resample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `LANCZOS` (1): a 3-lobed windowed sinc.
    Lanczos,
    /// `BILINEAR` (2): the triangle filter.
    Bilinear,
    /// `BICUBIC` (3): Keys' cubic with a = −0.5.
    Bicubic,
    /// `BOX` (4): each output sample the mean of the input samples it covers.
    Box,
    /// `HAMMING` (5): a Hamming-windowed sinc of support 1.
    Hamming,
}

impl Filter {
    /// The filter PIL numbers `code`; `None` for NEAREST (0), which is not a convolution, and
    /// for codes PIL does not have.
    pub fn from_pil(code: u64) -> Option<Self> {
        match code {
            1 => Some(Self::Lanczos),
            2 => Some(Self::Bilinear),
            3 => Some(Self::Bicubic),
            4 => Some(Self::Box),
            5 => Some(Self::Hamming),
            _ => None,
        }
    }

    /// Half the width of the filter's non-zero part, in input samples at scale 1.
    fn support(self) -> f64 {
        match self {
            Self::Box => 0.5,
            Self::Bilinear | Self::Hamming => 1.0,
            Self::Bicubic => 2.0,
            Self::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Self::Box => f64::from(u8::from(x > -0.5 && x <= 0.5)),
            Self::Bilinear => (1.0 - x.abs()).max(0.0),
            Self::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    return 1.0;
                }
                if x >= 1.0 {
                    return 0.0;
                }
                let x = x * std::f64::consts::PI;
                // Pillow's window constants are `float` literals promoted to double.
                x.sin() / x * (f64::from(0.54f32) + f64::from(0.46f32) * x.cos())
            }
            Self::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Self::Lanczos => match (-3.0..3.0).contains(&x) {
                true => sinc(x) * sinc(x / 3.0),
                false => 0.0,
            },
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

/// An 8-bit image of `channels` interleaved samples per pixel, row by row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Samples per pixel.
    pub channels: usize,
    /// `height × width × channels` samples.
    pub data: Vec<u8>,
}

impl Pixels {
    /// The `width × height` window whose top-left pixel is (`x`, `y`).
    ///
    /// # Panics
    /// When the window is not inside the image.
    pub fn crop(&self, x: usize, y: usize, width: usize, height: usize) -> Self {
        assert!(
            x + width <= self.width && y + height <= self.height,
            "crop outside the image"
        );
        let row = self.width * self.channels;
        let data = (y..y + height)
            .flat_map(|r| &self.data[r * row + x * self.channels..r * row + (x + width) * self.channels])
            .copied()
            .collect();
        Self {
            width,
            height,
            channels: self.channels,
            data,
        }
    }

    /// The image resized to `width × height` with `filter`, as PIL's
    /// `Image.resize((width, height), filter)`.
    pub fn resize(&self, width: usize, height: usize, filter: Filter) -> Self {
        let vertical = Weights::new(self.height, height, filter);
        // Pillow 13 runs the vertical pass first when the height shrinks by more than twice
        // what the width does (the passes round to 8 bits in between, so the order shows).
        let shrinks = |from: usize, to: usize| from as i64 - to as i64;
        if height < self.height && shrinks(self.height, height) > 2 * shrinks(self.width, width) {
            let image = vertical.apply_columns(self, 0);
            return match width != self.width {
                true => Weights::new(self.width, width, filter).apply_rows(&image, 0..height),
                false => image,
            };
        }
        let mut image = std::borrow::Cow::Borrowed(self);
        // Row 0 of `image` is this image's row `offset`.
        let mut offset = 0;
        if width != self.width {
            // Only the rows the vertical pass reads.
            let first = vertical.bounds[0].0;
            let last = vertical.bounds.last().map_or(first, |&(start, len)| start + len);
            image = std::borrow::Cow::Owned(Weights::new(self.width, width, filter).apply_rows(self, first..last));
            offset = first;
        }
        if height != self.height {
            image = std::borrow::Cow::Owned(vertical.apply_columns(&image, offset));
        }
        image.into_owned()
    }
}

/// The fixed-point weights of one pass: per output sample, its first input sample, how many it
/// reads, and their weights.
struct Weights {
    bounds: Vec<(usize, usize)>,
    taps: usize,
    weights: Vec<i32>,
}

impl Weights {
    /// Pillow's `precompute_coeffs` then `normalize_coeffs_8bpc`, for `input` samples to `output`.
    fn new(input: usize, output: usize, filter: Filter) -> Self {
        let scale = input as f64 / output as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let taps = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(output);
        let mut weights = vec![0i32; output * taps];
        let mut k = vec![0f64; taps];
        for xx in 0..output {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's `(int)` truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize - xmin;
            let mut ww = 0.0;
            for (x, w) in k.iter_mut().enumerate().take(xmax) {
                *w = filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss);
                ww += *w;
            }
            for (x, w) in k.iter().enumerate().take(xmax) {
                let w = if ww != 0.0 { w / ww } else { *w };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                weights[xx * taps + x] = match w < 0.0 {
                    true => (-0.5 + fixed) as i32,
                    false => (0.5 + fixed) as i32,
                };
            }
            bounds.push((xmin, xmax));
        }
        Self { bounds, taps, weights }
    }

    /// The horizontal pass over `rows` of `image`.
    fn apply_rows(&self, image: &Pixels, rows: std::ops::Range<usize>) -> Pixels {
        let c = image.channels;
        let width = self.bounds.len();
        let mut data = Vec::with_capacity(rows.len() * width * c);
        for y in rows.clone() {
            let row = &image.data[y * image.width * c..(y + 1) * image.width * c];
            for (xx, &(xmin, len)) in self.bounds.iter().enumerate() {
                let k = &self.weights[xx * self.taps..xx * self.taps + len];
                for channel in 0..c {
                    let sum = (k.iter().enumerate()).fold(1i32 << (PRECISION_BITS - 1), |s, (x, &w)| {
                        s + i32::from(row[(xmin + x) * c + channel]) * w
                    });
                    data.push(clip8(sum));
                }
            }
        }
        Pixels {
            width,
            height: rows.len(),
            channels: c,
            data,
        }
    }

    /// The vertical pass over `image`, whose row 0 is input row `offset`.
    fn apply_columns(&self, image: &Pixels, offset: usize) -> Pixels {
        let (c, width) = (image.channels, image.width);
        let height = self.bounds.len();
        let mut data = Vec::with_capacity(height * width * c);
        for (yy, &(ymin, len)) in self.bounds.iter().enumerate() {
            let k = &self.weights[yy * self.taps..yy * self.taps + len];
            for sample in 0..width * c {
                let sum = (k.iter().enumerate()).fold(1i32 << (PRECISION_BITS - 1), |s, (y, &w)| {
                    s + i32::from(image.data[(ymin - offset + y) * width * c + sample]) * w
                });
                data.push(clip8(sum));
            }
        }
        Pixels {
            width,
            height,
            channels: c,
            data,
        }
    }
}

/// A fixed-point sum back to a sample: its integer part, clipped to `0..=255`.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(width: usize, height: usize) -> Pixels {
        let data = (0..width * height).map(|i| ((i * 37) % 256) as u8).collect();
        Pixels {
            width,
            height,
            channels: 1,
            data,
        }
    }

    #[test]
    fn the_same_size_is_the_same_image() {
        let image = ramp(7, 5);
        for filter in [
            Filter::Lanczos,
            Filter::Bicubic,
            Filter::Bilinear,
            Filter::Box,
            Filter::Hamming,
        ] {
            assert_eq!(image.resize(7, 5, filter), image, "{filter:?}");
        }
    }

    #[test]
    fn a_flat_image_stays_flat_at_any_size() {
        let flat = Pixels {
            width: 9,
            height: 4,
            channels: 3,
            data: vec![200; 9 * 4 * 3],
        };
        for (w, h) in [(3, 11), (20, 2), (9, 1), (1, 4)] {
            let out = flat.resize(w, h, Filter::Lanczos);
            assert_eq!((out.width, out.height), (w, h));
            assert!(out.data.iter().all(|&v| v == 200), "{w}x{h}: {:?}", out.data);
        }
    }

    #[test]
    fn halving_with_a_box_averages_pairs() {
        let image = Pixels {
            width: 4,
            height: 1,
            channels: 1,
            data: vec![10, 20, 100, 201],
        };
        // (10 + 20) / 2 = 15, (100 + 201) / 2 = 150.5, rounded half up.
        assert_eq!(image.resize(2, 1, Filter::Box).data, vec![15, 151]);
    }

    #[test]
    fn nearest_is_not_a_convolution_filter() {
        assert_eq!(Filter::from_pil(0), None);
        assert_eq!(Filter::from_pil(1), Some(Filter::Lanczos));
        assert_eq!(Filter::from_pil(6), None);
    }
}
