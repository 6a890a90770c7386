"""core.promtool: a promtool older than the source Prometheus is refused in one line (issue 37 item 5)."""

from __future__ import annotations

import pytest

from promshift.core.promtool import parse_version, promtool_problem

DEBIAN = "promtool, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)"
OFFICIAL = "promtool, version 3.5.0 (branch: HEAD, revision: 8be3a9560fbdd18a94dedec4b747c35178177202)"


@pytest.mark.parametrize(("text", "version"), [
    (DEBIAN, (2, 42, 0)), (OFFICIAL, (3, 5, 0)), ("2.53.4", (2, 53, 4)), ("v3.0.0-rc.1", (3, 0, 0)),
    ("2.42.0+ds", (2, 42, 0)), ("unknown", None), ("", None), ("1.2", None),
])
def test_versions_are_read_from_buildinfo_and_promtool_alike(text: str, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


def test_an_older_promtool_is_one_line_naming_the_build_argument() -> None:
    problem = promtool_problem("3.5.0", DEBIAN)
    assert problem == ("promtool 2.42.0 (promtool) is older than the source Prometheus 3.5.0: it checks configs "
                       "against its own version's schema; build the image with --build-arg PROMETHEUS_VERSION=3.5.0 "
                       "(docs/deployment.md#promtool)")
    assert promtool_problem("2.42.1", DEBIAN) is not None  # a patch older is older
    assert promtool_problem("2.49.0", "promtool, version 2.48.9", promtool="/opt/promtool").startswith(
        "promtool 2.48.9 (/opt/promtool) is older than the source Prometheus 2.49.0")


@pytest.mark.parametrize("source", ["2.42.0+ds", "2.41.0", "v2.42.0"])
def test_the_same_or_a_newer_promtool_passes(source: str) -> None:
    assert promtool_problem(source, DEBIAN) is None
    assert promtool_problem(source, OFFICIAL) is None


def test_an_unreadable_version_is_refused_not_passed() -> None:
    assert promtool_problem("devel", DEBIAN) == ("the source Prometheus reports no version promshift can read "
                                                 "('devel')")
    assert promtool_problem("3.5.0", "promtool (custom build)") == (
        "promtool --version printed no version promshift can read ('promtool (custom build)')")
