"""What an image file's own bytes say, read in Python without decoding: which accepted format it starts as (the
served model's list, images.SIGNATURES) or what else it is, its height, width and channels from its header (more
pixels than images.MAX_PIXELS are refused, as the served model refuses them), and whether a JPEG ends where its data
does. The data check refuses with these the files the served model would
refuse, or that TensorFlow would decode into something other than the picture; the default --image-shape comes
from the sizes, the same on every worker.
"""

from __future__ import annotations

import struct

from trainer.data import images

Size = tuple[int, int, int]  # height, width, channels as TensorFlow decodes them (channels=0)

# Enough of a file for the header of every accepted format but a JPEG with large metadata, which reads on.
HEADER_BYTES = 64 * 1024


def accepted_format(data: bytes) -> str | None:
    """The name of the accepted format (images.SIGNATURES) the bytes start as, else None."""
    return next((name for magic, name in images.SIGNATURES if data.startswith(magic)), None)


def what_else(data: bytes) -> str:
    """What a file that starts as no accepted format is, in a few words, as far as its first bytes tell."""
    return identified(data)[0]


def identified(data: bytes) -> tuple[str, str]:
    """What a file that starts as no accepted format is (what_else), and the kind of its fix (image_check.FIXES):
    a picture in another format converts, a Git LFS pointer is fetched, the rest hold no picture to convert."""
    if not data:
        return "an empty file", "cut short"  # a copy or download that stopped before its first byte
    for offset, magic, what, kind in images.OTHER_SIGNATURES:
        if data[offset : offset + len(magic)] == magic:
            return what, kind
    if data[4:8] == b"ftyp":
        return "an MP4 or QuickTime file", "not a picture"
    start = data[:256].lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a download that saved a web page instead of the picture?)", "not a picture"
    if start.startswith((b"<svg", b"<?xml")):
        return "an SVG or XML file", "other format"
    try:
        data[:256].decode("utf-8")
    except UnicodeDecodeError:
        return f"in no format the trainer knows (it starts with {data[:8]!r})", "other format"
    return "a text file", "not a picture"


def refusal(data: bytes) -> tuple[str, str] | None:
    """Why the data check refuses a file from its bytes alone (not an accepted format, a JPEG cut short, more pixels
    than the served model decodes), and the kind of refusal (a key of image_check.FIXES), else None."""
    name = accepted_format(data)
    if name is None:
        what, kind = identified(data)
        return f"{what}, not a {images.FORMATS} file", kind
    if name == "JPEG" and not _jpeg_is_whole(data):
        return (
            "a JPEG cut short: it ends before its end-of-image marker (a partial copy or download), and TensorFlow "
            "either refuses it or fills the missing part grey"
        ), "cut short"
    size = size_of(data)
    if size is not None and size[0] * size[1] > images.MAX_PIXELS:
        return (
            f"its header says {size[1]}x{size[0]}, {size[0] * size[1]} pixels, more than the served model decodes "
            f"({images.MAX_PIXELS})"
        ), "too large"
    return None


def _jpeg_is_whole(data: bytes) -> bool:
    """Whether a JPEG's segments and scans run on to its end-of-image marker: each header segment skipped by its
    length, each scan's coded data to its next marker (an 0xFF there is followed by 0x00 or a restart marker)."""
    at = 2
    while True:
        at = data.find(b"\xff", at)
        while 0 <= at < len(data) - 1 and data[at + 1] == 0xFF:  # fill bytes before a marker
            at += 1
        if at < 0 or at + 1 >= len(data):
            return False
        marker = data[at + 1]
        if marker == 0xD9:
            return True
        if marker == 0x00 or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # coded data, a restart or TEM: no length
            at += 2
            continue
        if at + 4 > len(data):
            return False
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        at += 2 + length
        if at > len(data):
            return False


def size_of(data: bytes) -> Size | None:
    """Height, width and channels as the file's header says (as TensorFlow decodes it), or None where the header is
    not there or not one of the accepted formats'."""
    name = accepted_format(data)
    try:
        if name == "PNG":
            return _png_size(data)
        if name == "JPEG":
            return _jpeg_size(data)
        if name == "GIF":
            width, height = struct.unpack("<HH", data[6:10])
            return height, width, 3
        if name == "BMP":
            return _bmp_size(data)
    except struct.error:  # the header ends early
        return None
    return None


def read_size(path: str) -> Size | None:
    """The header's size of one file (size_of), reading only its start unless a JPEG's metadata runs past it."""
    with open(path, "rb") as file:
        data = file.read(HEADER_BYTES)
        size = size_of(data)
        if size is None and accepted_format(data) == "JPEG" and len(data) == HEADER_BYTES:
            size = size_of(data + file.read())
    return size


def _png_size(data: bytes) -> Size | None:
    width, height, _, color_type = struct.unpack(">IIBB", data[16:26])
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(color_type)
    if channels is None:
        return None
    if color_type == 3 and _png_has_transparency(data):  # a palette with transparency decodes as RGBA
        channels = 4
    return height, width, channels


def _png_has_transparency(data: bytes) -> bool:
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind in (b"tRNS", b"IDAT"):
            return kind == b"tRNS"
        at += 12 + length
    return False


# JPEG's start-of-frame markers (baseline, extended, progressive, lossless, arithmetic): not DHT, JPG or DAC.
JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> Size | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:
            at += 1
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in JPEG_FRAMES:
            height, width, components = struct.unpack(">HHB", data[at + 5 : at + 10])
            return height, width, 1 if components == 1 else 3  # CMYK decodes as RGB
        if marker == 0xDA:  # the first scan, and no frame before it
            return None
        at += 2 + length
    return None


def _bmp_size(data: bytes) -> Size | None:
    (header,) = struct.unpack("<I", data[14:18])
    if header == 12:  # OS/2's header: 16-bit sizes
        width, height, _, bits = struct.unpack("<HHHH", data[18:26])
    else:
        width, height, _, bits = struct.unpack("<iiHH", data[18:30])
    channels = {32: 4, 24: 3}.get(bits, 1)
    return abs(height), width, channels
