"""How the instance layer is put together: its KV budget alone changes the free-block count,
and nothing in pdserve.instance imports the local scheduler back (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

import pdserve

PACKAGE = Path(pdserve.__file__).parent
BUDGET_MODULE = PACKAGE / "instance" / "kv_budget.py"
FREE_COUNT_NAMES = {"free_blocks", "_free_blocks"}  # KVBudget's count and its read property


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor
                    | ast.comprehension | ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            flat.append(target)
    return flat


def free_count_writes(source: str) -> list[int]:
    """Lines that assign an attribute named like the budget's free count, directly or with
    `setattr`/`delattr`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if isinstance(target, ast.Attribute) and target.attr in FREE_COUNT_NAMES:
                lines.append(target.lineno)
        if isinstance(node, ast.Delete):
            lines += [t.lineno for t in node.targets
                      if isinstance(t, ast.Attribute) and t.attr in FREE_COUNT_NAMES]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in FREE_COUNT_NAMES):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_checker_sees_every_kind_of_write():
    source = """
local.free_blocks += freed
home.free_blocks = 3
a, self.budget._free_blocks = 1, 2
x: int = y.free_blocks  # a read is fine
setattr(local, "free_blocks", 0)
for local.free_blocks in range(3):
    pass
"""
    assert free_count_writes(source) == [2, 3, 4, 6, 7]


def test_only_the_kv_budget_writes_the_free_block_count():
    writers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == BUDGET_MODULE:
            continue
        lines = free_count_writes(path.read_text())
        if lines:
            writers[str(path.relative_to(PACKAGE.parent))] = lines
    assert writers == {}, "free_blocks is written outside instance/kv_budget.py: ask the " \
                          "local scheduler (or its KVBudget) instead"
    assert free_count_writes(BUDGET_MODULE.read_text())  # the budget does write it


def test_no_instance_module_imports_the_local_scheduler():
    importers = []
    for path in sorted((PACKAGE / "instance").glob("*.py")):
        if path.name == "local_scheduler.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.endswith("instance.local_scheduler") for n in names):
                importers.append(path.name)
    assert importers == []
