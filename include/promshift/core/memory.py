"""Python's cyclic garbage collector, paused where a build makes millions of live objects and no cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic collector off inside, as it was after (also on an error).

    For work that makes very many objects that all stay alive (a YAML file's event nodes, a catalog's DAGs): the
    collector's full passes would only walk them again and again as the heap grows, and find nothing to free.
    Reference counting still frees everything else at once; cycles made inside are collected after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
