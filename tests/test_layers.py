"""The package's shape, as a maintainer relies on it: no import cycle among its modules
(lazy and type-only imports included), few modules at the top, no mixins, no module
too long to read. The layer order itself is import-linter's ([tool.importlinter] in
pyproject.toml, run by scripts/test); this file holds what its contracts cannot say."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "wattprint"
MAX_TOP_LEVEL_MODULES = 5
MAX_LINES = 500


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name; a package is its __init__.py."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = module_files()


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package's module a dotted name is or lies in (wattprint.x.Y -> wattprint.x)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of the package's own modules that
    `module` makes, wherever it stands: at module level, under `if TYPE_CHECKING:`, in
    a function. `from pkg import sub` imports the submodule where there is one."""
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" for alias in node.names]
            names = [name if name in modules else source for name in names]
        else:
            continue
        for name in names:
            target = resolve(name, modules)
            if target is not None and target != module:
                yield target, node.lineno


def graph(modules: dict[str, Path] = MODULES) -> dict[str, dict[str, int]]:
    """importer -> {imported: line of its first such import}."""
    edges: dict[str, dict[str, int]] = {}
    for module in modules:
        edges[module] = {}
        for target, line in imports(module, modules):
            edges[module].setdefault(target, line)
    return edges


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_sees_a_cycle_and_nothing_else() -> None:
    edges = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {}}
    assert sorted(c for c in strongly_connected(edges) if len(c) > 1) == [["a", "b", "c"]]


def test_the_graph_counts_lazy_type_only_relative_and_submodule_imports(tmp_path: Path) -> None:
    files = {
        "__init__.py": "def f():\n    from pkg.a import thing\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b.c\n",
        "b/__init__.py": "from pkg.b import c\nfrom . import d as d\n",
        "b/c.py": "from ..a import thing\nimport json\n",
        "b/d.py": "from pkg.b import nothing_here\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    edges = graph(module_files(tmp_path / "pkg"))
    assert {a: set(b) for a, b in edges.items()} == {
        "pkg": {"pkg.a"},  # lazy, and a name in a module is the module
        "pkg.a": {"pkg.b.c"},  # type-only
        "pkg.b": {"pkg.b.c", "pkg.b.d"},  # from a package, its submodules
        "pkg.b.c": {"pkg.a"},  # relative, two levels; json is not the package's
        "pkg.b.d": {"pkg.b"},  # a name in a package is its __init__
    }
    cycles = sorted(c for c in strongly_connected(edges) if len(c) > 1)
    assert cycles == [["pkg.a", "pkg.b.c"], ["pkg.b", "pkg.b.d"]]


def test_no_import_cycle_among_the_modules() -> None:
    edges = graph()
    cycles = [c for c in strongly_connected(edges) if len(c) > 1]
    described = []
    for cycle in cycles:
        members = set(cycle)
        links = [
            f"    {a} -> {b} ({MODULES[a].relative_to(PACKAGE.parent)}:{line})"
            for a in cycle
            for b, line in sorted(edges[a].items())
            if b in members
        ]
        described.append(" <-> ".join(cycle) + "\n" + "\n".join(links))
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_few_modules_at_the_top_of_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules directly under wattprint/ (at most {MAX_TOP_LEVEL_MODULES}): "
        f"{', '.join(top)}; put new ones in the pipeline package they belong to"
    )


def test_no_mixin_classes() -> None:
    mixins = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Mixin")
    ]
    assert not mixins, "mixin classes (compose an object instead): " + ", ".join(mixins)


def test_no_module_over_the_line_limit() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)} ({n} lines)"
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines (split them): " + ", ".join(long)
