"""Reading files the run could have written, from the root-side service, without trusting them.

A run controls every path under its checkout: a protected file may have been swapped for a
symlink (to a root-only file, or ``/dev/zero``), a FIFO (an ``open`` that blocks forever and
holds the job's slot), a Unix socket (``open`` fails: ENXIO) or a huge file. So each read here
opens with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails, a FIFO opens at once), checks on the
open descriptor that it is a regular file, and reads at most ``cap`` bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The most the service reads of any one file the run may have written.
DEFAULT_CAP_BYTES = 64 * 1024 * 1024
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UntrustedFileError(OSError):
    """The path is not a regular file of at most the cap (or cannot be opened as one)."""


def kind_of(mode: int) -> str:
    """A file type's name, for evidence and for digests of what is no regular file."""
    for test, name in (
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character-device"),
        (stat.S_ISBLK, "block-device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "regular" if stat.S_ISREG(mode) else "unknown"


def read_regular_file(path: Path, cap: int = DEFAULT_CAP_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link to one) of at most ``cap``."""
    try:
        descriptor = os.open(path, _FLAGS)
    except OSError as error:  # ELOOP: a symlink; ENXIO: a socket; ENOENT
        raise UntrustedFileError(f"{path}: cannot open as a regular file: {error}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise UntrustedFileError(f"{path} is a {kind_of(status.st_mode)}, no regular file")
        if status.st_size > cap:
            raise UntrustedFileError(f"{path} is {status.st_size} bytes, over {cap}")
        chunks, size = [], 0
        while chunk := os.read(descriptor, min(1 << 20, cap + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:  # grew after the fstat
                raise UntrustedFileError(f"{path} is over {cap} bytes")
        return b"".join(chunks)
    finally:
        os.close(descriptor)
