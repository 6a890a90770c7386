"""Python's cyclic garbage collector, paused where work makes very many live objects and no cycles."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_paused: list[bool] = []  # one entry per pause under way: whether the collector ran when the first began


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic collector off inside; on again once the last pause under way (any thread) ends, if it ran when
    the first began (a process that had it off keeps it off); also on an error.

    For work that makes very many objects that all stay alive until it ends and makes no reference cycles (a YAML
    file's event nodes, a catalog's DAGs, the board's overview): the collector's full passes would only walk them
    and the rest of the heap again and again, and find nothing to free. Reference counting still frees everything
    else at once; cycles made inside are collected after."""
    with _lock:
        was_enabled = gc.isenabled() if not _paused else _paused[0]
        if not _paused:
            gc.disable()
        _paused.append(was_enabled)
    try:
        yield
    finally:
        with _lock:
            _paused.pop()
            if not _paused and was_enabled:
                gc.enable()
