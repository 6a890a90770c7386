"""Where things live at run time: catalog, state directory, DCGM counter list (env-driven)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from promshift.core.catalog import (
    MAX_CATALOG_CHARS,
    Catalog,
    CatalogCheck,
    CatalogError,
    check_catalog,
    unreadable_catalog,
)
from promshift.core.cost import AmpPrices
from promshift.core.dcgm import DcgmCounter, metrics

REPO_ROOT = Path(__file__).resolve().parents[2]


def state_home() -> Path:
    """``PROMSHIFT_HOME`` (default ``./.state``): stack, audit DB, snapshots, routing manifest."""
    return Path(os.environ.get("PROMSHIFT_HOME", ".state")).resolve()


def snapshots_dir() -> Path:
    return state_home() / "snapshots"


def default_catalog_path() -> Path:
    return Path(os.environ.get("PROMSHIFT_CATALOG", REPO_ROOT / "catalog" / "metric_groups.yaml"))


def default_profile() -> str | None:
    return os.environ.get("PROMSHIFT_PROFILE") or None


@lru_cache(maxsize=1)
def dcgm_counters() -> tuple[DcgmCounter, ...]:
    """dcgm-exporter's default counters, shipped inside the package."""
    from promshift.stack.fleet import load_counters

    return load_counters()


def read_catalog_text(path: str | os.PathLike[str]) -> str:
    """The catalog file's text; a missing, unreadable, oversized or non-UTF-8 file is a one-line CatalogError."""
    catalog_path = Path(path)
    try:
        is_dir, size = catalog_path.is_dir(), catalog_path.stat().st_size
        # Refused before reading: the text limit is in characters, UTF-8 needs at most 4 bytes each.
        data = b"" if is_dir or size > 4 * MAX_CATALOG_CHARS else catalog_path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        raise CatalogError([f"cannot read catalog {catalog_path}: {reason}"]) from None
    if is_dir:
        raise CatalogError([f"cannot read catalog {catalog_path}: it is a directory"])
    if size > 4 * MAX_CATALOG_CHARS:
        raise CatalogError([f"cannot read catalog {catalog_path}: {size:,} bytes, too big to be a catalog"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError([f"cannot read catalog {catalog_path}: not UTF-8 text (byte {exc.start}: "
                            f"{data[exc.start:exc.start + 1]!r})"]) from None


def catalog_dashboard_problem(catalog_dir: str | os.PathLike[str]) -> Callable[[str], str | None]:
    """A check that a golden dashboard path resolves (symlinks included) inside ``catalog_dir``."""
    base = Path(catalog_dir)
    root = base.resolve()

    def problem(relative: str) -> str | None:
        try:
            resolved = (base / relative).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            return f"cannot resolve {relative!r}: {exc}"
        if not resolved.is_relative_to(root):
            return f"{relative!r} resolves to {resolved}, outside the catalog's folder {root} (a symlink?)"
        return None

    return problem


def check_catalog_file(path: str | os.PathLike[str] | None = None, *, profile: str | None = None) -> CatalogCheck:
    """Read and check the catalog file without raising for bad input: the good groups and every problem.

    Metric overlap is checked against DCGM's counter names; golden dashboards must resolve inside
    the catalog's folder.
    """
    catalog_path = Path(path) if path else default_catalog_path()
    try:
        text = read_catalog_text(catalog_path)
    except CatalogError as exc:
        return unreadable_catalog(exc.problems[0], profile)
    return check_catalog(text, profile=profile, known_metrics=[c.name for c in metrics(dcgm_counters())],
                         dashboard_problem=catalog_dashboard_problem(catalog_path.parent))


def load_catalog(path: str | os.PathLike[str] | None = None, *, profile: str | None = None) -> Catalog:
    """Read and validate the catalog file; any problem, an unreadable file included, raises CatalogError."""
    result = check_catalog_file(path, profile=profile)
    if result.problems:
        raise CatalogError(result.problems)
    return result.catalog


def amp_prices_path() -> Path:
    """``PROMSHIFT_AMP_PRICES``, else ``amp_prices.yaml`` next to the catalog."""
    env = os.environ.get("PROMSHIFT_AMP_PRICES")
    return Path(env) if env else default_catalog_path().parent / "amp_prices.yaml"


def amp_prices() -> AmpPrices:
    """AMP prices for cost projections: configuration, never constants in code."""
    import yaml

    return AmpPrices.from_mapping(yaml.safe_load(amp_prices_path().read_text()) or {})
