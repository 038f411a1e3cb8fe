"""The shape of the code: no import cycles, no mixins reaching into a host's state, every
package saying what it is for (docs/ARCHITECTURE.md, "Rules of the house")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pdserve"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """Every pdserve module `name` imports, anywhere in it (TYPE_CHECKING blocks and
    function bodies included: an import there is still a dependency)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_import_cycles_not_even_for_annotations() -> None:
    graph = {name: imports_of(name) for name in MODULES}
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]]


def pdserve_classes() -> dict[str, tuple[str, ast.ClassDef]]:
    classes = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (name, node)
    return classes


def test_no_class_is_assembled_from_several_pdserve_classes() -> None:
    """A class takes at most one pdserve base (a subclass specialising one concern); two
    or more are mixins sharing a host's state."""
    classes = pdserve_classes()
    mixed = {}
    for class_name, (module, node) in classes.items():
        bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
        if len(bases) > 1:
            mixed[f"{module}.{class_name}"] = bases
    assert mixed == {}


def assigned_attributes(node: ast.ClassDef) -> set[str]:
    found = set()
    for child in ast.walk(node):
        targets = []
        if isinstance(child, ast.Assign):
            targets = child.targets
        elif isinstance(child, ast.AugAssign | ast.AnnAssign):
            targets = [child.target]
        for target in targets:
            for item in ast.walk(target):
                if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                        and item.value.id in ("self", "cls"):
                    found.add(item.attr)
    return found


PLAIN_DATA = {"dataclass", "Protocol", "NamedTuple", "TypedDict", "Enum", "BaseModel",
              "Exception"}


def test_no_class_declares_state_it_does_not_own() -> None:
    """A bare class-level annotation (`free_blocks: int`) in a class that never assigns
    it declares a host's attribute: the mark of a mixin reaching into another object."""
    classes = pdserve_classes()

    def plain(node: ast.ClassDef) -> bool:  # a dataclass, protocol, model... or one's child
        marks = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")
                 for d in node.decorator_list}
        marks |= {getattr(d.func, "id", getattr(d.func, "attr", ""))
                  for d in node.decorator_list if isinstance(d, ast.Call)}
        bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
        return bool((marks | bases) & PLAIN_DATA) or any(
            plain(classes[b][1]) for b in bases if b in classes)

    borrowed = {}
    for class_name, (module, node) in classes.items():
        if plain(node):
            continue
        owned = assigned_attributes(node)
        declared = [item.target.id for item in node.body
                    if isinstance(item, ast.AnnAssign) and item.value is None
                    and isinstance(item.target, ast.Name)]
        foreign = [attr for attr in declared if attr not in owned]
        if foreign:
            borrowed[f"{module}.{class_name}"] = foreign
    assert borrowed == {}


def test_every_package_says_what_it_is_for() -> None:
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    silent = [str(folder.relative_to(PACKAGE.parent)) for folder in sorted(folders)
              if not (folder / "__init__.py").exists()
              or not ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))]
    assert silent == []


def test_folders_by_concept() -> None:
    assert not (PACKAGE / "bench").exists()  # `bench/` is the root folder of scripts
    for package in ("workload", "metrics", "worker", "cluster", "instance", "sim", "live"):
        assert (PACKAGE / package / "__init__.py").exists(), package
