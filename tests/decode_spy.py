"""Which JPEG scale each decode used, on either decoding path (Pillow's draft, simplejpeg)."""

from __future__ import annotations

from PIL import JpegImagePlugin

from fastload.vision import turbo_decode


def record_reductions(monkeypatch) -> list[int]:
    """A list that receives the reduction (2, 4 or 8) of every JPEG decoded at reduced
    size from now on, through Pillow's ``draft`` or through simplejpeg."""
    scales: list[int] = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spied_draft(self, mode, size):
        width = self.width
        result = draft(self, mode, size)
        if result is not None:
            scales.append(round(width / result[1][2]))  # the frame's box, reduced
        return result

    decode_rgb = turbo_decode.decode_rgb

    def spied_decode_rgb(data, header, reduction):
        pixels = decode_rgb(data, header, reduction)
        if pixels is not None and reduction > 1:
            scales.append(reduction)
        return pixels

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spied_draft)
    monkeypatch.setattr(turbo_decode, "decode_rgb", spied_decode_rgb)
    return scales
