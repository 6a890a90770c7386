"""Which deploy a run uses, chosen in one place from the connections' extras (pure).

The target connection's ``extra.deploy`` names the deploy: ``remote_write`` (the default: the
group's own ``remote_write`` entry in the source's config file) or ``scraper`` (AMP's managed
collector scrapes the group itself).

Where the source Prometheus runs on Kubernetes, the *source* connection's ``extra.deploy`` says how
its config is changed: ``file`` (the default, ``extra.config_path``), ``k8s-configmap`` (a ConfigMap
holding ``prometheus.yml``) or ``k8s-cr`` (prometheus-operator's ``Prometheus`` resource), with
``extra.kubernetes`` naming the object and how to reach the API (``kubernetes_source_of``). The
group's ``remote_write`` entry is the same; only the deployer differs (``adapters.k8s_deploy``).
The steps that drive any of them are in ``steps.deploy``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployKind
from promshift.core.scraper_config import ACTIVE

REMOTE_WRITE = "remote_write"
SCRAPER = "scraper"
DEPLOY_KINDS = (REMOTE_WRITE, SCRAPER)
# The source connection's extra.deploy: how the source's own config is changed.
FILE = DeployKind.FILE.value
K8S_CONFIGMAP = DeployKind.K8S_CONFIGMAP.value
K8S_CR = DeployKind.K8S_CR.value
GIT = DeployKind.GIT.value
SOURCE_DEPLOY_KINDS = (FILE, K8S_CONFIGMAP, K8S_CR, GIT)
K8S_KINDS = (K8S_CONFIGMAP, K8S_CR)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The scraper blob's interval; the managed collector's documented minimum (core.scraper_config).
SCRAPER_INTERVAL_S = 30.0




@dataclass(frozen=True)
class Deploy:
    """How a group's dual-write is deployed, as steps and operators see it: what it does, not which kind it is.

    Code asks these questions instead of comparing kinds; a new way to deploy adds one entry to ``DEPLOYS``.
    """

    kind: str  # names the deploy in records and messages only
    source_queue: bool  # the source's own remote-write queue carries the group: warm-up and bake watch its lag
    own_writer: bool  # the target has a writer of its own (a managed collector): parity compares two scrapers,
    #                   and the source may stop scraping the group (decommission)
    live_status: str  # the DeployResult status that means live
    waits_for_scraper: bool  # deploy and restore wait on the scraper's status (else on the loaded config)
    writer_interval_s: float | None  # the writer's own scrape interval (None: the source's)
    config_by_api: bool = False  # the source config changes through an API (Kubernetes, git): no file on the worker
    change_request: bool = False  # the change is a commit (and a change request) in the team's config repository,
    #                               live once their sync (Argo CD, Flux, helm) has reloaded the source


DEPLOYS: dict[str, Deploy] = {
    REMOTE_WRITE: Deploy(REMOTE_WRITE, source_queue=True, own_writer=False, live_status="LIVE",
                         waits_for_scraper=False, writer_interval_s=None),
    SCRAPER: Deploy(SCRAPER, source_queue=False, own_writer=True, live_status=ACTIVE,
                    waits_for_scraper=True, writer_interval_s=SCRAPER_INTERVAL_S),
    **{kind: Deploy(kind, source_queue=True, own_writer=False, live_status="LIVE",
                    waits_for_scraper=False, writer_interval_s=None, config_by_api=True) for kind in K8S_KINDS},
    GIT: Deploy(GIT, source_queue=True, own_writer=False, live_status="LIVE",
                waits_for_scraper=False, writer_interval_s=None, config_by_api=True, change_request=True),
}


def deploy_of(kind: str) -> Deploy:
    """The ``Deploy`` of a kind ``deploy_kind_of`` chose; ValueError (one line) for any other."""
    try:
        return DEPLOYS[kind]
    except KeyError:
        raise ValueError(f"unknown deploy {kind!r}; one of {', '.join(DEPLOYS)}") from None

def deploy_kind_of(extra: Mapping[str, Any], *, conn_id: str, is_amp: bool,
                   source_extra: Mapping[str, Any] | None = None, source_conn_id: str = "promshift_source") -> str:
    """The deploy a run uses; one-line errors.

    The target connection's ``extra.deploy`` (default ``remote_write``) first; with ``remote_write``,
    a source connection whose ``extra.deploy`` is ``k8s-configmap`` or ``k8s-cr`` makes it that
    (the same entry, written through the Kubernetes API), and ``git`` makes it ``git`` (the entry as a commit
    in the team's config repository, ``core.git_source``). A managed collector scrapes by itself, so
    ``scraper`` with a Kubernetes or git source deploy is refused rather than silently ignoring one of them.
    """
    kind = str(extra.get("deploy") or REMOTE_WRITE).strip().lower()
    if kind not in DEPLOY_KINDS:
        raise ValueError(f"connection {conn_id!r}: extra.deploy must be one of {', '.join(DEPLOY_KINDS)}, "
                         f"got {kind!r}")
    if kind == SCRAPER and not is_amp:
        raise ValueError(f"connection {conn_id!r}: extra.deploy 'scraper' needs an amp connection "
                         "(the managed collector writes to an AMP workspace)")
    if str((source_extra or {}).get("deploy") or "").strip().lower() == GIT:
        if kind == SCRAPER:
            raise ValueError(f"connection {conn_id!r} deploys through the managed collector, but connection "
                             f"{source_conn_id!r} asks for {GIT}: choose one")
        from promshift.core.git_source import git_source_of

        git_source_of(source_extra or {}, conn_id=source_conn_id)  # one line for a bad extra.git, at validate
        return GIT
    source = kubernetes_source_of(source_extra or {}, conn_id=source_conn_id)
    if source is None:
        return kind
    if kind == SCRAPER:
        raise ValueError(f"connection {conn_id!r} deploys through the managed collector, but connection "
                         f"{source_conn_id!r} asks for {source.kind}: choose one")
    return source.kind


@dataclass(frozen=True)
class KubernetesSource:
    """Where a Kubernetes-run source's config lives and how to reach its API (the source connection's extra).

    ``extra.kubernetes``: ``namespace`` and ``name`` of the ConfigMap or ``Prometheus`` resource;
    ``key`` (ConfigMap only, default ``prometheus.yml``); how to reach the API, as the cncf-kubernetes
    provider's ``KubernetesHook`` takes it: ``conn_id`` (a ``kubernetes`` connection) or ``config_file``
    (+ ``cluster_context``) or ``in_cluster: true``; ``timeout_s``, how long verify waits for the reload.
    """

    kind: str
    namespace: str
    name: str
    key: str = "prometheus.yml"
    conn_id: str | None = None
    config_file: str | None = None
    cluster_context: str | None = None
    in_cluster: bool | None = None
    timeout_s: float = 300.0
    # ``prometheus_rules``: ["namespace/name", ...], the PrometheusRule objects the source's rules live in
    # (``extra.rules`` then moves them from there: adapters/k8s_rules.py)
    prometheus_rules: tuple[tuple[str, str], ...] = ()


def kubernetes_source_of(extra: Mapping[str, Any], *, conn_id: str = "promshift_source") -> KubernetesSource | None:
    """The source connection's ``extra.deploy`` / ``extra.kubernetes``; None for ``file``; one-line errors."""
    kind = str(extra.get("deploy") or FILE).strip().lower()
    if kind not in SOURCE_DEPLOY_KINDS:
        raise ValueError(f"connection {conn_id!r}: extra.deploy must be one of {', '.join(SOURCE_DEPLOY_KINDS)}, "
                         f"got {kind!r}")
    if kind in (FILE, GIT):
        return None
    raw = extra.get("kubernetes")
    if not isinstance(raw, Mapping):
        raise ValueError(f"connection {conn_id!r}: extra.deploy {kind!r} needs extra.kubernetes: "
                         "{namespace, name, conn_id | config_file | in_cluster}")
    namespace, name = str(raw.get("namespace") or ""), str(raw.get("name") or "")
    if not _DNS_LABEL.match(namespace):
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.namespace must be a DNS label, got {namespace!r}")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.name must be a DNS subdomain, got {name!r}")
    unknown = sorted(set(raw) - ({f.name for f in dataclasses.fields(KubernetesSource)} - {"kind"}))
    if unknown:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes has unknown keys {unknown}")
    if "key" in raw and kind != K8S_CONFIGMAP:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.key applies to a ConfigMap only")
    try:
        timeout_s = float(raw.get("timeout_s", 300.0))
    except (TypeError, ValueError):
        timeout_s = -1.0
    if not timeout_s > 0:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.timeout_s must be a positive number of seconds")
    in_cluster = raw.get("in_cluster")
    if in_cluster is not None and not isinstance(in_cluster, bool):
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.in_cluster must be true or false")
    rules = raw.get("prometheus_rules") or []
    named = [str(item).partition("/") for item in rules] if isinstance(rules, list) else [("", "", "")]
    if any(not _DNS_LABEL.match(ns) or not sep or not _DNS_SUBDOMAIN.match(rule) for ns, sep, rule in named):
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.prometheus_rules must list \"namespace/name\" of "
                         "PrometheusRule objects")
    return KubernetesSource(kind=kind, namespace=namespace, name=name, key=str(raw.get("key") or "prometheus.yml"),
                            conn_id=raw.get("conn_id") or None, config_file=raw.get("config_file") or None,
                            cluster_context=raw.get("cluster_context") or None, in_cluster=in_cluster,
                            timeout_s=timeout_s, prometheus_rules=tuple((ns, rule) for ns, _, rule in named))


def group_for_deploy(group: MetricGroup, deploy: Deploy) -> MetricGroup:
    """The group as its deploy sees it: a managed collector scrapes on its own clock, so its parity is
    ``independent_scraper`` (``dual_write`` parity needs both sides written by the same Prometheus). The
    catalog's tolerances stay as written: independent parity judges the two scrapers against the noise
    their own data shows (``core.parity.bias_findings``), with the catalog's tolerances as a floor only."""
    if deploy.own_writer and group.parity.mode == "dual_write":
        return dataclasses.replace(group, parity=dataclasses.replace(group.parity, mode="independent_scraper"))
    return group
