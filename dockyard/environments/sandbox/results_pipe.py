"""A one-way channel from a sandboxed program to its caller that is no path in the run's view.

A verdict written to a file can be forged by whatever the run's uid writes there first (its
path was in argv), and a file the run controls can be swapped for a symlink, a FIFO or a huge
file before the service reads it. A pipe's write end is inherited by the program only (its
number given on its command line); the caller reads it while the run goes on, up to a cap, and
the channel is gone when the run is.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field


@dataclass
class ResultsPipe:
    read_fd: int
    write_fd: int
    cap: int = 16 * 1024 * 1024  # bytes kept; more marks the results overflowed
    closed: bool = field(default=False, init=False)

    @classmethod
    def open(cls, cap: int = 16 * 1024 * 1024) -> ResultsPipe:
        read_fd, write_fd = os.pipe()
        os.set_inheritable(read_fd, False)
        return cls(read_fd, write_fd, cap)

    def close_write_end(self) -> None:
        """After the program started: only the program holds the write end, so EOF means it
        (and every process it handed the descriptor to) is gone."""
        with contextlib.suppress(OSError):
            os.close(self.write_fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.close_write_end()
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
