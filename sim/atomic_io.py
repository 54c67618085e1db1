"""Atomic file writes: a reader sees the old file or the complete new one.

Long runs write results as they go (Standards: "nothing is lost"); a crash
while writing must never leave a truncated file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably; return the path.

    The bytes go to a temporary file in the same directory, which is flushed,
    fsynced and renamed over ``path`` with :func:`os.replace`; the directory
    is then fsynced so the rename survives a power loss. The temporary file
    is removed if anything fails.

    Raises:
        OSError: if the directory is missing or not writable.
    """
    target = Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        # mkstemp creates the file 0600; give the result the mode a plain open() would
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`write_bytes_atomic` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Persist a rename on POSIX; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
