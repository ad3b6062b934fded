"""Owner-only folders and files, whatever the umask: the one place where jitckpt sets modes.

Every folder jitckpt creates (the checkpoint root and its steps, a rank's
checkpoint and the folders in it, the run directory, the host stash's
directory, the report's folder) is 0700 and every file 0600.  The mode is
given at creation, so that no moment exists in which the file is open to
others, and set again at once (``chmod``/``fchmod``), because the umask can
only take bits away: under ``umask 277`` a folder created 0700 would lack its
owner's write bit.  The files a user's save function writes into a pending
checkpoint are created with the user's umask; ``restrict_to_owner`` takes the
group's and others' bits off them when the checkpoint is committed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dir(path: Path, parents: bool = False) -> None:
    """Create directory ``path`` (and missing parents) owner-only, whatever the umask; an existing one is left as is."""
    path = Path(path)
    if parents and not path.parent.exists():
        make_private_dir(path.parent, parents=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    os.chmod(path, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask


def open_private_file(path: Path, flags: int) -> int:
    """``os.open`` of ``path`` with ``flags`` (``O_CREAT`` among them), the file owner-only (0600) whatever the
    umask, also when it existed; a link in its place is refused (``O_NOFOLLOW``).  Returns the descriptor."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_file(path: Path, data: bytes, sync: bool = False) -> None:
    """Create or replace file ``path`` owner-only with ``data`` (flushed to the disk with ``sync``)."""
    with open(open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def restrict_to_owner(directory: Path) -> None:
    """Take the group's and others' permission bits off every folder and file under ``directory``.

    The owner's bits stay (an executable stays executable); links are neither
    changed nor followed, so a file outside that one links to is left alone.
    """
    for folder, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
