"""One group's run composed from its ports' adapters (no Airflow here): what ``orchestration.wiring`` builds for a
task, and what a test or the lab builds without Airflow.

``compose_migration`` takes ``GroupMigration``'s arguments; a port not given gets its adapter: the source's config
file as the deployer (``adapters.file_deployment``, snapshots as the file's own bytes in ``snapshot_blobs``, by
default a folder, ``snapshots_dir``), the file itself for the decommission's scrape drop, and the measurements
(``adapters.probes``).
"""

from __future__ import annotations

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
