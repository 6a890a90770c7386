"""One group's run composed from its ports' adapters (no Airflow here): what ``orchestration.wiring`` builds for a
task, and what a test or the lab builds without Airflow.

``compose_migration`` takes ``GroupMigration``'s arguments; a port not given gets its adapter: the source's config
file as the deployer (``adapters.file_deployment``, snapshots as the file's own bytes in ``snapshot_blobs``, by
default a folder, ``snapshots_dir``), the file itself for the decommission's scrape drop, and the measurements
(``adapters.probes``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from promshift.core.deploy import group_entry, group_entry_record


def file_deployer(group: Any, backends: Any) -> Any:
    """The ``remote_write`` file path's ConfigDeployer: the group's own entry in the source's config file."""
    from promshift.adapters.file_deployment import FileDeployment

    return FileDeployment(source_file(backends), group_entry(group, backends.target_remote_write_url,
                                                             backends.target_sigv4),
                          record=group_entry_record(group, backends.target_remote_write_url, backends.target_sigv4),
                          keep_others=True, rules=aggregation_rule_file(group, backends.source_config_path))


def aggregation_rule_file(group: Any, config_path: Any) -> Any:
    """The group's aggregations' recording rules as its own rule file beside the source's config (None without
    ``aggregations``): deployed and rolled back with its ``remote_write`` entry."""
    from promshift.adapters.file_deployment import SourceRuleFile
    from promshift.core.aggregation import AGGREGATE_RULE_PREFIX, aggregation_rules_document

    aggregates = tuple(getattr(group, "aggregations", ()) or ())
    if not aggregates:
        return None
    return SourceRuleFile.beside(config_path, group=AGGREGATE_RULE_PREFIX + group.name,
                                 document=aggregation_rules_document(group.name, aggregates, group.scrape_interval_s),
                                 records=tuple(r for a in aggregates for r in a.recorded))


def source_file(backends: Any) -> Any:
    """The source's config file and the server that loads it (``adapters.deploy.FileConfigDeployer``)."""
    from promshift.adapters.deploy import FileConfigDeployer

    return FileConfigDeployer(backends.source_config_path, backends.source, promtool=backends.promtool)


def queue_cap(group: Any, backends: Any, *, audit: Any, cap: Callable[[], int] | None = None,
              file_path: bool = True, edits: Callable[[Any], Any] | None = None,
              out_of_order_window: Callable[[], tuple[float | None, str]] | None = None,
              member_interval_s: Callable[[str], float | None] | None = None,
              proof_deadline_s: float = 300.0, poll_s: float = 5.0) -> Any:
    """The source's queue cap and swap (``steps.queues.QueueCap``) for a deploy path that adds a source queue.

    ``cap``: what reads the cap (default: the catalog's ``max_queues``); the loaded names from the source's
    ``/api/v1/status/config``; a group's entry may be merged when its audit stage is in ``MERGEABLE_STAGES``;
    the swap edits the source's config file through ``adapters.file_edits`` (``file_path``) or, given ``edits``
    (a ``ConfigDeployer`` per ``core.queues.ConfigChange``: the ``Prometheus`` resource's,
    ``adapters.k8s_edits``), through that; either way it proves on the target, narrowed to the source's external
    labels (several sources may write one workspace). Neither: no swap (past the cap, refused). A swap starts only
    when the target's out-of-order window covers its overlap at the group's scrape interval: ``out_of_order_window``
    reads it (an AMP workspace's configuration: ``AmpHook.out_of_order_window``), by default from the config the
    target has loaded (``adapters.queue_probe.target_out_of_order_window``); ``member_interval_s`` gives each
    member's own scrape interval (the catalog's), so the slowest member sets the window."""
    import time
    from datetime import UTC, datetime

    from promshift.adapters.queue_probe import target_out_of_order_window
    from promshift.core.queues import MERGEABLE_STAGES
    from promshift.core.render import remote_write_names
    from promshift.steps.queues import QueueCap

    def swap_ports() -> tuple[Any, Any]:
        from promshift.adapters.amp_quota import external_labels
        from promshift.adapters.file_edits import FileEditDeployment
        from promshift.adapters.queue_probe import PrometheusQueueProbe
        from promshift.core.promql import promql_string

        def matchers() -> str:  # read when a swap first proves, never under the cap
            labels = external_labels(backends.source.config_text())
            labels.pop(group.replicas.replica_label, None)  # an HA pair's replica label is deduplicated away
            return "".join(f",{k}={promql_string(v)}" for k, v in sorted(labels.items()))

        if edits is not None:
            deployer_for = edits
        else:
            file = source_file(backends)
            deployer_for = lambda change: FileEditDeployment(file, change)  # noqa: E731
        return deployer_for, PrometheusQueueProbe(backends.source, backends.target, target_matchers=matchers)

    return QueueCap(cap=cap or (lambda: int(group.max_queues)), url=backends.target_remote_write_url,
                    loaded_names=lambda: remote_write_names(backends.source.config_text()),
                    has_cut_over=lambda name: audit.stage_of(name) in MERGEABLE_STAGES,
                    swap_ports=swap_ports if file_path or edits is not None else None,
                    clock=lambda: datetime.now(UTC), wait=time.sleep,
                    out_of_order_window=out_of_order_window or (lambda: target_out_of_order_window(backends.target)),
                    scrape_interval_s=float(group.scrape_interval_s),
                    proof_deadline_s=proof_deadline_s, poll_s=poll_s, member_interval_s=member_interval_s)


def compose_migration(group: Any, backends: Any, *, audit: Any, routing: Any, run_id: str,
                      snapshots_dir: str | Path | None = None, snapshot_blobs: Any = None, deployer: Any = None,
                      snapshots: Any = None, probes: Any = None, cls: type | None = None, **kwargs: Any) -> Any:
    """A ``steps.migration.GroupMigration`` (or ``cls``, a subclass: the bench's fault-injecting one) with every
    port wired (see the module)."""
    from promshift.adapters.blobs import LocalBlobs
    from promshift.adapters.file_deployment import FileBytesSnapshotStore
    from promshift.adapters.probes import AdapterProbes
    from promshift.steps.migration import GroupMigration

    if snapshot_blobs is None:
        if snapshots_dir is None:
            raise ValueError("compose_migration needs snapshot_blobs or snapshots_dir")
        snapshot_blobs = LocalBlobs(snapshots_dir)
    deployer = deployer or file_deployer(group, backends)
    snapshots = snapshots or FileBytesSnapshotStore(snapshot_blobs)
    return (cls or GroupMigration)(group, backends, audit=audit, routing=routing, run_id=run_id,
                          snapshot_blobs=snapshot_blobs, deployer=deployer, snapshots=snapshots,
                          probes=probes or AdapterProbes(), source_file=lambda: source_file(backends), **kwargs)
