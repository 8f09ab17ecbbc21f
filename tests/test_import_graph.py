"""The modules of ``bus`` import one another without a cycle (DESIGN.md: shared code moves
down). Every import counts, those inside functions too (a lazy import that closes a circle
still ties the two modules together); only ``if TYPE_CHECKING:`` blocks are left out, as
they never run."""

from __future__ import annotations

import ast
from pathlib import Path

import bus

ROOT = Path(bus.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("bus", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``tree`` imports, at run time."""
    found: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    modules = set(paths)
    return {
        name: _imported(ast.parse(path.read_text(), str(path)), modules) - {name}
        for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
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
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
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
    return found


def test_cycles_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_modules_of_bus_import_one_another_without_a_cycle() -> None:
    graph = import_graph()
    assert "bus.transport.curve" in graph and "bus.transport.certs" in graph
    assert cycles(graph) == []


#: The layers of ``bus``, from the bottom: a module may import from its own package and
#: from lower layers only. The protocols share a layer and never import one another
#: (shared code moves down), except that the Spark bridge reads the Event BUS's feed.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("bus", "bus.errors"),
    ("bus.util",),
    ("bus.transport",),
    ("bus.nats",),
    ("bus.application",),
    ("bus.extension",),
    ("bus.eventbus", "bus.emqp", "bus.mc0", "bus.dbp", "bus.zre"),
    ("bus.spark",),
    ("bus.web", "bus.testing"),
    ("bus.tap",),
)


def _room(module: str) -> str:
    """The package (or top-level module) a module belongs to, as :data:`LAYERS` names it."""
    rooms = [room for layer in LAYERS for room in layer]
    return max((r for r in rooms if module == r or module.startswith(r + ".")), key=len)


def _layer(room: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if room in layer)


def _imported_at_all(tree: ast.AST, modules: set[str]) -> set[str]:
    """Every module of ``modules`` that ``tree`` names in an import, type checking too."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & modules


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up the layers or sideways between two protocols."""
    allowed_sideways = {("bus.spark", "bus.eventbus")}
    found = []
    for module, imported in sorted(graph.items()):
        room = _room(module)
        for target in sorted(imported):
            other = _room(target)
            if other == room or other == "bus":
                continue
            up = _layer(other) > _layer(room)
            sideways = _layer(other) == _layer(room) and (room, other) not in allowed_sideways
            if up or sideways:
                found.append(f"{module} -> {target}")
    return found


def test_wrong_way_finds_an_import_up_and_one_sideways() -> None:
    graph = {
        "bus.util.files": {"bus.tap"},
        "bus.emqp.core": {"bus.eventbus.codec"},
        "bus.spark.bridge": {"bus.eventbus.codec"},
        "bus.eventbus.core": {"bus.errors", "bus.util.files"},
    }
    assert wrong_way(graph) == [
        "bus.emqp.core -> bus.eventbus.codec",
        "bus.util.files -> bus.tap",
    ]


def test_no_import_runs_up_the_layers_or_sideways() -> None:
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    modules = set(paths)
    graph = {
        name: _imported_at_all(ast.parse(path.read_text(), str(path)), modules) - {name}
        for name, path in paths.items()
    }
    assert "bus.eventbus.server" in graph and "bus.tap" in graph
    assert wrong_way(graph) == []
