"""Files and directories only their owner may read: a run directory holds the resolved config
(``data_plane.credentials`` included) and logs, so it is 0700 and its files 0600."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make it 0700, also if it already existed."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(PRIVATE_DIR_MODE)
    return path


def create_private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing (before anything is written to it), else make it 0600.

    ``O_CREAT`` with mode 0600 leaves no moment in which another user could open it.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def write_private_text(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``; the file is 0600."""
    create_private_file(path)
    path.write_text(text)
