"""Read-only dry runs an SRE can point at their own servers before promshift deploys anything.

``promshift check parity|latency`` runs the gate's parity or latency check on any two
Prometheus-compatible URLs; ``promshift catalog check`` lists every problem of a catalog;
``promshift render`` prints the diff a deploy would make to a source config. None of them
writes a file, an audit event or a config.

Exit codes: 0 SUCCESSFUL, 1 FAILED, 2 INCONCLUSIVE, 3 ERROR (for ``check``); 0/1 for
``catalog check`` and ``render`` (1: problems found, or the deploy would refuse the config);
64 bad input (unknown group, bad ``--since``, unreadable or invalid catalog, bad arguments);
69 a backend is unreachable or refuses the first query.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from promshift.core.durations import format_duration, parse_duration
from promshift.core.redact import redact_text
from promshift.core.verdicts import Verdict

log = logging.getLogger(__name__)

EXIT_BY_VERDICT = {Verdict.SUCCESSFUL: 0, Verdict.FAILED: 1, Verdict.INCONCLUSIVE: 2, Verdict.ERROR: 3}
EX_USAGE = 64  # sysexits.h: bad input
EX_UNAVAILABLE = 69  # sysexits.h: a backend is unreachable

# What `render` writes as the target when no --target-url is given: plainly a placeholder.
PLACEHOLDER_REMOTE_WRITE_URL = "https://aps-workspaces.REGION.amazonaws.com/workspaces/WORKSPACE_ID/api/v1/remote_write"

_UNIX_TIME = re.compile(r"[0-9]+(\.[0-9]+)?")


class InputError(ValueError):
    """Bad input to a command; its message is the one line the user sees (exit 64)."""


def parse_since(text: str, *, now: float) -> float:
    """The dual-write start as unix seconds: an RFC 3339 time, a unix timestamp, or a duration ago.

    ``2026-12-03T06:00:00Z`` and ``2026-12-03T07:00:00+01:00`` (a time zone is required),
    ``1796281200`` (seconds), ``30m`` or ``1h30m`` (that long before ``now``).
    """
    text = text.strip()
    if _UNIX_TIME.fullmatch(text):
        value = float(text)
    else:
        try:
            value = now - parse_duration(text)
        except ValueError:
            value = _rfc3339(text)
    if not math.isfinite(value) or value >= now:
        raise InputError(f"--since {text!r} is not in the past")
    if value < 0:
        raise InputError(f"--since {text[:40]!r} is before 1970: no dual-write started then (give a time, a unix "
                         "timestamp or a duration such as 30m)")
    return value


_SIGV4_SERVICE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _sigv4_service(text: str) -> str:
    """``--target-service``: an AWS signing name (``aps``); an empty one would sign for service ""."""
    if not _SIGV4_SERVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an AWS service signing name (like aps)")
    return text


def _region(text: str) -> str:
    """``--target-region``: an AWS region name; an empty one would silently skip signing."""
    from promshift.adapters.amp import AWS_REGION_RE

    if not AWS_REGION_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an AWS region (like us-east-1)")
    return text


def _rfc3339(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InputError(f"--since {text!r}: not an RFC 3339 time, a unix timestamp or a duration "
                         "such as 30m") from None
    if parsed.tzinfo is None:
        raise InputError(f"--since {text!r}: give a time zone (Z or +01:00); RFC 3339 requires one")
    return parsed.timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def catalog_path_of(given: str | None) -> Path:
    """The catalog file: ``given``, else ``PROMSHIFT_CATALOG``, else the lab's default in the lab only; under
    ``PROMSHIFT_ENV=production`` an unnamed catalog is a one-line InputError."""
    from promshift.adapters.settings import ProductionSettingsMissing, default_catalog_path

    if given:
        return Path(given)
    try:
        return default_catalog_path()
    except ProductionSettingsMissing as exc:
        raise InputError(f"{exc}; pass the catalog file or set PROMSHIFT_CATALOG") from None


def _load_catalog(path: str | None, profile: str | None) -> tuple[Any, Path]:
    """The catalog and its path; an unreadable or invalid one is an InputError."""
    from promshift.adapters.settings import check_catalog_file, default_profile

    catalog_path = catalog_path_of(path)
    result = check_catalog_file(catalog_path, profile=profile or default_profile())
    if not result.readable and result.problems[0].startswith("cannot read catalog"):
        raise InputError(result.problems[0])
    if result.problems:
        count = len(result.problems)
        first = " ".join(result.problems[0].split())
        raise InputError(f"catalog {catalog_path} is invalid ({count} problem{'s' if count != 1 else ''}; "
                         f"first: {first}); see promshift catalog check")
    return result.catalog, catalog_path


def _unreadable_message(path: Path, problem: str) -> str:
    """One line for a catalog that could not be read at all (file, encoding or YAML)."""
    if problem.startswith("cannot read catalog"):
        return problem
    return f"cannot read catalog {path}: {problem.removeprefix('catalog: ')}"


def _group(catalog: Any, name: str) -> Any:
    try:
        return catalog.get(name)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None


class BackendUnavailable(RuntimeError):
    """A backend did not answer the first query (exit 69)."""


def sigv4_auth(region: str, service: str = "aps") -> Any:
    """SigV4 signing for an AMP target with credentials from botocore's default chain (environment
    variables, ``AWS_PROFILE`` / the shared config and credentials files, container or instance roles).

    The credentials are read per request (refreshable ones renew) and never printed.
    """
    import botocore.session

    from promshift.adapters.sigv4 import AwsSigV4Auth

    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]+", region):
        raise InputError(f"--target-region {region!r}: expected an AWS region such as us-east-1")
    credentials = botocore.session.Session().get_credentials()
    if credentials is None:
        raise InputError("--target-region: no AWS credentials found (set AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
    return AwsSigV4Auth(credentials, region, service)


def _client(role: str, url: str, auth: Any = None) -> Any:
    """A client for ``url``, checked with one cheap query: unreachable is exit 69, not a verdict."""
    from promshift.adapters.prometheus import PrometheusClient, PrometheusError

    if not re.match(r"https?://", url):
        raise InputError(f"--{role} {url!r}: expected an http:// or https:// URL")
    client = PrometheusClient(url, auth=auth)
    try:
        client.query("1", timeout_s=15)
    except PrometheusError as exc:
        raise BackendUnavailable(f"{role} {exc}") from None
    return client


def run_check(args: argparse.Namespace, *, now: float | None = None) -> tuple[int, dict[str, Any], str]:
    """Run ``check parity|latency``: (exit code, JSON result, the human-readable report)."""
    from promshift.adapters.prometheus import PrometheusError
    from promshift.core.report import latency_noise_lines, latency_table, parity_log_table

    now = time.time() if now is None else now
    catalog, catalog_path = _load_catalog(args.catalog, args.profile)
    group = _group(catalog, args.group)
    if args.since:
        since, since_how = parse_since(args.since, now=now), f"--since {args.since}"
    else:
        since = now - group.warmup.duration_s
        since_how = f"assumed: warmup.duration ({format_duration(group.warmup.duration_s)}) ago; pass --since"
    auth = sigv4_auth(args.target_region, args.target_service) if args.target_region else None
    source, target = _client("source", args.source), _client("target", args.target, auth)
    head = [f"{args.kind} check of group {group.name} (catalog {catalog_path}"
            + (f", profile {catalog.profile}" if catalog.profile else "") + ")",
            f"source {redact_text(source.base_url)}", f"target {redact_text(target.base_url)}"
            + (f" (SigV4 signed: {args.target_service} in {args.target_region})" if auth else ""),
            f"dual-write since {_iso(since)} ({since_how}); now {_iso(now)}"]
    result: dict[str, Any]
    try:
        if args.kind == "parity":
            from promshift.adapters.parity_check import ParityCheck

            parity = ParityCheck(group, source, target, catalog_dir=catalog_path.parent).run(
                dual_write_since=since, now=now)
            if parity.window:
                head.append(f"compared window {_iso(parity.window.start)} .. {_iso(parity.window.end)}, "
                            f"step {parity.window.step:g}s")
            body = parity_log_table(parity) + _parity_evidence(parity, group)
            # The table gives each reason; the verdict line names the layers behind it.
            reason = ", ".join(f"{m.name} {m.verdict.value}" for m in parity.not_passed())
            verdict, result = parity.verdict, parity.to_dict()
        else:
            from promshift.adapters.latency_probe import LatencyProbe

            probe = LatencyProbe(source, target, group.latency, min_step_s=group.parity.step_s)
            queries = list(group.latency.queries) or [f"count({group.selector()})"]
            latency = probe.run(now=now, queries=queries, dual_write_since=since, history_selector=group.selector(),
                                group=group)
            noise = latency_noise_lines(latency.windows)
            body = latency_table(latency.windows) + (f"\n\nnoise (paired runs):\n{noise}" if noise else "")
            reason = latency.measurement.reason
            verdict, result = latency.verdict, latency.to_dict()
    except PrometheusError as exc:
        verdict, result = Verdict.ERROR, {"verdict": Verdict.ERROR.value, "error": str(exc)}
        body, reason = f"the check stopped: {exc}", str(exc)
    result = {"check": args.kind, "group": group.name, "source": redact_text(source.base_url),
              "target": redact_text(target.base_url), "dual_write_since": since, "now": now, **result}
    text = "\n".join([*head, "", body, "", f"verdict: {verdict.value}" + (f" ({reason})" if reason else "")])
    return EXIT_BY_VERDICT[verdict], result, text


def _parity_evidence(parity: Any, group: Any) -> str:
    """Lines after the parity table: hosts per name of the host label, and the independent-scraper noise model."""
    from promshift.core.parity import HostLabels, hosts_per_label
    from promshift.core.verdicts import Layer

    lines = []
    host = parity.measurement(Layer.HOST_COVERAGE)
    per_name = host.numbers.get("hosts_per_label") if host else None
    if per_name:
        declared = HostLabels.for_group(group.host_label, dict(group.parity.rename_labels)).declared
        lines.append(hosts_per_label(per_name, declared))
    samples = parity.measurement(Layer.SAMPLES)
    model = samples.numbers.get("noise_model") if samples else None
    if model:
        shown = [f"{metric} {row['bias']:+.3g} (allowed {row['allowed']:.3g})"
                 for metric, row in list(model["per_metric"].items())[:6]]
        lines.append("independent scrapers, mean target-source difference per metric: " + "; ".join(shown))
    return "".join(f"\n{line}" for line in lines)


def _check(args: argparse.Namespace) -> int:
    code, result, text = run_check(args)
    if args.json:
        print(json.dumps(result, indent=2, default=str, allow_nan=False))
    else:
        print(text)
    return code


def _bake_window_problems(catalog: Any, catalog_dir: Path) -> list[str]:
    """Groups whose golden queries look back further than their bake window: they could never bake."""
    from promshift.adapters.parity_check import golden_lookbacks
    from promshift.core.bake import bake_window_problem
    from promshift.core.golden import MIN_POINTS

    found: list[str] = []
    for group in catalog.groups:
        problem = bake_window_problem(group.bake, step_s=group.parity.step_s,
                                      lookbacks=golden_lookbacks(group, catalog_dir, found), min_points=MIN_POINTS)
        if problem:
            found.append(f"group {group.name!r}: {problem}")
    return found


def catalog_check_json(path: Path, profile: str | None, problems: list[str], catalog: Any,
                       known: list[str] | None) -> dict[str, Any]:
    """``catalog check --json``: the verdict, every problem (one line each), and the good groups' placement."""
    return {"catalog": str(path), "ok": not problems, "profile": profile,
            "problems": [" ".join(p.split()) for p in problems],
            "connections_checked": known is not None,
            "groups": [{"name": g.name, "wave": g.wave, "source": g.source, "target": g.target, "dag_id": g.dag_id}
                       for g in catalog.groups]}


def _catalog_check(args: argparse.Namespace) -> int:
    from promshift.adapters.settings import check_catalog_file, default_profile

    path = catalog_path_of(args.file)
    profile = args.profile or default_profile()
    known = None
    if args.connections is not None:
        known = [conn_id.strip() for listed in args.connections for conn_id in listed.split(",") if conn_id.strip()]
    result = check_catalog_file(path, profile=profile, known_connections=known)
    if not result.readable:
        raise InputError(_unreadable_message(path, result.problems[0]))
    problems = [*result.problems, *_bake_window_problems(result.catalog, path.parent)]
    if args.json:
        print(json.dumps(catalog_check_json(path, profile, problems, result.catalog, known), indent=2))
        return 1 if problems else 0
    if problems:
        count = len(problems)
        print(f"{path}: {count} problem{'s' if count != 1 else ''}")
        for problem in problems:
            print("  - " + " ".join(problem.split()))
        return 1
    catalog = result.catalog
    applied = "every profile validated" + (f"; profile {profile} applied" if profile else "")
    many = len(catalog.groups) > LISTED_GROUPS
    if not many:
        print(f"{path}: OK ({len(catalog.groups)} groups: {', '.join(catalog.names())}; {applied})")
    else:
        waves = len({g.wave for g in catalog.groups})
        print(f"{path}: OK ({len(catalog.groups):,} groups in {waves:,} wave{'s' if waves != 1 else ''}; {applied})")
        for line in wave_summary(catalog.groups):
            print("  " + line)
    pairs: dict[tuple[str, str], list[str]] = {}
    for group in catalog.groups:
        pairs.setdefault(group.pair, []).append(group.name)
    for (source, target), groups in pairs.items():
        shown = ", ".join(groups[:NAMES_PER_WAVE]) + (f", ... ({len(groups):,} in all)"
                                                      if len(groups) > NAMES_PER_WAVE else "")
        print(f"  {source} -> {target}: {shown if many else ', '.join(groups)}")
    dags: dict[str, int] = {}
    for group in catalog.groups:
        dags[group.dag_id] = dags.get(group.dag_id, 0) + 1
    print("  migration DAGs: " + ", ".join(f"{dag_id} ({count:,} group{'s' if count != 1 else ''})"
                                         for dag_id, count in dags.items()))
    if known is None:
        print("  (connections not checked: pass --connections to check that each exists)")
    return 0


# A catalog of up to this many groups is listed on one line; a larger one is summarised per wave.
LISTED_GROUPS = 20
# Per wave, the first names shown; and the waves shown (the rest counted).
NAMES_PER_WAVE = 5
WAVES_SHOWN = 20


def wave_summary(groups: Any) -> list[str]:
    """One line per wave (lowest first): how many groups, the first few names. Problems are never summarised."""
    waves: dict[int, list[str]] = {}
    for group in groups:
        waves.setdefault(group.wave, []).append(group.name)
    lines = []
    for wave in sorted(waves)[:WAVES_SHOWN]:
        names = waves[wave]
        more = f", ... (+{len(names) - NAMES_PER_WAVE:,} more)" if len(names) > NAMES_PER_WAVE else ""
        lines.append(f"wave {wave}: {len(names):,} group{'s' if len(names) != 1 else ''}: "
                     f"{', '.join(names[:NAMES_PER_WAVE])}{more}")
    if len(waves) > WAVES_SHOWN:
        rest = sorted(waves)[WAVES_SHOWN:]
        lines.append(f"... and {len(rest):,} more waves ({sum(len(waves[w]) for w in rest):,} groups)")
    return lines


# An AMP workspace's remote-write URL: its region signs the writes (the deploy's sigv4 block).
_AMP_HOST = re.compile(r"^https://aps-workspaces\.([a-z0-9-]+|REGION)\.amazonaws\.com/")


def rendered_config(config_text: str, *, group: Any, target_url: str, sigv4: dict[str, str] | None) -> str:
    """The config a dual-write deploy of ``group`` writes: the same two calls as the deploy (``remote_write_entry``
    with the AMP target's ``sigv4`` block and queue settings, then ``add_remote_write``)."""
    from promshift.core.render import add_remote_write, remote_write_entry

    entry = remote_write_entry(group_name=group.name, name_regex=group.name_regex(), url=target_url,
                               drop_labels=group.drop_labels, replicas=group.replicas, sigv4=sigv4)
    return add_remote_write(config_text, entry)


def render_diff(config_text: str, *, group: Any, target_url: str, config_name: str,
                sigv4: dict[str, str] | None = None, edited: list[str] | None = None) -> str:
    """The unified diff a dual-write deploy of ``group`` makes to ``config_text`` ('' when none); ``edited``, when
    given, gets the edited text."""
    new_text = rendered_config(config_text, group=group, target_url=target_url, sigv4=sigv4)
    if edited is not None:
        edited.append(new_text)
    return "".join(difflib.unified_diff(config_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        fromfile=f"{config_name} (now)",
                                        tofile=f"{config_name} (after dual-writing {group.name})"))


def render_sigv4(target_url: str, region: str | None, writer_role_arn: str | None) -> dict[str, str] | None:
    """The ``sigv4`` block the deploy writes for this target: an AMP URL (or ``--target-region``) signs with its
    region, and ``--writer-role-arn`` (the amp connection's ``writer_role_arn``) adds the role; else none."""
    found = _AMP_HOST.match(target_url)
    region = region or (found.group(1) if found else None)
    if region is None:
        if writer_role_arn:
            raise InputError("--writer-role-arn needs an AMP target: --target-region, or an AMP --target-url")
        return None
    return {"region": region, **({"role_arn": writer_role_arn} if writer_role_arn else {})}


def _render(args: argparse.Namespace) -> int:
    from promshift.adapters.files import read_user_text
    from promshift.core.inputs import CONFIG, InputRefused
    from promshift.core.render import RenderError

    catalog, _ = _load_catalog(args.catalog, args.profile)
    group = _group(catalog, args.group)
    path = Path(args.config)
    try:
        # A regular file within the config budget, read as bytes: no FIFO hang, no /dev/zero, CRLF kept.
        text = read_user_text(path, CONFIG)
    except InputRefused as exc:
        raise InputError(str(exc)) from None
    target_url = args.target_url or PLACEHOLDER_REMOTE_WRITE_URL
    sigv4 = render_sigv4(target_url, args.target_region, args.writer_role_arn)
    edited: list[str] = []
    try:
        diff = render_diff(text, group=group, target_url=target_url, config_name=str(path), sigv4=sigv4,
                           edited=edited)
    except RenderError as exc:  # one line: the placeholder notice would only hide it
        print(f"promshift render: the deploy would refuse {path}: {exc}", file=sys.stderr)
        return 1
    refused = _promtool_refusal(edited[0], path, args.promtool)
    if refused:
        print(f"promshift render: the deploy would refuse {path}: {refused}", file=sys.stderr)
        return 1
    if not args.target_url:
        print(f"promshift render: no --target-url; the output shows the placeholder {target_url}", file=sys.stderr)
    if args.output == "config":  # exactly the bytes the deploy writes
        sys.stdout.flush()
        sys.stdout.buffer.write(edited[0].encode("utf-8"))
        sys.stdout.buffer.flush()
        return 0
    print(diff.rstrip("\n") if diff else f"no change: {path} already dual-writes {group.name} this way")
    return 0


def _promtool_refusal(config_text: str, path: Path, promtool: str) -> str | None:
    """What ``promtool check config`` says against the edited config, as the file deploy checks it first (one
    line), or None when it passes. Run beside the file (relative rule files resolve), the copy removed after."""
    import shutil

    from promshift.adapters.deploy import promtool_on

    if shutil.which(promtool) is None:
        print(f"promshift render: {promtool!r} not found: the edited config was not checked by promtool",
              file=sys.stderr)
        return None
    try:
        proc, tmp = promtool_on(config_text.encode("utf-8"), "config", promtool=promtool, prefix=".promshift-render-",
                                folder=path.resolve().parent)
    except OSError as exc:  # a folder we may not write in: check in the system's temporary folder
        try:
            proc, tmp = promtool_on(config_text.encode("utf-8"), "config", promtool=promtool, prefix="promshift-")
        except OSError:
            print(f"promshift render: promtool could not run: {exc.strerror or exc}", file=sys.stderr)
            return None
    if proc.returncode == 0:
        return None
    said = [line.strip() for line in (proc.stdout + proc.stderr).replace(tmp, str(path)).splitlines()
            if line.strip() and not line.startswith("Checking ")]
    return "promtool check config: " + " ".join(said)[:300]


def _guarded(handler: Any) -> Any:
    """Turn InputError / BackendUnavailable into one line on stderr and exit 64 / 69."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except InputError as exc:  # redacted: a bad URL given on the command line may carry a password
            print(f"promshift: {redact_text(str(exc))}", file=sys.stderr)
            return EX_USAGE
        except BackendUnavailable as exc:
            print(f"promshift: {redact_text(str(exc))}", file=sys.stderr)
            return EX_UNAVAILABLE

    return run


def add_check_commands(subparsers: Any) -> None:
    """Add ``check parity|latency``, ``catalog check`` and ``render`` to the top-level subparsers."""
    check = subparsers.add_parser(
        "check", help="read-only parity or latency check of one group on any two Prometheus URLs",
        description="Runs the gate's check against SOURCE and TARGET and changes nothing. Exit codes: "
                    "0 SUCCESSFUL, 1 FAILED, 2 INCONCLUSIVE, 3 ERROR, 64 bad input, 69 a backend is unreachable.")
    check.add_argument("kind", choices=("parity", "latency"))
    check.add_argument("--group", required=True, help="metric group name in the catalog")
    check.add_argument("--source", required=True, help="self-hosted Prometheus base URL")
    check.add_argument("--target", required=True, help="target base URL (AMP workspace or Prometheus)")
    check.add_argument("--target-region", metavar="REGION", type=_region,
                       help="sign target requests with SigV4 for this AWS region (an AMP workspace); credentials "
                            "come from botocore's default chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                            "AWS_PROFILE, or an instance/container role")
    check.add_argument("--target-service", default="aps", metavar="SERVICE", type=_sigv4_service,
                       help="SigV4 service name for the target (default: aps)")
    check.add_argument("--since", help="dual-write start: RFC 3339 time, unix timestamp, or duration ago (30m); "
                                       "default: the group's warmup.duration ago")
    check.add_argument("--catalog", help="catalog file (default: $PROMSHIFT_CATALOG or catalog/metric_groups.yaml)")
    check.add_argument("--profile", default=None, help="catalog profile to apply (default: $PROMSHIFT_PROFILE)")
    check.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    check.set_defaults(handler=_guarded(_check))

    catalog = subparsers.add_parser("catalog", help="validate the metric-group catalog")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", required=True)
    cat_check = catalog_commands.add_parser("check", help="print every problem of a catalog; exit 1 if any")
    cat_check.add_argument("file", nargs="?", help="catalog file (default: $PROMSHIFT_CATALOG or the repo's)")
    cat_check.add_argument("--profile", default=None, help="also apply this profile (all are validated anyway)")
    cat_check.add_argument("--connections", action="append", metavar="ID[,ID...]",
                           help="the Airflow connection ids that exist; a group's source/target naming another "
                                "is a problem (repeatable)")
    cat_check.add_argument("--json", action="store_true",
                           help="print the result as JSON on stdout (ok, problems, groups); exit codes unchanged, "
                                "an unreadable catalog stays one line on stderr")
    cat_check.set_defaults(handler=_guarded(_catalog_check))

    render = subparsers.add_parser("render", help="print the diff a dual-write deploy would make to a source config")
    render.add_argument("group")
    render.add_argument("--config", required=True, help="the source Prometheus config file (left unchanged)")
    render.add_argument("--catalog", help="catalog file (default: $PROMSHIFT_CATALOG or catalog/metric_groups.yaml)")
    render.add_argument("--profile", default=None)
    render.add_argument("--target-url", help="the target's remote-write URL (default: a visible placeholder)")
    render.add_argument("--target-region", metavar="REGION", type=_region,
                        help="an AMP target's region: the entry's sigv4 block and AMP's queue settings (default: the "
                             "region of an AMP --target-url)")
    render.add_argument("--writer-role-arn", metavar="ARN",
                        help="the amp connection's writer_role_arn: the role the source assumes to write")
    render.add_argument("--output", choices=("diff", "config"), default="diff",
                        help="diff (default), or config: the whole file exactly as the deploy writes it")
    render.add_argument("--promtool", default="promtool",
                        help="promtool that checks the edited config, as the deploy does (default: promtool on PATH)")
    render.set_defaults(handler=_guarded(_render))
