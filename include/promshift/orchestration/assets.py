"""The group assets: what a migration emits (a group cut over, a group baked), for the waves and anyone's DAG.

Their own module, below the operators and the DAG factory alike (both use them; neither imports the other
for them).
"""

from __future__ import annotations

from airflow.sdk import Asset


class _HashedOnceAsset(Asset):
    """An ``Asset`` that computes its hash once; equal to, and serialized as, the plain ``Asset`` it is.

    Airflow hashes a DAG for every task on either side of every edge it adds (each XComArg input adds one), and
    a DAG's hash hashes each asset of its schedule, which ``Asset.__hash__`` does through ``attrs.asdict`` and
    JSON every time: a tenth of the parse at 1,000 groups. Its fields are never changed after it is made."""

    __slots__ = ("_hash",)

    def __hash__(self) -> int:
        try:
            return self._hash  # type: ignore[no-any-return]
        except AttributeError:
            object.__setattr__(self, "_hash", super().__hash__())
            return self._hash  # type: ignore[no-any-return]


def cut_over_asset(group_name: str) -> Asset:
    """Emitted when the group is cut over (through the ``cutover`` task's alias, ``CUT_OVER_ALIAS``); the waves
    DAG is scheduled on those of groups that others depend on, and anyone's DAG may be."""
    return _HashedOnceAsset(f"promshift://group/{group_name}/cut_over")


def baked_asset(group_name: str) -> Asset:
    """Emitted when the group's bake finished clean (the bake watch's ``bake_check``, through ``BAKED_ALIAS``)."""
    return Asset(f"promshift://group/{group_name}/baked")


# A shared task emits each group's own asset through an alias: which asset is known only when the task runs.
CUT_OVER_ALIAS = "promshift-cut-over"
BAKED_ALIAS = "promshift-baked"
