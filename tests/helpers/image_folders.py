"""Image folders as users hold them (train/<class>/*.png|jpg|gif|bmp, and test/<class>/), written with Pillow: each
class draws a bright block at its own place on a noisy background, so a small CNN learns them in an epoch."""

from __future__ import annotations

import io
import pathlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

CLASSES = ("circle", "square", "star")
FORMATS = {".png": "PNG", ".jpg": "JPEG", ".gif": "GIF", ".bmp": "BMP", ".webp": "WEBP", ".tif": "TIFF"}


def picture(class_id: int, number: int, size: int | tuple[int, int] = 28, channels: int = 3) -> np.ndarray:
    """One image of class `class_id` (size: a side, or height and width): noise, with a bright block whose place says
    the class."""
    height, width = (size, size) if isinstance(size, int) else size
    rng = np.random.default_rng(class_id * 10_007 + number)
    pixels = rng.integers(0, 60, (height, width, channels), dtype=np.uint8)
    side = min(height, width)
    corner = (class_id * side // 4) % (side - side // 3)
    pixels[corner : corner + side // 3, corner : corner + side // 3] = 230
    return pixels


def encoded(pixels: np.ndarray, extension: str = ".png") -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    image.save(buffer, FORMATS[extension], **({"quality": 95} if extension == ".jpg" else {}))
    return buffer.getvalue()


def write(
    root: pathlib.Path,
    per_class: int = 12,
    test_per_class: int = 4,
    classes: tuple[str, ...] = CLASSES,
    size: int = 28,
    extensions: tuple[str, ...] = (".png",),
    sizes: Sequence[tuple[int, int]] = (),
) -> pathlib.Path:
    """root/train/<class>/ and root/test/<class>/ (test_per_class 0: no test/), formats taking turns by file, and
    sizes (height, width) too where given (else size x size)."""
    for split, count in (("train", per_class), ("test", test_per_class)):
        for class_id, name in enumerate(classes):
            folder = root / split / name
            for number in range(count):
                folder.mkdir(parents=True, exist_ok=True)
                extension = extensions[number % len(extensions)]
                offset = 0 if split == "train" else 1_000
                (folder / f"{number:04d}{extension}").write_bytes(
                    encoded(
                        picture(class_id, offset + number, sizes[number % len(sizes)] if sizes else size), extension
                    )
                )
    return root
