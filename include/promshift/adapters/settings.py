"""Where things live at run time: catalog, state directory, DCGM counter list (env-driven)."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from promshift.adapters.files import read_user_file
from promshift.core.audit import AuditKeyError, check_key
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
from promshift.core.inputs import CATALOG, SETTINGS, InputRefused, parse_yaml_bounded
from promshift.data import load_dcgm_counters

CATALOG_FILE = dataclasses.replace(CATALOG, max_bytes=4 * MAX_CATALOG_CHARS)
REPO_ROOT = Path(__file__).resolve().parents[3]
AUDIT_KEY_FILE_NAME = "audit.key"

log = logging.getLogger(__name__)


ENV_VAR = "PROMSHIFT_ENV"
LAB, PRODUCTION = "lab", "production"


class ProductionSettingsMissing(ValueError):
    """Production (``PROMSHIFT_ENV=production``) without a store it must name: one line naming every one missing."""


def environment(environ: Mapping[str, str] | None = None) -> str:
    """``PROMSHIFT_ENV``: ``lab`` (the default: lab defaults under ``PROMSHIFT_HOME``) or ``production``.

    The one rule (docs/deployment.md#production-fails-closed): under ``production`` (the image's Dockerfile sets it)
    every store is named, never defaulted: the audit database (not SQLite), its key, its anchor, snapshots and
    reports (not ``file://``). Any other value is refused, so a typo never means "lab".
    """
    env = os.environ if environ is None else environ
    value = (env.get(ENV_VAR) or LAB).strip()
    if value not in (LAB, PRODUCTION):
        raise ProductionSettingsMissing(f"{ENV_VAR}={value[:40]!r} is neither {LAB!r} nor {PRODUCTION!r}")
    return value


def is_production(environ: Mapping[str, str] | None = None) -> bool:
    return environment(environ) == PRODUCTION


def production_problems(environ: Mapping[str, str] | None = None, *, audit_url: str | None = None,
                        audit_key_given: bool = False) -> list[str]:
    """What production lacks: each missing or one-disk store, one short phrase each (empty: all named); and any
    lab-only setting left set (``LAB_CLOCK_AHEAD_VAR``).

    ``audit_url``/``audit_key_given``: what the caller found besides the environment (the Airflow shell reads the
    ``promshift_audit`` connection's ``extra.url`` and password)."""
    env = os.environ if environ is None else environ
    problems = []
    url = audit_url or env.get("PROMSHIFT_AUDIT_URL")
    if not url:
        problems.append("no audit database (PROMSHIFT_AUDIT_URL or connection promshift_audit's extra.url)")
    elif url.split(":", 1)[0].split("+", 1)[0].strip().lower() == "sqlite":
        problems.append("the audit database is SQLite, one worker's disk (name PostgreSQL)")
    if not (audit_key_given or env.get("PROMSHIFT_AUDIT_KEY") or env.get("PROMSHIFT_AUDIT_KEY_FILE")):
        problems.append("no audit key (PROMSHIFT_AUDIT_KEY, PROMSHIFT_AUDIT_KEY_FILE or promshift_audit's password)")
    if not env.get("PROMSHIFT_AUDIT_ANCHOR_URL"):
        problems.append("no audit anchor (PROMSHIFT_AUDIT_ANCHOR_URL)")
    if not env.get(CATALOG_VAR):
        problems.append(f"no catalog ({CATALOG_VAR})")
    if (env.get(LAB_CLOCK_AHEAD_VAR) or "").strip():
        problems.append(f"{LAB_CLOCK_AHEAD_VAR} is set: it is lab-only (unset it)")
    for var, what in (("PROMSHIFT_SNAPSHOTS_URL", "snapshot"), ("PROMSHIFT_REPORTS_URL", "report")):
        value = env.get(var)
        if not value:
            problems.append(f"no {what} store ({var})")
        elif value.lower().startswith("file:") or "://" not in value:
            problems.append(f"the {what} store {var} is a local path, one worker's disk (name s3://)")
    return problems


def require_production_settings(where: str, environ: Mapping[str, str] | None = None, *,
                                 audit_url: str | None = None, audit_key_given: bool = False) -> None:
    """Under ``PROMSHIFT_ENV=production``, refuse in one line if any store is missing; in the lab, nothing."""
    if not is_production(environ):
        return
    problems = production_problems(environ, audit_url=audit_url, audit_key_given=audit_key_given)
    if problems:
        raise ProductionSettingsMissing(f"{where}: {ENV_VAR}={PRODUCTION} refuses to start: {'; '.join(problems)}")


def _named_in_production(var: str, what: str) -> str:
    value = os.environ.get(var)
    if value:
        return value
    if is_production():
        raise ProductionSettingsMissing(f"{ENV_VAR}={PRODUCTION}: no {what} ({var}); no lab default")
    return ""


def state_home() -> Path:
    """``PROMSHIFT_HOME`` (default ``./.state``): stack, default audit DB (with the routing table), snapshots."""
    return Path(os.environ.get("PROMSHIFT_HOME", ".state")).resolve()


def audit_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The audit HMAC key for the CLI and the local stack (the Airflow shell reads a connection first).

    ``PROMSHIFT_AUDIT_KEY`` (the key's text) or ``PROMSHIFT_AUDIT_KEY_FILE`` (a file holding it),
    else ``audit.key`` under ``PROMSHIFT_HOME`` if the local stack made one; None if there is none.
    """
    env = os.environ if environ is None else {**os.environ, **environ}
    text, path = env.get("PROMSHIFT_AUDIT_KEY"), env.get("PROMSHIFT_AUDIT_KEY_FILE")
    if text and path:
        raise AuditKeyError("set PROMSHIFT_AUDIT_KEY or PROMSHIFT_AUDIT_KEY_FILE, not both")
    if text:
        return check_key(text.strip().encode())
    if path:
        return read_audit_key_file(Path(path))
    if is_production(env):
        return None  # never the lab's key file under PROMSHIFT_HOME
    local = Path(env.get("PROMSHIFT_HOME", ".state")).resolve() / AUDIT_KEY_FILE_NAME
    return read_audit_key_file(local) if local.is_file() else None


def read_audit_key_file(path: Path) -> bytes:
    """The key in ``path`` (surrounding whitespace ignored); warns if others may read it."""
    try:
        data = path.read_bytes()
        mode = path.stat().st_mode
    except OSError as exc:
        raise AuditKeyError(f"cannot read the audit key file {path}: {exc.strerror}") from None
    if mode & 0o077:
        log.warning("audit key file %s is readable by group or others (mode %o); chmod 600 it", path, mode & 0o777)
    return check_key(data.strip())


def local_audit_key_env(home: Path) -> dict[str, str]:
    """For the local stack: ``{PROMSHIFT_AUDIT_KEY_FILE: ...}``, creating a random 0600 key file under ``home``.

    Nothing if a key is already given by the environment. The key itself is never printed or logged.
    """
    if os.environ.get("PROMSHIFT_AUDIT_KEY") or os.environ.get("PROMSHIFT_AUDIT_KEY_FILE"):
        return {}
    path = home / AUDIT_KEY_FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return {"PROMSHIFT_AUDIT_KEY_FILE": str(path)}
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    log.info("created an audit key file %s (mode 600)", path)
    return {"PROMSHIFT_AUDIT_KEY_FILE": str(path)}


def metrics_token(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The static token a scraper reads ``/promshift/scrape/metrics`` with: ``PROMSHIFT_METRICS_TOKEN`` (from a
    Secret) or ``PROMSHIFT_METRICS_TOKEN_FILE``; None when neither is set (the route then answers 404). At least 32
    characters: a shorter one is refused in one line rather than guessed."""
    env = os.environ if environ is None else environ
    text, path = env.get("PROMSHIFT_METRICS_TOKEN"), env.get("PROMSHIFT_METRICS_TOKEN_FILE")
    if text and path:
        raise ValueError("set PROMSHIFT_METRICS_TOKEN or PROMSHIFT_METRICS_TOKEN_FILE, not both")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read PROMSHIFT_METRICS_TOKEN_FILE {path}: {exc.strerror}") from None
    if not text:
        return None
    token = text.strip().encode("utf-8")
    if len(token) < 32:
        raise ValueError(f"the metrics token is {len(token)} characters; it needs at least 32 (openssl rand -hex 32)")
    return token


def audit_anchor_url() -> str | None:
    """``PROMSHIFT_AUDIT_ANCHOR_URL``: where chain heads are anchored (SQLAlchemy URL or ``s3://bucket/prefix``)."""
    return os.environ.get("PROMSHIFT_AUDIT_ANCHOR_URL") or None


def audit_anchor_retention_days() -> int:
    """``PROMSHIFT_AUDIT_ANCHOR_RETENTION_DAYS`` (default 365): Object Lock retention of S3 anchors."""
    text = os.environ.get("PROMSHIFT_AUDIT_ANCHOR_RETENTION_DAYS", "365")
    try:
        days = int(text)
    except ValueError:
        days = 0
    if days < 1:
        raise ValueError(f"PROMSHIFT_AUDIT_ANCHOR_RETENTION_DAYS must be a whole number of days >= 1, got {text!r}")
    return days


def snapshots_dir() -> Path:
    return state_home() / "snapshots"


def snapshots_url() -> str:
    """Where snapshots go, for ``ObjectStoragePath``: ``PROMSHIFT_SNAPSHOTS_URL`` (``s3://bucket/prefix`` in
    production, so the worker that rolls back reads what another worker snapshotted), else ``snapshots_dir()``."""
    return _named_in_production("PROMSHIFT_SNAPSHOTS_URL", "snapshot store") or f"file://{snapshots_dir()}"


def reports_url() -> str:
    """Where runs publish their reports, for ``ObjectStoragePath``: ``PROMSHIFT_REPORTS_URL`` (``s3://bucket/prefix``
    in production, where every worker and the board's API server read the same objects), else a local directory."""
    return _named_in_production("PROMSHIFT_REPORTS_URL", "report store") or f"file://{state_home() / 'reports'}"


CATALOG_VAR = "PROMSHIFT_CATALOG"
LAB_CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"


def default_catalog_path(environ: Mapping[str, str] | None = None) -> Path:
    """``PROMSHIFT_CATALOG``; without it the repo's ``catalog/metric_groups.yaml`` in the lab only. Under
    ``PROMSHIFT_ENV=production`` an unset variable is a one-line ``ProductionSettingsMissing``: an installed package's
    "repo" is site-packages' parent, never the reviewed catalog."""
    env = os.environ if environ is None else environ
    given = env.get(CATALOG_VAR)
    if given:
        return Path(given)
    if is_production(env):
        raise ProductionSettingsMissing(f"{ENV_VAR}={PRODUCTION}: no catalog ({CATALOG_VAR} is not set; the lab's "
                                        "default beside the code is not used outside the lab)")
    return LAB_CATALOG


def default_profile() -> str | None:
    return os.environ.get("PROMSHIFT_PROFILE") or None


# LAB ONLY: how far ahead of the wall clock the bake watch counts a group's history on the target (the history
# horizon, ``core.horizon``), e.g. ``24h``. The lifecycle demo sets it so a panel opening on the last day, or a rule
# reading ``[2h]``, held back at the cut-over is switched by the bake watch minutes later. The cut-over itself always
# counts by the wall clock, so what waits there is what would wait anywhere. Never shortens a panel or a rule.
LAB_CLOCK_AHEAD_VAR = "PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD"
MAX_LAB_CLOCK_AHEAD_S = 366 * 86400.0


class LabOnlySetting(ValueError):
    """A lab-only setting under ``PROMSHIFT_ENV=production``, or a bad value of one (one line)."""


def lab_bake_watch_clock_ahead_s(environ: Mapping[str, str] | None = None) -> float:
    """``PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD`` in seconds (0 when unset); LabOnlySetting under production (fail
    closed: no production horizon may count history the target does not hold) or for a bad duration."""
    from promshift.core.durations import parse_duration

    env = os.environ if environ is None else environ
    text = (env.get(LAB_CLOCK_AHEAD_VAR) or "").strip()
    if not text:
        return 0.0
    if is_production(env):
        raise LabOnlySetting(f"{LAB_CLOCK_AHEAD_VAR} is lab-only (it counts history the target does not hold): "
                             f"{ENV_VAR}={PRODUCTION} refuses it; unset it")
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise LabOnlySetting(f"{LAB_CLOCK_AHEAD_VAR}: {exc}") from None
    if seconds > MAX_LAB_CLOCK_AHEAD_S:
        raise LabOnlySetting(f"{LAB_CLOCK_AHEAD_VAR}={text[:40]!r} is more than a year ahead")
    return seconds


@lru_cache(maxsize=1)
def dcgm_counters() -> tuple[DcgmCounter, ...]:
    """dcgm-exporter's default counters, shipped inside the package."""
    return load_dcgm_counters()


def read_catalog_text(path: str | os.PathLike[str]) -> str:
    """The catalog file's text; a missing, unreadable, oversized or non-UTF-8 file is a one-line CatalogError."""
    catalog_path = Path(path)
    try:
        # A regular file only (a FIFO or /dev/zero is one line, not a hang); refused before reading past the
        # limit: the text limit is in characters, UTF-8 needs at most 4 bytes each.
        data = read_user_file(catalog_path, CATALOG_FILE)
    except InputRefused as exc:
        raise CatalogError([str(exc)]) from None
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


def check_catalog_file(path: str | os.PathLike[str] | None = None, *, profile: str | None = None,
                       known_connections: Iterable[str] | None = None) -> CatalogCheck:
    """Read and check the catalog file without raising for bad input: the good groups and every problem.

    Metric overlap is checked against DCGM's counter names; golden dashboards must resolve inside
    the catalog's folder; with ``known_connections``, each group's source and target must be one of them.
    """
    catalog_path = Path(path) if path else default_catalog_path()
    try:
        text = read_catalog_text(catalog_path)
    except CatalogError as exc:
        return unreadable_catalog(exc.problems[0], profile)
    return check_catalog(text, profile=profile, known_metrics=[c.name for c in metrics(dcgm_counters())],
                         dashboard_problem=catalog_dashboard_problem(catalog_path.parent),
                         known_connections=known_connections)


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

    return AmpPrices.from_mapping(parse_yaml_bounded(read_user_file(amp_prices_path(), SETTINGS), SETTINGS) or {})
