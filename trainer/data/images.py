"""Encoded image files to the uint8 tensors a model takes, in one place: the input pipeline of --dataset image_folder
and tfrecord decodes with these, and the exported model's `serve_image_bytes` signature decodes a posted file with
the same ops, so a served answer is made from exactly the pixels training saw."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")  # what tf.io.decode_image reads
FORMATS = "PNG, JPEG, GIF or BMP"
# How each of FORMATS starts: the one list the data check and the served model's check both accept.
SIGNATURES = ((b"\x89PNG", "PNG"), (b"\xff\xd8", "JPEG"), (b"GIF", "GIF"), (b"BM", "BMP"))
# How files often sent or stored in their place start, so a refusal (the served model's, the data check's) says what
# the file is: (offset, bytes there, what it is, its fix's kind in the data check: image_check.FIXES).
OTHER_SIGNATURES = (
    (8, b"WEBP", "a WebP image", "other format"),
    (0, b"II*\0", "a TIFF image", "other format"),
    (0, b"MM\0*", "a TIFF image", "other format"),
    (4, b"ftypheic", "a HEIC image", "other format"),
    (4, b"ftypheix", "a HEIC image", "other format"),
    (4, b"ftypmif1", "a HEIF image", "other format"),
    (4, b"ftypavif", "an AVIF image", "other format"),
    (0, b"<svg", "an SVG image", "other format"),
    (0, b"%PDF", "a PDF document", "not a picture"),
    (0, b"\x1f\x8b", "a gzip archive", "not a picture"),
    (0, b"PK\x03\x04", "a zip archive", "not a picture"),
    (0, b"8BPS", "a Photoshop (PSD) file", "other format"),
    (0, b"\x00\x00\x01\x00", "an ICO icon", "other format"),
    (0, b"\x00\x00\x00\x0cjP  ", "a JPEG 2000 image", "other format"),
    (0, b"\xff\x4f\xff\x51", "a JPEG 2000 image", "other format"),
    (0, b"\xff\x0a", "a JPEG XL image", "other format"),
    (0, b"\x00\x00\x00\x0cJXL ", "a JPEG XL image", "other format"),
    (0, b"version https://git-lfs", "a Git LFS pointer (run `git lfs pull` for the image)", "git lfs pointer"),
)
SHOWN_BYTES = 12  # of a refused file: enough for WebP's RIFF header to show its WEBP
# Each byte as a refusal shows it: printable ASCII as itself, anything else escaped as in a Python bytes literal.
_ESCAPED = tuple(
    {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}.get(
        byte, chr(byte) if 0x20 <= byte < 0x7F else f"\\x{byte:02x}"
    )
    for byte in range(256)
)


def decoded(encoded: tf.Tensor, shape: tuple[int, int, int]) -> tf.Tensor:
    """One encoded PNG, JPEG, GIF (its first frame) or BMP file as a uint8 image of `shape` (HxWxC): its channels
    converted (gray, RGB, alpha dropped) and resized when it differs. Raises InvalidArgumentError on bytes that are
    not such an image."""
    import tensorflow as tf

    # channels=0: GIF and BMP refuse a conversion to 1 channel in the decoder, so every format converts below.
    image = tf.io.decode_image(encoded, channels=0, expand_animations=False, dtype=tf.uint8)
    return resized(with_channels(image, shape[2]), shape)


def starts_as_accepted(encoded: tf.Tensor) -> tf.Tensor:
    """Whether each encoded file (a scalar or a batch) starts as one of SIGNATURES: what the served model reads."""
    import tensorflow as tf

    starts = [tf.strings.substr(encoded, 0, len(magic)) == magic for magic, _ in SIGNATURES]
    return tf.reduce_any(tf.stack(starts, axis=-1), axis=-1)


def assert_image_files(encoded: tf.Tensor, name: str) -> tf.Operation:
    """Fails (InvalidArgumentError) naming the first element of a batch of encoded files that starts as no PNG, JPEG,
    GIF or BMP file does, so a served request hears which of its files is no picture: in one line of printable ASCII,
    what the file is where OTHER_SIGNATURES knows it, what is accepted, and its first bytes, escaped as Python would."""
    import tensorflow as tf

    known = starts_as_accepted(encoded)
    # One unknown element past the end, so an empty or all-known batch has a "first" to name too.
    first = tf.argmin(tf.cast(tf.concat([known, [False]], 0), tf.int32))
    element = tf.gather(tf.concat([encoded, [b""]], 0), first)
    # Padded, so an offset past a short file's end reads zeros rather than failing.
    padded = tf.strings.join([element, b"\0" * max(offset + len(magic) for offset, magic, _, _ in OTHER_SIGNATURES)])
    what = tf.where(tf.strings.length(element) == 0, "is an empty file, not", "is not")
    for offset, magic, kind, _ in OTHER_SIGNATURES:
        what = tf.where(tf.strings.substr(padded, offset, len(magic)) == magic, f"is {kind}, not", what)
    start = tf.io.decode_raw(tf.strings.substr(element, 0, SHOWN_BYTES), tf.uint8)
    shown = tf.strings.reduce_join(tf.gather(tf.constant(_ESCAPED), tf.cast(start, tf.int32)))
    message = tf.strings.join(
        [
            "element ",
            tf.strings.as_string(first),
            f" of input '{name}' ",
            what,
            f' a {FORMATS} file (it starts with "',
            shown,
            '"): convert it to one of those',
        ]
    )
    return tf.debugging.Assert(tf.reduce_all(known), [message])


# A served file's pixels at most: a few-kilobyte PNG can hold a 40000x40000 image, whose decode and resize would take
# gigabytes of a predictor's memory; this admits a 48-megapixel photo.
MAX_PIXELS = 50_000_000


def assert_sizes(encoded: tf.Tensor, name: str, max_pixels: int = MAX_PIXELS) -> tf.Operation:
    """Fails (InvalidArgumentError) naming the first file whose header says it holds more than max_pixels pixels,
    before any is decoded."""
    import tensorflow as tf

    pixels = tf.map_fn(_header_pixels, encoded, fn_output_signature=tf.int64)
    first = tf.argmax(tf.concat([pixels, [0]], 0))
    message = tf.strings.format(
        f"element {{}} of input '{name}' holds {{}} pixels, more than this model decodes ({max_pixels}): send it "
        f"resized",
        (first, tf.gather(tf.concat([pixels, [0]], 0), first)),
    )
    return tf.debugging.Assert(tf.reduce_all(pixels <= max_pixels), [message])


def _header_pixels(encoded: tf.Tensor) -> tf.Tensor:
    """Height x width as the file's header says (PNG, GIF, BMP; JPEG's frame header), without decoding."""
    import tensorflow as tf

    padded = tf.strings.join([encoded, b"\0" * 32])

    def number(at: int, size: int, little_endian: bool) -> tf.Tensor:
        raw = tf.cast(tf.io.decode_raw(tf.strings.substr(padded, at, size), tf.uint8), tf.int64)
        weights = tf.constant([256**i for i in range(size)], tf.int64)
        return tf.reduce_sum(raw * (weights if little_endian else tf.reverse(weights, [0])))

    start = tf.strings.substr(encoded, 0, 4)
    return tf.case(
        [
            (tf.equal(start, b"\x89PNG"), lambda: number(16, 4, False) * number(20, 4, False)),
            (tf.equal(tf.strings.substr(start, 0, 3), b"GIF"), lambda: number(6, 2, True) * number(8, 2, True)),
            (tf.equal(tf.strings.substr(start, 0, 2), b"BM"), lambda: number(18, 4, True) * _bmp_height(number)),
            (
                tf.equal(tf.strings.substr(start, 0, 2), b"\xff\xd8"),
                lambda: tf.reduce_prod(tf.cast(tf.io.extract_jpeg_shape(encoded)[:2], tf.int64)),
            ),
        ],
        default=lambda: tf.constant(0, tf.int64),
    )


def _bmp_height(number: Callable[[int, int, bool], tf.Tensor]) -> tf.Tensor:
    """A BMP's height: a signed 32-bit number, negative for rows stored top-down."""
    import tensorflow as tf

    height = number(22, 4, True)
    return tf.where(height >= 2**31, 2**32 - height, height)


def with_channels(image: tf.Tensor, channels: int) -> tf.Tensor:
    """An HxWxN uint8 image (N: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) with `channels` (one of those) instead."""
    import tensorflow as tf

    if channels not in (1, 2, 3, 4):
        raise ValueError(f"image files hold 1 to 4 channels (gray, gray+alpha, RGB, RGBA), not {channels}")
    have = tf.shape(image)[-1]
    if channels < 3:
        color = tf.cond(have < 3, lambda: image[..., :1], lambda: _gray(image[..., :3]))
    else:
        color = tf.cond(have < 3, lambda: tf.image.grayscale_to_rgb(image[..., :1]), lambda: image[..., :3])
    if channels % 2:
        return color
    opaque = tf.fill(tf.concat([tf.shape(image)[:2], [1]], 0), tf.constant(255, tf.uint8))
    alpha = tf.cond(have % 2 == 0, lambda: image[..., -1:], lambda: opaque)
    return tf.concat([color, alpha], -1)


def _gray(rgb: tf.Tensor) -> tf.Tensor:
    import tensorflow as tf

    return tf.cast(tf.round(tf.image.rgb_to_grayscale(tf.cast(rgb, tf.float32))), tf.uint8)


def resized(image: tf.Tensor, shape: tuple[int, int, int]) -> tf.Tensor:
    """An HxWxC uint8 image at shape's height and width (bilinear, rounded back to uint8), untouched when it fits."""
    import tensorflow as tf

    height, width, _ = shape
    image = tf.cond(
        tf.reduce_all(tf.shape(image)[:2] == [height, width]),
        lambda: image,
        lambda: tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, (height, width))), 0, 255), tf.uint8),
    )
    return tf.ensure_shape(image, shape)
