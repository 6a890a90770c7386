"""Where things live at run time: catalog, state directory, DCGM counter list (env-driven)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from promshift.core.catalog import Catalog, parse_catalog
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


def load_catalog(path: str | os.PathLike[str] | None = None, *, profile: str | None = None) -> Catalog:
    """Read and validate the catalog file; metric overlap is checked against DCGM's counter names."""
    catalog_path = Path(path) if path else default_catalog_path()
    return parse_catalog(catalog_path.read_text(), profile=profile,
                         known_metrics=[c.name for c in metrics(dcgm_counters())])


def amp_prices_path() -> Path:
    """``PROMSHIFT_AMP_PRICES``, else ``amp_prices.yaml`` next to the catalog."""
    env = os.environ.get("PROMSHIFT_AMP_PRICES")
    return Path(env) if env else default_catalog_path().parent / "amp_prices.yaml"


def amp_prices() -> AmpPrices:
    """AMP prices for cost projections: configuration, never constants in code."""
    import yaml

    return AmpPrices.from_mapping(yaml.safe_load(amp_prices_path().read_text()) or {})
