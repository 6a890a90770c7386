"""The two-worker tiers' module order (tests/conftest.py): longest first, and xdist told to keep it."""

from __future__ import annotations

import re

from tests.conftest import MODULE_SECONDS, TESTS, longest_first


class FakeItem:
    """What the ordering reads of a collected test: its file."""

    def __init__(self, module: str, name: str) -> None:
        self.path = TESTS / module
        self.name = name


def test_every_e2e_module_has_its_seconds_and_every_listed_module_exists() -> None:
    e2e = {p.relative_to(TESTS).as_posix() for p in (TESTS / "e2e").glob("test_*.py")}
    assert e2e <= set(MODULE_SECONDS), sorted(e2e - set(MODULE_SECONDS))
    assert [m for m in MODULE_SECONDS if not (TESTS / m).is_file()] == []


def test_listed_modules_run_longest_first_then_the_others_most_tests_first_each_in_its_own_order() -> None:
    items = [FakeItem("integration/test_faults.py", "f1"), FakeItem("integration/test_faults.py", "f2"),
             FakeItem("unit/core/test_one.py", "o1"), FakeItem("e2e/test_amp_demo_e2e.py", "a1"),
             FakeItem("e2e/test_amp_demo_e2e.py", "a2"), FakeItem("e2e/test_k8s_cr_demo_e2e.py", "k1"),
             FakeItem("unit/core/test_two.py", "t1"), FakeItem("unit/core/test_two.py", "t2"),
             FakeItem("unit/core/test_other.py", "x1")]
    longest_first(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["k1", "a1", "a2", "f1", "f2", "t1", "t2", "o1", "x1"]


def test_the_two_worker_tiers_keep_the_collection_order_of_modules() -> None:
    """Without --no-loadscope-reorder xdist orders modules by their number of tests and the order above is lost."""
    makefile = (TESTS.parent / "Makefile").read_text()
    commands = [line for line in makefile.splitlines() if "--dist loadfile" in line]
    assert len(commands) == 2, commands  # make test's second tier, make e2e (the unit tier: -n 2, test by test)
    for line in commands:
        assert re.search(r"--dist loadfile --no-loadscope-reorder\b", line), line
