"""Files made the way attackers and broken tools make them, and the one check every hostile-input test makes of the
CLI: exit code 2, one ``lift3d: error:`` line naming the problem, no traceback, within seconds."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
from PIL import Image

from lift3d.cli import main

SECONDS = 120  # a refusal comes from a header or a size, not from decoding: far less on any machine not shared


def refused(argv: list[str], capsys, *expected: str, seconds: float = SECONDS) -> str:
    """Run ``lift3d argv`` in-process and assert a clean refusal holding every ``expected`` text; the error line."""
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("lift3d: error:")]
    assert code == 2, (argv, code, err[-3000:])
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert len(errors) == 1, err[-3000:]
    for text in expected:
        assert text in errors[0], (text, errors[0])
    assert elapsed < seconds, f"{argv} took {elapsed:.1f} s to refuse"
    return errors[0]


def png_bytes(width: int = 8, height: int = 8, seed: int = 0) -> bytes:
    """A small real PNG (noise), as any tool writes one."""
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def forged_png(width: int, height: int) -> bytes:
    """A small PNG whose IHDR claims ``width`` x ``height`` pixels, with a valid checksum (a decompression bomb's
    header: readers that trust it allocate width x height x 4 bytes)."""
    data = png_bytes()
    at = data.index(b"IHDR")
    chunk = b"IHDR" + struct.pack(">II", width, height) + data[at + 12: at + 17]
    return data[:at] + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[at + 21:]


def forged_webp(width: int, height: int) -> bytes:
    """A lossless WebP (VP8L) whose header claims a ``width`` x ``height`` canvas (each at most 16384)."""
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 4), np.uint8), "RGBA").save(buffer, "WEBP", lossless=True, exact=True)
    data = bytearray(buffer.getvalue())
    assert data[12:16] == b"VP8L" and data[20] == 0x2F
    bits = struct.unpack_from("<I", data, 21)[0] & ~((1 << 28) - 1)
    struct.pack_into("<I", data, 21, bits | (width - 1) | ((height - 1) << 14))
    return bytes(data)


def gzip_bomb(head: bytes, inflated: int) -> bytes:
    """A gzip stream of ``head`` and then zeros up to ``inflated`` bytes, compressed as it streams (a 1 MiB
    stream inflates to about 1 GiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts, zeros, left = [packer.compress(head)], bytes(1 << 20), inflated - len(head)
    while left > 0:
        parts.append(packer.compress(zeros[:min(left, len(zeros))]))
        left -= len(zeros)
    return b"".join(parts) + packer.flush()


def huge_png(width: int, height: int) -> bytes:
    """A genuine PNG of ``width`` x ``height`` black pixels (1-bit gray), a few hundred kilobytes however large:
    the decompression bomb a scanner or an attacker writes, valid to its last checksum."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    packer, row = zlib.compressobj(9), bytes(1 + (width + 7) // 8)  # filter byte 0, then the row's bits
    rows = b"".join(packer.compress(row * 512) for _ in range(height // 512)) + packer.compress(row * (height % 512))
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows + packer.flush()) + chunk(b"IEND", b"")


def jpeg_bytes(width: int = 96, height: int = 64, seed: int = 0) -> bytes:
    """A real JPEG (noise, so its scan is long)."""
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()
