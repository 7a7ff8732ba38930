"""Reading a text file a user names: bounded in size, UTF-8 or refused, never binary."""

from __future__ import annotations

from pathlib import Path

from perfcast.ir.errors import UserError

#: The largest text file perfcast reads whole (config, spec, mapping). The largest shipped one is
#: far below this; a bigger file is a mistake (a weights file passed as a config) or an attack.
MAX_TEXT_BYTES = 16 * 1024 * 1024

EXCERPT_CHARS = 40


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)``, cut to about ``limit`` characters: what an error message may quote of
    content it refuses (a whole YAML document, a 10 MB string) without flooding the terminal."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…({len(text):,} chars)"


def read_bytes(path: Path | str, *, limit_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of ``path``; a missing, unreadable, non-regular or oversized file is a
    :class:`UserError` naming it."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise UserError(f"{p}: cannot read ({e.strerror})") from None
    if not p.is_file():
        raise UserError(f"{p}: not a regular file")
    if st.st_size > limit_bytes:
        raise UserError(f"{p}: {st.st_size:,} bytes, more than the {limit_bytes:,} perfcast reads "
                        f"(expected a text file)")
    try:
        with p.open("rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as e:
        raise UserError(f"{p}: cannot read ({e.strerror})") from None
    if len(data) > limit_bytes:  # grew since the stat, or a device file that reports no size
        raise UserError(f"{p}: more than the {limit_bytes:,} bytes perfcast reads (expected a text file)")
    return data


def read_text(path: Path | str, *, limit_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of ``path`` as UTF-8; a binary file (a NUL byte) or bytes that are not UTF-8 are
    a :class:`UserError` naming the file and the offset."""
    data = read_bytes(path, limit_bytes=limit_bytes)
    nul = data.find(b"\0")
    if nul >= 0:
        raise UserError(f"{path}: a binary file (NUL byte at offset {nul:,}); expected UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start:,})") from None
    return text.removeprefix("\ufeff")
