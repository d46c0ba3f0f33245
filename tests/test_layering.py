"""The package's import graph: no cycles, and the models below what runs them (DESIGN §2).

Read from the source with ``ast``: every ``import`` of a ``django_leases`` module, at module
level **and inside functions** (a deferred import still ties two modules together), but not
those under ``if TYPE_CHECKING:`` (never executed). ``from a.b import c`` is an edge to
``a.b.c`` and to ``a.b`` when ``a.b.c`` is a module (the package's ``__init__`` runs first),
else to ``a.b``. Only explicit imports count: a package's
``__init__`` is a node like any other (the lazy public API of ``django_leases/__init__.py``,
``workflows/__init__.py`` and ``triggers/__init__.py`` imports by name at attribute access).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_leases"

#: What nothing under ``django_leases/models/`` may import (DESIGN §2: the models hold the
#: rules; the engine, the worker, the lifecycle, the providers and the registries use them).
ABOVE_THE_MODELS = (
    "django_leases.workflows.driver",
    "django_leases.workflows.engine",
    "django_leases.workflows.worker",
    "django_leases.workflows.wakeup",
    "django_leases.workflows.registry",
    "django_leases.workflows.display",
    "django_leases.health",
    "django_leases.triggers.lifecycle",
    "django_leases.triggers.providers",
    "django_leases.triggers.registry",
    "django_leases.triggers.receiving",
    "django_leases.leases",
    "django_leases.holder",
    "django_leases.admin",
    "django_leases.management",
)

#: Leaves: modules that import nothing of the package but these.
LEAVES = {
    "django_leases.exceptions": set(),
    # Frozen value classes built at their first instance: the standard library only.
    "django_leases.frozen": set(),
    # The QUEUES setting's reader raises QueueConfigError (exceptions stands above conf).
    "django_leases.conf": {"django_leases.exceptions", "django_leases.frozen"},
    "django_leases.signals": set(),
    "django_leases.clock": set(),
    "django_leases.process": set(),
    "django_leases.ids": set(),
    "django_leases.faults": set(),
    "django_leases.validation": {"django_leases.conf"},
    "django_leases.workflows.values": {
        "django_leases.conf",
        "django_leases.frozen",
        "django_leases.validation",
    },
    "django_leases.triggers.values": {"django_leases.frozen"},
    "django_leases.workflows.sql": {"django_leases.frozen", "django_leases.workflows.values"},
    "django_leases.workflows.functions": {"django_leases.frozen", "django_leases.workflows.sql"},
    "django_leases.workflows.channel": set(),
    # Loop management for async step functions: asyncio and asgiref only.
    "django_leases.workflows.aio": set(),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _executed(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for branch in node.orelse for n in _executed_in(branch))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _executed(node)


def _executed_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _executed(node)


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def graph() -> dict[str, set[str]]:
    """Module -> the ``django_leases`` modules it imports (see the module docstring)."""
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _executed(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = _package_of(name, path).split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = []
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        # ``from pkg import module``: the module, and the package too (its
                        # ``__init__`` runs first).
                        targets += [f"{base}.{alias.name}", base]
                    else:
                        targets.append(base)
            for target in targets:
                if target in modules and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_is_in_an_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The measure is real: a graph with a cycle is reported."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_models_import_nothing_that_runs_them() -> None:
    edges = graph()
    wrong = {
        (module, target)
        for module, targets in edges.items()
        if module.startswith("django_leases.models")
        for target in targets
        if target.startswith(ABOVE_THE_MODELS)
    }
    assert wrong == set()


def test_the_leaves_import_only_leaves() -> None:
    edges = graph()
    for leaf, allowed in LEAVES.items():
        assert edges[leaf] <= allowed, (leaf, edges[leaf] - allowed)


#: Helpers once written in several test modules, now in the test kit under another name.
MOVED_TO_THE_KIT = ("_staff", "_spend_steps_first", "_renewal_threads")


def test_no_test_helper_is_defined_in_several_test_modules() -> None:
    # The test kit (tests/helpers.py) holds what several modules need: no test module
    # defines one of its helpers again (under its name, or its name with a leading "_"),
    # nor a helper that was moved there.
    tests = Path(__file__).resolve().parent
    kit = ast.parse((tests / "helpers.py").read_text()).body
    names = {node.name for node in kit if isinstance(node, ast.FunctionDef)}
    forbidden = {*names, *(f"_{name.lstrip('_')}" for name in names), *MOVED_TO_THE_KIT}
    seen: dict[str, list[str]] = {}
    for module in sorted(tests.glob("test_*.py")):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in forbidden:
                seen.setdefault(node.name, []).append(module.name)
    assert seen == {}


#: Modules that may import the models inside a function, and why (everywhere else the models
#: are imported at the top, where the layering allows: the app registry is ready by the time
#: any of those modules is imported).
DEFERRED_MODEL_IMPORTS = {
    # The lazy public API (``from django_leases import hold_lease``) may be imported by a
    # project's module before the app registry is ready; the models load on first use.
    "django_leases.leases",
}


def test_the_models_are_imported_inside_functions_only_where_allowed() -> None:
    found = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for sub in ast.walk(node):
                module = sub.module if isinstance(sub, ast.ImportFrom) else None
                if module is not None and module.startswith("django_leases.models"):
                    found.add(name)
    assert found <= DEFERRED_MODEL_IMPORTS, found - DEFERRED_MODEL_IMPORTS


#: The most import statements inside function bodies the package may hold (DESIGN §2, issue
#: 26). Each costs a look-up at every call and hides a dependency from the module's head, so
#: one stays only for a reason its comment gives: an optional or backend-specific dependency
#: that is costly to import (cryptography, httpx, psycopg, the migration machinery), the app
#: registry's readiness, or a real import cycle.
MOST_DEFERRED_IMPORTS = 40

#: Deferred imports still without a reason, as ``(path under django_leases/, line's text)``:
#: hoist each to its module's head, or give it its reason, and take it out of this set.
UNEXPLAINED_DEFERRED_IMPORTS: set[tuple[str, str]] = set()


def deferred_imports() -> list[tuple[str, int, bool]]:
    """Every import statement inside a function of the package (migrations aside), outside
    ``if TYPE_CHECKING:``, as ``(path under django_leases/, line, has a reason)``. A reason is
    a comment on the statement's first line, or the comment that stands above it or above
    the run of imports it belongs to (blank lines between them allowed)."""
    found = []
    for path in sorted(_modules().values()):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            statements = [
                node
                for node in _executed(function)
                if isinstance(node, ast.Import | ast.ImportFrom)
            ]
            covered = {
                line for node in statements for line in range(node.lineno, node.end_lineno + 1)
            }
            for node in statements:
                reasoned = "#" in lines[node.lineno - 1]
                above = node.lineno - 1
                while above >= 1 and (above in covered or not lines[above - 1].strip()):
                    above -= 1
                reasoned = reasoned or lines[above - 1].lstrip().startswith("#")
                found.append((str(path.relative_to(PACKAGE)), node.lineno, reasoned))
    return sorted(set(found))


def test_few_imports_are_deferred_and_each_says_why() -> None:
    found = deferred_imports()
    assert len(found) <= MOST_DEFERRED_IMPORTS, [f"{path}:{line}" for path, line, _ in found]
    unexplained = {
        (path, (PACKAGE / path).read_text(encoding="utf-8").splitlines()[line - 1].strip())
        for path, line, reasoned in found
        if not reasoned
    }
    assert unexplained == UNEXPLAINED_DEFERRED_IMPORTS


def test_the_deferred_import_count_sees_imports_in_nested_functions() -> None:
    """The measure is real: an import in a method and in a nested function both count."""
    tree = ast.parse(
        "import os\n"
        "class A:\n"
        "    def f(self):\n"
        "        # deferred: a reason\n"
        "        import json\n"
        "        def g():\n"
        "            import re\n"
    )
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))
    imports = [node for node in _executed(function) if isinstance(node, ast.Import)]
    assert [node.lineno for node in imports] == [5, 7]
