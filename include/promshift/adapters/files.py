"""Read a user's file within an input budget (``core.inputs``): a regular file only, bounded size and time.

``read_user_file`` opens with ``O_NONBLOCK`` (opening a FIFO with no writer would otherwise hang), checks
with ``fstat`` on the open descriptor (no race with a swapped path) that it is a regular file — a FIFO,
``/dev/zero``, a device, a socket or a directory is one line — and reads at most ``max_bytes + 1`` bytes,
so a file that grows while read is refused too. Reads go in 1 MiB chunks with a deadline checked between
them: a regular file on a network mount that stalls is refused after ``read_timeout_s`` once its current
chunk returns (a single stuck read(2) cannot be interrupted from Python without a thread per read).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import BinaryIO

from promshift.core.inputs import InputBudget, InputRefused, decode_utf8

CHUNK = 1 << 20
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_regular(path: str | os.PathLike[str], where: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` and its ``fstat``; InputRefused (one line) for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputRefused(f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputRefused(f"cannot read {where}: it is {_kind(st.st_mode)}, not a regular file")
    return fd, st


def open_user_file(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """The regular file at ``path`` opened for reading in binary, for a caller that streams it under its own
    byte budget (a query log of gigabytes); a FIFO, a device or a directory is one line (InputRefused)."""
    fd, _ = _open_regular(path, f"{what} {os.fspath(path)!s}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_user_file(path: str | os.PathLike[str], budget: InputBudget) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed); InputRefused with one line otherwise."""
    where = f"{budget.what} {os.fspath(path)!s}"
    fd, st = _open_regular(path, where)
    try:
        if st.st_size > budget.max_bytes:
            raise InputRefused(f"cannot read {where}: {st.st_size:,} bytes, more than the "
                               f"{budget.max_bytes:,} allowed")
        deadline = time.monotonic() + budget.read_timeout_s
        chunks: list[bytes] = []
        size = 0
        while size <= budget.max_bytes:
            try:
                chunk = os.read(fd, min(CHUNK, budget.max_bytes + 1 - size))
            except OSError as exc:
                raise InputRefused(f"cannot read {where}: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                raise InputRefused(f"cannot read {where}: reading took longer than {budget.read_timeout_s:g}s")
        if size > budget.max_bytes:
            raise InputRefused(f"cannot read {where}: it grew past the {budget.max_bytes:,} bytes allowed "
                               "while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_user_text(path: str | os.PathLike[str], budget: InputBudget) -> str:
    """``read_user_file`` decoded as UTF-8 (a BOM stays); another encoding is one line naming the bad byte."""
    data = read_user_file(path, budget)
    return decode_utf8(data, f"{budget.what} {Path(path)}")
