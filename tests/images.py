"""Small image files for the vision tests: structured content, written with Pillow."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from fastload.cli import synthetic_image


def save_image(path: str | os.PathLike, size: tuple[int, int] = (40, 30), seed: int = 0,
               image_format: str | None = None) -> str:
    """Write a photo-like ``size`` (width, height) image to ``path``; format from the extension."""
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    pixels = synthetic_image(size[0], size[1], np.random.default_rng(seed))
    Image.fromarray(pixels).save(path, image_format)
    return os.fspath(path)


def smooth_photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth RGB image: a two-colour gradient with a few soft-edged discs and boxes.

    Smooth on purpose: reduced-size decoding is compared against full decoding
    with a pixel-error bound, which only makes sense below the Nyquist limit
    of the output.
    """
    rng = np.random.default_rng(seed)
    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    start, end = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
    pixels = start + (0.6 * xs + 0.4 * ys) * (end - start)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.uniform(0, 0.8) * width, rng.uniform(0, 0.8) * height
        x1, y1 = x0 + rng.uniform(0.1, 0.4) * width, y0 + rng.uniform(0.1, 0.4) * height
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    return img.filter(ImageFilter.GaussianBlur(radius=max(width, height) / 400))


def write_bytes(path: str | os.PathLike, data: bytes) -> str:
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return os.fspath(path)


def save_folder(root: str | os.PathLike, files: list) -> str:
    """An image folder of ``(class, file name, (width, height))`` entries, the
    i-th image drawn with seed i; its root, as a string."""
    for seed, (label, name, size) in enumerate(files):
        save_image(os.path.join(os.fspath(root), label, name), size=size, seed=seed)
    return os.fspath(root)


def cache_fill_reference(path: str | os.PathLike, side: int, fmt: str = "raw") -> Image.Image:
    """What the decoded-image cache stores for ``path`` with the default loader, written
    from its rule: a JPEG decoded at the largest reduction (1/8, 1/4, 1/2) that still
    covers the cached size, then LANCZOS over that frame to the size whose longer side
    is ``side`` (never enlarged); a ``jpeg`` store keeps that at quality 90."""
    import io

    with open(path, "rb") as f:
        img = Image.open(f)
        width, height = img.size
        size = (width, height)
        if max(width, height) > side:
            scale = side / max(width, height)
            size = (side, max(1, round(height * scale))) if width >= height else \
                (max(1, round(width * scale)), side)
        reduction = next((s for s in (8, 4, 2) if img.format == "JPEG" and
                          width >= s * size[0] and height >= s * size[1]), 1)
        if reduction > 1:
            img.draft("RGB", (width // reduction, height // reduction))
        img = img.convert("RGB")
    if size != (width, height):
        img = img.resize(size, Image.Resampling.LANCZOS,
                         box=(0, 0, width / reduction, height / reduction))
    if fmt == "jpeg":
        buffer = io.BytesIO()
        img.save(buffer, "JPEG", quality=90)
        img = Image.open(io.BytesIO(buffer.getvalue()))
        img.load()
    return img
