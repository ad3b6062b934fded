"""Owner-only folders and files, whatever the umask: the one place where jitckpt sets modes.

Every folder jitckpt creates (the checkpoint root and its steps, a rank's
checkpoint and the folders in it, the run directory, the host stash's
directory, the report's folder) is 0700 and every file 0600.  The mode is
given at creation, so that no moment exists in which the file is open to
others, and set again at once (``fchmod``), because the umask can only take
bits away: under ``umask 277`` a folder created 0700 would lack its owner's
write bit.

A folder of jitckpt's own that exists already (``make_private_dir``: the
host stash's ``/dev/shm/jitckpt-<run>`` under a sticky, world-writable
parent, a step folder another rank made) is used only if it is a real folder
of this user, and made 0700; a link in its place, another user's folder or
something else is refused (``NotPrivateError``).  A folder the user names
(the checkpoint root, the report's folder) is theirs: ``make_missing_dirs``
creates only what is missing, and leaves the rest to ``check_private``.

Everything is done on descriptors, never on a path that could change between
a check and the change: folders are checked with ``fstat`` on the descriptor
opened with ``O_NOFOLLOW``, files below a folder are opened relative to its
descriptor (``dir_fd``), so a link placed anywhere inside a checkpoint
redirects nothing.

The files a user's save function writes into a pending checkpoint are
created with the user's umask; ``restrict_to_owner`` takes the group's and
others' bits off them when the checkpoint is committed, except where that
would reach outside the checkpoint (a hard link to a file kept elsewhere), and
reports rather than fails where a mode cannot be changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
from pathlib import Path
from typing import Sequence

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPrivateError(PermissionError):
    """A place jitckpt would keep its files in is a link, another user's, or not what it should be;
    the message names it and the fix."""


def _chmod_fd(fd: int, mode: int) -> None:
    """``fchmod``, also for an ``O_PATH`` descriptor (which fchmod refuses): through its /proc link, the same inode."""
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        if exc.errno != errno.EBADF:
            raise
        os.chmod(f"/proc/self/fd/{fd}", mode)


def _not_a_folder(parent_fd: int | None, name: str | os.PathLike, shown: Path) -> NotPrivateError:
    """The error for ``name`` (in ``parent_fd``), which an open with O_DIRECTORY|O_NOFOLLOW refused."""
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    if is_link:
        return NotPrivateError(
            f"{shown} is a symbolic link, not a folder: jitckpt keeps its files only in real folders, never where a "
            f"link sends them. Remove the link (whoever placed it may mean to read or replace what jitckpt writes)"
        )
    return NotPrivateError(f"{shown} exists and is not a folder: move it away, or choose another place for jitckpt's files")


def _private_dir_at(parent_fd: int, name: str, shown: Path) -> int:
    """Folder ``name`` in folder ``parent_fd``, created if missing, made 0700; returns a descriptor of it.

    NotPrivateError if what is there is a link, not a folder, or another user's.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent_fd)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | _DIR_FLAGS, dir_fd=parent_fd)
        except PermissionError:  # unreadable (ours made under umask 0777, or another user's): O_PATH needs no right
            fd = os.open(name, os.O_PATH | _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):  # what O_DIRECTORY|O_NOFOLLOW says of a link or a file
            raise
        raise _not_a_folder(parent_fd, name, shown) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise NotPrivateError(
                f"{shown} belongs to another user (uid {st.st_uid}): whoever owns it decides what is in it, so jitckpt "
                f"does not keep its files there. Remove it (or have its owner remove it), or choose another place"
            )
        if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:  # mkdir's mode is masked by the umask; an old one is tightened
            _chmod_fd(fd, PRIVATE_DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private_dir(path: str | os.PathLike, parents: bool = False) -> None:
    """Create jitckpt's folder ``path`` owner-only (0700) whatever the umask, or make an existing one so.

    With ``parents``, missing parents are created the same way; parents that
    exist are left as they are (the user's).  An existing ``path`` must be a
    real folder of this user (NotPrivateError otherwise, naming it and the fix).
    """
    path = Path(os.path.abspath(path))
    if parents and not os.path.isdir(path.parent):
        make_private_dir(path.parent, parents=True)
    parent_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(_private_dir_at(parent_fd, path.name, path))
    finally:
        os.close(parent_fd)


def make_missing_dirs(path: str | os.PathLike) -> None:
    """Create the folder ``path`` the user named, and its missing parents, owner-only; folders that exist are the
    user's and left as they are (the checkpoint root is then judged by ``check_private``)."""
    if not os.path.isdir(path):
        make_private_dir(path, parents=True)


def _open_private_file_at(name: str | os.PathLike, flags: int, dir_fd: int | None, shown: Path) -> int:
    """``open_private_file`` of ``name`` relative to ``dir_fd`` (None: the working directory)."""
    try:
        fd = os.open(name, (flags & ~os.O_TRUNC) | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotPrivateError(
                f"{shown} is a symbolic link: jitckpt writes its files only in place, never where a link sends them. "
                f"Remove the link"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise NotPrivateError(
                f"{shown} is {'not a regular file' if not stat.S_ISREG(st.st_mode) else 'a file with other hard links'}: "
                f"jitckpt writes its own files only into a file of their own, so as to change nothing elsewhere. "
                f"Remove it"
            )
        _chmod_fd(fd, PRIVATE_FILE_MODE)
        if flags & os.O_TRUNC:  # only now that it is known to be a file of its own
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_file(path: str | os.PathLike, flags: int) -> int:
    """``os.open`` of ``path`` with ``flags`` (``O_CREAT`` among them), the file owner-only (0600) whatever the
    umask, also when it existed; a link in its place (``O_NOFOLLOW``), or a file with other hard links, is
    refused (NotPrivateError) before anything is changed.  Returns the descriptor."""
    return _open_private_file_at(path, flags, None, Path(path))


def _write_fd(fd: int, data: bytes, sync: bool) -> None:
    with open(fd, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def write_private_file(path: str | os.PathLike, data: bytes, sync: bool = False) -> None:
    """Create or replace file ``path`` owner-only with ``data`` (flushed to the disk with ``sync``)."""
    _write_fd(open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), data, sync)


def write_private_file_in(directory: str | os.PathLike, parts: Sequence[str], data: bytes, sync: bool = False) -> Path:
    """Create or replace the file ``directory/parts[0]/.../parts[-1]`` owner-only with ``data``; returns its path.

    The folders between are created or checked as ``make_private_dir`` does,
    each opened relative to the one above it, so that a link anywhere below
    ``directory`` (in a folder's place or the file's) is refused, never followed.
    """
    directory = Path(directory)
    fd = os.open(directory, os.O_PATH | _DIR_FLAGS)
    try:
        for depth, part in enumerate(parts[:-1], 1):
            inner = _private_dir_at(fd, part, directory.joinpath(*parts[:depth]))
            os.close(fd)
            fd = inner
        target = directory.joinpath(*parts)
        _write_fd(_open_private_file_at(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, fd, target), data, sync)
    finally:
        os.close(fd)
    return target


@dataclasses.dataclass
class Restricted:
    """What ``restrict_to_owner`` left as it was, as paths relative to the folder it was given."""

    linked: list[str] = dataclasses.field(default_factory=list)
    """Files open to group or others that have other hard links: their mode is that of the file elsewhere."""
    failed: list[str] = dataclasses.field(default_factory=list)
    """``path: reason`` for each folder or file whose mode could not be read or changed."""


def restrict_to_owner(directory: str | os.PathLike) -> Restricted:
    """Take the group's and others' permission bits off every folder and file under ``directory``.

    The owner's bits stay (an executable stays executable).  Links are neither
    changed nor followed.  A file with other hard links (a save function that
    ``os.link``s a large unchanged file into the checkpoint) is left as it is:
    its mode is the one of the file where it is linked from too; the
    checkpoint's own folders are owner-only, so no other user reaches it
    through them.  A mode that cannot be changed (another user's file, one
    removed meanwhile) is reported, not raised: no checkpoint is lost over a
    mode.  Each file is changed through a descriptor opened with
    ``O_NOFOLLOW`` relative to its folder's, after ``fstat`` on that descriptor.
    """
    directory = Path(directory)
    result = Restricted()

    def failed(where: str | os.PathLike | None, exc: OSError) -> None:
        result.failed.append(f"{where}: {exc.strerror or exc}")

    def tighten(fd: int, where: str) -> None:
        st = os.fstat(fd)
        if not st.st_mode & 0o077 or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            result.linked.append(where)
            return
        _chmod_fd(fd, stat.S_IMODE(st.st_mode) & 0o700)

    # A folder the walk cannot enter is named as the walk gives it (its name in the folder above).
    for folder, _dirs, files, dir_fd in os.fwalk(directory, onerror=lambda exc: failed(exc.filename, exc)):
        try:
            tighten(dir_fd, os.path.relpath(folder, directory))  # its subfolders when the walk reaches them
        except OSError as exc:
            failed(os.path.relpath(folder, directory), exc)
        for name in files:
            where = os.path.relpath(os.path.join(folder, name), directory)
            try:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                                 dir_fd=dir_fd)
                except PermissionError:  # a file its owner may not read: O_PATH needs no right
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ELOOP:  # ELOOP: a link, neither changed nor followed
                    failed(where, exc)
                continue
            try:
                tighten(fd, where)
            except OSError as exc:
                failed(where, exc)
            finally:
                os.close(fd)
    return result
