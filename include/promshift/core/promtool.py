"""Which promtool may check a source's config: never one older than the source Prometheus itself.

A promtool checks a config against its own version's schema: Debian's 2.42 refuses fields of current Prometheus
(``scrape_protocols``, ``runtime:``), so a fleet on 2.49 or 3.x would have every file deploy and rules move refused,
or worse, a field a newer server reads silently unchecked. ``validate`` reads the source's version
(``/api/v1/status/buildinfo``) and promtool's (``promtool --version``) and refuses, in one line, an older promtool.
"""

from __future__ import annotations

import re

# "2.42.0+ds", "v3.5.0", "3.0.0-rc.1", "promtool, version 2.42.0+ds (branch: debian/sid, ...)"
_VERSION = re.compile(r"(?<![\d.])v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})")

Version = tuple[int, int, int]


def parse_version(text: str) -> Version | None:
    """The first ``major.minor.patch`` in ``text`` (a build suffix or pre-release tag ignored); None if none."""
    found = _VERSION.search(text[:500])
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def shown(version: Version) -> str:
    return ".".join(map(str, version))


def promtool_problem(source_version: str, promtool_version: str, *, promtool: str = "promtool") -> str | None:
    """One line when ``promtool`` (its ``--version`` text) is older than the source (its buildinfo version), or
    either version cannot be read; None when promtool is the source's version or newer."""
    source = parse_version(source_version)
    tool = parse_version(promtool_version)
    if source is None:
        return f"the source Prometheus reports no version promshift can read ({source_version[:60]!r})"
    if tool is None:
        first = (promtool_version.strip().splitlines() or [""])[0]
        return f"{promtool} --version printed no version promshift can read ({first[:80]!r})"
    if tool < source:
        return (f"promtool {shown(tool)} ({promtool}) is older than the source Prometheus {shown(source)}: it checks "
                f"configs against its own version's schema; build the image with "
                f"--build-arg PROMETHEUS_VERSION={shown(source)} (docs/deployment.md#promtool)")
    return None
