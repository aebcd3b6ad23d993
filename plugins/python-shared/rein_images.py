"""Images a Python plugin receives (a prompt's, a row's) or returns (a tool's output, an
environment's reply): Python's `rein_pdk::image`. An image is the WIT's `Image(media_type, data)`:
a file's bytes and their media type (`image/png`, `image/jpeg`, `image/gif` or `image/webp`).

- `size(image)`: its width and height from the file's header (any of the four), or `None`;
- `decode_png(image)`: a PNG's pixels as `Pixels(width, height, rgb)` (not interlaced: grey and
  palette of 1 to 8 bits, RGB and alpha of 8; alpha dropped), within `MAX_PIXELS`;
- `png_from_rgb(pixels)`: pixels written as a PNG file's bytes (for a tool that crops or draws).

Where an image goes in a text is an `<image>` marker (`MARKER`): each stands for the next image
of the list beside the text, in order.

    from rein_images import decode_png
    pixels = decode_png(group.images[0])
    red = sum(1 for x, y in pixels.coordinates() if pixels.pixel(x, y) == (220, 30, 30))

Pure standard library (`struct`, `zlib`): JPEG, GIF and WebP pixels need the Rust PDK's `decode`.
"""

import struct
import zlib
from typing import NamedTuple, Optional, Tuple

MARKER = "<image>"
MAX_PIXELS = 4096 * 4096
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Pixels(NamedTuple):
    """`width * height` RGB triples, row by row, in `rgb` (bytes)."""

    width: int
    height: int
    rgb: bytes

    def pixel(self, x: int, y: int) -> Optional[Tuple[int, int, int]]:
        """The colour at column `x`, row `y` (`None` outside the image)."""
        if not (0 <= x < self.width and 0 <= y < self.height):
            return None
        at = (y * self.width + x) * 3
        return (self.rgb[at], self.rgb[at + 1], self.rgb[at + 2])

    def coordinates(self):
        """Every (x, y), row by row."""
        return ((x, y) for y in range(self.height) for x in range(self.width))


def size(image) -> Optional[Tuple[int, int]]:
    """The image's width and height from its file's header; `None` when unreadable."""
    d = bytes(image.data)
    try:
        if d.startswith(PNG_SIGNATURE) and d[12:16] == b"IHDR":
            return struct.unpack(">II", d[16:24])
        if d[:6] in (b"GIF87a", b"GIF89a"):
            return struct.unpack("<HH", d[6:10])
        if d[:4] == b"RIFF" and d[8:12] == b"WEBP":
            chunk = d[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", d[26:30])
                return (w & 0x3FFF, h & 0x3FFF)
            if chunk == b"VP8L":
                (bits,) = struct.unpack("<I", d[21:25])
                return ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
            if chunk == b"VP8X":
                w = int.from_bytes(d[24:27], "little")
                h = int.from_bytes(d[27:30], "little")
                return (w + 1, h + 1)
            return None
        if d[:2] == b"\xff\xd8":
            # The first start-of-frame segment (SOF0..SOF15, but not DHT, JPG or DAC).
            at = 2
            while at + 4 <= len(d):
                if d[at] != 0xFF:
                    return None
                marker = d[at + 1]
                if marker == 0xFF:
                    at += 1
                    continue
                (length,) = struct.unpack(">H", d[at + 2 : at + 4])
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                    height, width = struct.unpack(">HH", d[at + 5 : at + 9])
                    return (width, height)
                at += 2 + length
    except struct.error:
        return None
    return None


def _chunks(d: bytes):
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(d):
        length, kind = struct.unpack(">I4s", d[at : at + 8])
        yield kind, d[at + 8 : at + 8 + length]
        at += 12 + length


def _unfilter(raw: bytes, stride: int, height: int, bpp: int) -> bytearray:
    """The scanlines (`stride` bytes each) of `raw` with PNG's per-line filters undone; `bpp`:
    bytes per pixel, at least 1."""
    out = bytearray(stride * height)
    prev = bytearray(stride)
    at = 0
    for y in range(height):
        kind = raw[at]
        line = bytearray(raw[at + 1 : at + 1 + stride])
        at += 1 + stride
        if len(line) != stride:
            raise ValueError("the PNG's pixel data is shorter than its header says")
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                corner = prev[i - bpp] if i >= bpp else 0
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
            elif kind != 0:
                raise ValueError(f"unknown PNG filter {kind}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return out


def decode_png(image) -> Pixels:
    """A PNG's pixels as RGB; `ValueError` names what cannot be read or the `MAX_PIXELS` limit."""
    d = bytes(image.data)
    if not d.startswith(PNG_SIGNATURE):
        raise ValueError(f"{len(d)} bytes that are not a PNG file")
    header, palette, data = None, b"", []
    for kind, body in _chunks(d):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body[:13])
        elif kind == b"PLTE":
            palette = body
        elif kind == b"IDAT":
            data.append(body)
    if header is None:
        raise ValueError("the PNG has no header")
    width, height, depth, colour, _, _, interlace = header
    if width * height > MAX_PIXELS:
        raise ValueError(f"the PNG is {width}x{height}, over the {MAX_PIXELS} pixels decode_png decodes")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour)
    depths = (1, 2, 4, 8) if colour in (0, 3) else (8,)
    if channels is None or depth not in depths or interlace:
        raise ValueError(
            "decode_png reads non-interlaced PNGs of 1-8-bit grey or palette, 8-bit RGB or alpha "
            f"(this one: depth {depth}, colour type {colour}, interlace {interlace})"
        )
    stride = (width * channels * depth + 7) // 8
    # One filter byte per line and the pixels, at most: a decompression bomb stops there.
    raw = zlib.decompressobj().decompress(b"".join(data), height * (1 + stride))
    lines = _unfilter(raw, stride, height, max(1, channels * depth // 8))
    rgb = bytearray(width * height * 3)
    top = (1 << depth) - 1
    for y in range(height):
        line = lines[y * stride : (y + 1) * stride]
        for x in range(width):
            if depth < 8:
                bit = x * depth
                value = (line[bit // 8] >> (8 - depth - bit % 8)) & top
                px = (value,)
            else:
                px = line[x * channels : (x + 1) * channels]
            if colour == 3:
                px = palette[px[0] * 3 : px[0] * 3 + 3]
                if len(px) != 3:
                    raise ValueError("a palette index past the PNG's palette")
            elif colour in (0, 4):
                grey = px[0] * 255 // top
                px = (grey, grey, grey)
            at = (y * width + x) * 3
            rgb[at : at + 3] = bytes(px[:3])
    return Pixels(width, height, bytes(rgb))


def png_from_rgb(pixels: Pixels):
    """`pixels` written as a PNG: the WIT's `Image("image/png", bytes)`."""
    from wit_world.imports.types import Image

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    stride = pixels.width * 3
    raw = b"".join(b"\0" + pixels.rgb[y * stride : (y + 1) * stride] for y in range(pixels.height))
    header = struct.pack(">IIBBBBB", pixels.width, pixels.height, 8, 2, 0, 0, 0)
    data = PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return Image("image/png", data)
