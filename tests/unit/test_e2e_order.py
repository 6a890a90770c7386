"""make e2e's module order (tests/conftest.py): longest first, and xdist told to keep it."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import E2E_MODULE_SECONDS, TESTS, pytest_collection_modifyitems

# The spine's module runs in make test (its own session); every other e2e module runs in make e2e.
SPINE_MODULES = {"e2e/test_demo_e2e.py"}


class FakeItem:
    """What the hook reads of a collected test: its file and its markers (it has its tier's already)."""

    def __init__(self, module: str, name: str) -> None:
        self.path = TESTS / module
        self.name = name

    def get_closest_marker(self, _name: str) -> Any:
        return object()


def test_every_e2e_module_has_its_seconds_and_every_listed_module_exists() -> None:
    e2e = {p.relative_to(TESTS).as_posix() for p in (TESTS / "e2e").glob("test_*.py")}
    assert e2e - SPINE_MODULES <= set(E2E_MODULE_SECONDS), sorted(e2e - SPINE_MODULES - set(E2E_MODULE_SECONDS))
    assert [m for m in E2E_MODULE_SECONDS if not (TESTS / m).is_file()] == []


def test_modules_run_longest_first_each_in_its_own_order_unlisted_after() -> None:
    items = [FakeItem("integration/test_faults.py", "f1"), FakeItem("integration/test_faults.py", "f2"),
             FakeItem("unit/core/test_other.py", "u1"), FakeItem("e2e/test_amp_demo_e2e.py", "a1"),
             FakeItem("e2e/test_amp_demo_e2e.py", "a2"), FakeItem("e2e/test_k8s_cr_demo_e2e.py", "k1"),
             FakeItem("unit/core/test_more.py", "u2")]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["k1", "a1", "a2", "f1", "f2", "u1", "u2"]


def test_make_e2e_keeps_the_collection_order_of_modules() -> None:
    """Without --no-loadscope-reorder xdist orders modules by their number of tests and the order above is lost."""
    makefile = (TESTS.parent / "Makefile").read_text()
    (e2e,) = re.findall(r"^e2e:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert "--dist loadfile" in e2e and "--no-loadscope-reorder" in e2e, e2e
