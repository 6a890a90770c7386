"""The README and docs/ name only things that exist: paths, ``promshift.*`` modules, ``make`` targets, links.

Reads files only (no imports of the named modules, no processes). What is checked, in README.md and
docs/*.md:

- README.md is at most 200 lines (everything else belongs in docs/);
- every repo path in inline code (`include/...`, `docs/...`, `tests/...`, `bench/...`, `catalog/...`,
  `dags/...`, `plugins/...`, `.ci/...`) exists; a ``*`` is a glob that must match, and a path with a
  ``<placeholder>`` or ``{a,b}`` is skipped;
- every dotted ``promshift.x.y`` in code (inline or fenced) is a module under include/, or a module plus
  names it defines at top level (and, for a class, in its body), found by parsing the source;
- every ``make X`` in code is a target of the Makefile;
- every relative Markdown link points at a file that exists, and its ``#anchor`` at one of its headings.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
INCLUDE = REPO / "include"
README = REPO / "README.md"
MAX_README_LINES = 200
DOCS = sorted([README, *(REPO / "docs").glob("*.md")])
PATH_ROOTS = ("include/", "docs/", "tests/", "bench/", "catalog/", "dags/", "plugins/", ".ci/")
# Targets the docs name before the Makefile has them, with why. An entry must go as soon as the target
# exists (test_pending_make_targets_are_still_pending says so), so this never hides a real typo for long.
PENDING_MAKE_TARGETS: dict[str, str] = {
}

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?<![\w./-])promshift(?:\.[A-Za-z_]\w*)+")
MAKE = re.compile(r"(?:^|[\s;&(|])make\s+([a-z][\w-]*)")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _split(text: str) -> tuple[str, list[str]]:
    """The text without its fenced blocks, and the blocks' contents."""
    blocks = [m.group(1) for m in FENCE.finditer(text)]
    return FENCE.sub("", text), blocks


def _code(text: str) -> list[str]:
    """Every piece of code in a Markdown text: inline spans and fenced blocks."""
    prose, blocks = _split(text)
    return [*INLINE.findall(prose), *blocks]


def _inline(text: str) -> list[str]:
    return INLINE.findall(_split(text)[0])


def repo_paths(text: str) -> list[str]:
    """Inline code that is a repo path (a whole span, or a span's words that start at a known root)."""
    found = []
    for span in _inline(text):
        for word in span.split():
            word = word.lstrip("('\"").rstrip(".,;:)'\"")
            if word.startswith(PATH_ROOTS):
                found.append(word)
    return found


def path_exists(path: str) -> bool:
    if "<" in path or "{" in path or "…" in path or "..." in path:
        return True  # a placeholder, not a path
    if "*" in path or "?" in path:
        return any(REPO.glob(path.rstrip("/")))
    return (REPO / path.rstrip("/")).exists()


@cache
def _module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` that binds ``name`` (def, class, assignment or import), or None."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name) and sub.id == name:
                        return node
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return node
        if isinstance(node, ast.If | ast.Try):  # e.g. TYPE_CHECKING imports, optional imports
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                inner.extend(handler.body)
            if (found := _defined(inner, name)) is not None:
                return found
    return None


def module_name_exists(dotted: str) -> bool:
    """``promshift.a.b`` is a module (file or package) under include/, optionally followed by names it defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = INCLUDE.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file():
            source = base.with_suffix(".py")
        elif (base / "__init__.py").is_file():
            source = base / "__init__.py"
        else:
            continue
        body: list[ast.stmt] = _module_tree(source).body
        for name in parts[i:]:
            node = _defined(body, name)
            if node is None:
                return False
            if not isinstance(node, ast.ClassDef):
                return True  # an attribute of a function or a value: not followed further
            body = node.body
        return True
    return False


def make_targets_named(text: str) -> list[str]:
    return [target for code in _code(text) for target in MAKE.findall(code)]


@cache
def makefile_targets() -> frozenset[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", line)
        if match and not line.startswith((".", "\t")):
            targets.update(match.group(1).split())
    return frozenset(targets)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {github_slug(h) for h in HEADING.findall(_split(path.read_text())[0])}


def broken_links(doc: Path) -> list[str]:
    problems = []
    for target in LINK.findall(_split(doc.read_text())[0]):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: no heading #{anchor} in {linked.name}")
    return problems


# ----------------------------------------------------------------------------------------------- tests


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"


def test_readme_layout_folders_exist() -> None:
    """The Layout block: an unindented ``name/`` is a repo folder, an indented one a folder of the first."""
    block = next((b for b in _split(README.read_text())[1] if b.startswith("include/promshift/")), None)
    assert block is not None, "README.md has no Layout block starting with include/promshift/"
    parent, missing = REPO, []
    for line in block.splitlines():
        match = re.match(r"^(\s*)(\S+/)(?:\s|$)", line)
        if not match:
            continue
        base = parent if match.group(1) else REPO
        folder = base / match.group(2)
        if not folder.is_dir():
            missing.append(_name(folder))
        if not match.group(1):
            parent = folder
    assert not missing, f"README.md's layout names folders that do not exist: {missing}"


def test_there_are_docs() -> None:
    assert len(DOCS) > 1, "no docs/*.md found"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_named_paths_exist(doc: Path) -> None:
    missing = sorted({p for p in repo_paths(doc.read_text()) if not path_exists(p)})
    assert not missing, f"{_name(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_named_modules_exist(doc: Path) -> None:
    names = {m for code in _code(doc.read_text()) for m in DOTTED.findall(code)}
    missing = sorted(m for m in names if not module_name_exists(m))
    assert not missing, f"{_name(doc)} names promshift modules or names that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_named_make_targets_exist(doc: Path) -> None:
    named = set(make_targets_named(doc.read_text()))
    missing = sorted(named - makefile_targets() - PENDING_MAKE_TARGETS.keys())
    assert not missing, f"{_name(doc)} names make targets the Makefile lacks: {missing}"


def test_pending_make_targets_are_still_pending() -> None:
    arrived = sorted(PENDING_MAKE_TARGETS.keys() & makefile_targets())
    assert not arrived, f"the Makefile now has {arrived}: remove them from PENDING_MAKE_TARGETS in {__file__}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_links_resolve(doc: Path) -> None:
    problems = broken_links(doc)
    assert not problems, f"{_name(doc)} has broken links: {problems}"


# ------------------------------------------------------------------------------------ the checker itself


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    text = ("See `include/promshift/no_such.py`, `docs/nowhere.md` and `bench/results/*.json`; "
            "run `make demo` or `make no-such-target`; `promshift.core.stages.Stage` and "
            "`promshift.core.stages.NoSuchName`; `python -m promshift.nowhere`.\n\n"
            "```bash\nmake stack-down\n```\n")
    assert sorted(p for p in repo_paths(text) if not path_exists(p)) == [
        "docs/nowhere.md", "include/promshift/no_such.py"]
    assert module_name_exists("promshift.core.stages.Stage")
    assert module_name_exists("promshift.core.stages.Stage.CUT_OVER")
    assert module_name_exists("promshift.core.catalog")  # a package
    assert not module_name_exists("promshift.core.stages.NoSuchName")
    assert not module_name_exists("promshift.nowhere")
    assert sorted(set(make_targets_named(text)) - makefile_targets()) == ["no-such-target"]
    assert "stack-down" in make_targets_named(text)
    assert github_slug("Where local differs from `AWS`") == "where-local-differs-from-aws"
    assert github_slug("What runs (all on 127.0.0.1)") == "what-runs-all-on-127001"
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## A section\n")
    doc.write_text("[ok](b.md#a-section) [bad](b.md#nope) [gone](c.md) [web](https://example.com)\n")
    assert broken_links(doc) == ["b.md#nope: no heading #nope in b.md", "c.md: no such file"]
