"""The run's filesystem and namespaces: one size-capped tmpfs, and bubblewrap around the program.

Workspace: as root, a session's directory is a fresh tmpfs of ``limits.max_disk_mb`` with three
directories: ``work`` (the session directory), ``tmp`` and ``shm``. Inside bubblewrap they are
the only writable places (``/`` is bound read-only), mounted at their own path, ``/tmp`` and
``/dev/shm``, so every byte the run writes counts against one quota, and everything is gone when
the tmpfs is unmounted. Without root no tmpfs can be mounted: the directories are plain ones
under the scratch root (only ``RLIMIT_FSIZE`` per file bounds them).

bubblewrap (Debian's ``bubblewrap``; ``scripts/ensure_system_packages.sh``) gives the run new
network, PID, IPC and UTS namespaces (a user namespace too when not root), a minimal filesystem
view (:func:`filesystem_view`: the system's programs and libraries, the interpreter's prefix and
a few ``/etc`` files, read-only; never the host's project files, datasets, run directories or
sockets), a fresh ``/proc`` and minimal ``/dev``, sets no-new-privileges (a setuid binary runs
with the caller's uid), loads the run's syscall filter (``--seccomp``, ``seccomp.py``) right
before its exec, and with ``--die-with-parent`` and the PID namespace, killing bubblewrap kills
every process of the run: the kernel kills a PID namespace's members when its init dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dockyard.environments.sandbox.identity import RunIdentity, SandboxUnavailableError

#: Where bubblewrap is looked up (module-level so a test can stand in a machine without it).
BWRAP_SEARCH_PATH = "/usr/bin:/bin:/usr/local/bin"
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 0x2
# What a run sees of the host, read-only: programs and libraries (on a merged-/usr system the
# top-level ones are symlinks into /usr, recreated as such), and the few /etc files the dynamic
# linker, git and Python's stdlib read. Everything else of the host (project checkouts,
# datasets, run directories, /run and /var with their Unix sockets) simply is not there, so
# neither a path lookup nor a connect() to a filesystem socket can reach it.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_PATHS = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)


def find_bwrap() -> str | None:
    return shutil.which("bwrap", path=BWRAP_SEARCH_PATH)


@dataclass
class Workspace:
    root: Path
    mounted: bool  # a tmpfs of its own (root only)

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def shm(self) -> Path:
        return self.root / "shm"

    @classmethod
    def create(
        cls, scratch_root: Path | None, size_bytes: int, identity: RunIdentity | None
    ) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="dockyard-sandbox-", dir=scratch_root))
        workspace = cls(root, mounted=False)
        try:
            os.chmod(root, 0o700)
            if identity is not None:
                _mount_tmpfs(root, size_bytes)
                workspace.mounted = True
            for directory in (workspace.work, workspace.tmp, workspace.shm):
                directory.mkdir(mode=0o700)
                if identity is not None:
                    os.chown(directory, identity.uid, identity.gid)
            # The sandbox uid must traverse the root to reach work/tmp/shm, nothing more.
            os.chmod(root, 0o711)
        except BaseException:
            workspace.remove()
            raise
        return workspace

    def remove(self) -> None:
        if self.mounted:
            _umount(self.root)
            self.mounted = False
        shutil.rmtree(self.root, ignore_errors=True)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(target: Path, size_bytes: int) -> None:
    options = f"size={size_bytes},mode=0700".encode()
    flags = _MS_NOSUID | _MS_NODEV
    if _libc().mount(b"tmpfs", str(target).encode(), b"tmpfs", flags, options) != 0:
        error = ctypes.get_errno()
        raise SandboxUnavailableError(f"cannot mount the run's tmpfs: {os.strerror(error)}")


def _umount(target: Path) -> None:
    with contextlib.suppress(OSError):
        if _libc().umount2(str(target).encode(), _MNT_DETACH) != 0:
            error = ctypes.get_errno()
            raise SandboxUnavailableError(f"cannot unmount {target}: {os.strerror(error)}")


def find_setpriv() -> str | None:
    return shutil.which("setpriv", path=BWRAP_SEARCH_PATH)


def filesystem_view(read_only: Iterable[str] = ()) -> list[str]:
    """bubblewrap options that build the run's root from :data:`SYSTEM_PATHS`,
    :data:`ETC_PATHS` and ``read_only`` (the interpreter's prefix, a test's fixture directory),
    each bound read-only at its own path; a top-level symlink is recreated, not followed."""
    options: list[str] = []
    made: set[str] = set()

    def parents_of(path: str) -> list[str]:
        # bubblewrap would create missing parents under the runner's umask (0700, root-owned):
        # not traversable by the run's uid. Made 0755 here, each once.
        missing = [str(parent) for parent in reversed(Path(path).parents) if str(parent) != "/"]
        made_now = [parent for parent in missing if parent not in made]
        made.update(made_now)
        return [option for parent in made_now for option in ("--perms", "0755", "--dir", parent)]

    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            options += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            options += ["--ro-bind", path, path]
    for path in ETC_PATHS:
        options += [*parents_of(path), "--ro-bind-try", path, path]
    for path in read_only:
        if not any(_is_within(path, system) for system in SYSTEM_PATHS):
            options += [*parents_of(path), "--ro-bind", path, path]
    return options


def _is_within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def bwrap_argv(
    bwrap: str,
    workspace: Workspace,
    *,
    as_root: bool,
    options: list[str] | None = None,
    read_only: Sequence[str] = (),
) -> list[str]:
    """The bubblewrap command line (``options`` before the ``--``) that the program follows."""
    argv = [bwrap, "--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc"]
    argv += ["--unshare-uts", "--hostname", "sandbox"]
    if not as_root:
        argv.append("--unshare-user")
    argv += [*filesystem_view(read_only), "--dev", "/dev", "--proc", "/proc"]
    # /tmp first: the workspace may itself live under /tmp and must stay reachable.
    argv += ["--bind", str(workspace.tmp), "/tmp", "--bind", str(workspace.shm), "/dev/shm"]
    # Under /tmp, bwrap would make the workspace's own path 0700 root inside the private /tmp.
    argv += ["--perms", "0711", "--dir", str(workspace.root)]
    argv += ["--bind", str(workspace.work), str(workspace.work)]
    # The root itself is bubblewrap's tmpfs: read-only, so the run cannot add top-level paths.
    argv += ["--remount-ro", "/"]
    return [*argv, *(options or []), "--"]


def drop_privileges_argv(setpriv: str, identity: RunIdentity) -> list[str]:
    """``setpriv`` (util-linux) from root to the run's uid/gid, no groups, no capabilities."""
    uid, gid = str(identity.uid), str(identity.gid)
    return [setpriv, "--reuid", uid, "--regid", gid, "--clear-groups", "--inh-caps=-all", "--"]
