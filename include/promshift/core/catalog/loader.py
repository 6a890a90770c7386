"""The catalog's YAML loader: a SafeLoader that refuses what would hide an edit or hurt the parser.

Everything here happens while PyYAML composes nodes, before a single Python value is built:

- nesting deeper than ``MAX_DEPTH`` is refused (PyYAML's composer and constructor recurse, so
  5,000 levels would otherwise end in a RecursionError);
- aliases may expand to at most ``MAX_ALIAS_NODES`` nodes in total, counting every node each
  alias stands for: a 600-byte "billion laughs" bomb asks for billions and is refused at once,
  while the honest use (one ``&oncall`` approver list reused by a few groups) stays legal. An
  alias to an anchor that is still open (a self-containing value) is refused outright;
- a scalar longer than ``MAX_SCALAR_CHARS`` is refused (no field needs it; a huge value in an
  error message is what we must never print).

Aliases are budgeted rather than banned: anchors and merge keys (``<<: *common``) are how YAML
reviewers share a block, and the budget makes them exactly as safe as writing the block out.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from promshift.core.inputs import CATALOG, BudgetedComposer

# The catalog's budget (core/inputs.py counts it, shared with every other YAML promshift reads).
MAX_DEPTH = CATALOG.max_depth
MAX_ALIAS_NODES = CATALOG.max_alias_nodes
MAX_SCALAR_CHARS = CATALOG.max_scalar_chars


class _CatalogRules(BudgetedComposer):
    """The budgets above (while composing, ``core.inputs.BudgetedComposer``) plus stricter constructors;
    mixed into a loader below.

    Also: no duplicate keys (PyYAML silently keeps the last of two equal keys, which would hide
    a reviewer's edit) and ``1e-9`` read as a float (PyYAML's YAML 1.1 resolver reads it, with
    no dot, as a string, yet it is the natural way to write a tolerance).
    """

    input_budget = CATALOG

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)  # type: ignore[misc,no-any-return]
        except ValueError as exc:  # more digits than int() converts (Python's 4,300-digit limit)
            raise yaml.constructor.ConstructorError(None, None, f"cannot read the integer: {_clip(str(exc))}",
                                                    node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key; the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {_clip(repr(key))}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]


class _CatalogLoader(_CatalogRules, yaml.SafeLoader):
    """The pure-Python loader (used when PyYAML was built without LibYAML)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._start_budgets()


_LOADERS: list[type] = [_CatalogLoader]

if yaml.__with_libyaml__:
    from yaml._yaml import CParser  # type: ignore[import-not-found]

    class _FastCatalogLoader(_CatalogRules, Composer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """LibYAML scans and parses (about 4x faster); composing stays in Python, with the budgets.

        ``yaml.CSafeLoader`` would compose in C too, out of reach of the checks above.
        """

        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._start_budgets()

    _LOADERS.append(_FastCatalogLoader)

for _loader in _LOADERS:
    _loader.add_implicit_resolver(  # type: ignore[attr-defined]
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    _loader.add_constructor("tag:yaml.org,2002:int", _CatalogRules.construct_yaml_int)  # type: ignore[attr-defined]


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def load_yaml(text: str) -> Any:
    """Load catalog YAML; a problem is a ValueError whose message is one line with its position."""
    try:
        # Safe constructors only (no arbitrary objects); LibYAML's parser when PyYAML has it.
        return yaml.load(text, Loader=_LOADERS[-1])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ValueError(f"invalid YAML: {_clip(' '.join(what.split()), 200)}{where}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {_clip(' '.join(str(exc).split()), 200)}") from None
    except UnicodeError as exc:  # a str with lone surrogates cannot be encoded for LibYAML
        raise ValueError(f"invalid YAML: not valid Unicode text ({_clip(str(exc), 120)})") from None
