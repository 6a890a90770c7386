"""The catalog's YAML loader: a SafeLoader that refuses what would hide an edit or hurt the parser."""

from __future__ import annotations

import re
from typing import Any

import yaml

# --------------------------------------------------------------------------- YAML loading


class _CatalogLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads ``1e-9`` as a float.

    PyYAML silently keeps the last of two equal keys, which would hide a
    reviewer's edit; and its YAML 1.1 resolver reads ``1e-9`` (no dot) as a
    string, the natural way to write a tolerance.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key; the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_CatalogLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
