"""The modules of commlib/ and frontends/ import each other along a DAG.

Every module is parsed (nothing is imported), and every import statement
counts, those inside functions too: a lazy import that closes a cycle is
still a cycle. Checked: no cycles; nothing in commlib/ imports a framework
frontend (frontends register themselves with commlib.dispatch); every
``commlib.*`` module named in an import exists; no module reads another
module's private (underscore) names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each package's sources live (as pyproject's package-dir maps them).
PACKAGES = {
    "commlib": ROOT / "commlib",
    "commlib.torch": ROOT / "frontends" / "torch",
    "commlib.tensorflow": ROOT / "frontends" / "tensorflow",
}
FRONTENDS = ("commlib.torch", "commlib.tensorflow")


def _module_files() -> dict[str, Path]:
    """Module name -> source file, for every .py file of the packages."""
    modules = {}
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            rel = path.relative_to(directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([package] + parts)] = path
    return modules


MODULES = _module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None) -> str:
    """The absolute name of a relative import in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the
    module, at any depth (function bodies included)."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            found.append((_resolve(name, node.level, node.module),
                          [a.name for a in node.names], node.lineno))
    return found


def _edges(name: str) -> set[str]:
    """The package modules that ``name`` imports: ``from pkg import sub``
    counts as importing pkg.sub when that is a module, else pkg. The parent
    packages that Python loads on the way are not edges (a package is always
    loaded before its modules)."""
    out = set()
    for target, names, _line in _imports(name):
        if target not in MODULES:
            continue
        subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
        out.update(subs)
        if len(subs) < len(names) or not names:
            out.add(target)
    out.discard(name)
    return out


GRAPH = {name: _edges(name) for name in MODULES}


def _find_cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _is_frontend(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FRONTENDS)


def test_finds_the_modules():
    assert {"commlib", "commlib.ops", "commlib.torch", "commlib.torch.mpi_ops",
            "commlib.tensorflow", "commlib.tensorflow.keras"} <= set(MODULES)


def test_no_import_cycles():
    cycle = _find_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_core_does_not_import_frontends():
    bad = sorted(f"{name} imports {target}" for name, targets in GRAPH.items()
                 if not _is_frontend(name) for target in targets if _is_frontend(target))
    assert not bad, bad


def test_imported_commlib_modules_exist():
    missing = []
    for name in MODULES:
        for target, names, line in _imports(name):
            if target != "commlib" and not target.startswith("commlib."):
                continue
            if target == "commlib._core":
                continue  # built from csrc/ by bindings/build_core.py
            if target not in MODULES:
                missing.append(f"{name}:{line} imports {target}")
    assert not missing, missing


def _module_aliases(name: str, tree: ast.Module) -> dict[str, str]:
    """Local names bound to package modules by the module's imports."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    # "import a.b" binds a; "import a.b as m" binds m to a.b
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node.level, node.module)
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
    return aliases


def test_no_private_names_of_other_modules():
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = _module_aliases(name, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(name, node.level, node.module)
                if target in MODULES:
                    bad += [f"{name}:{node.lineno} imports {target}.{a.name}" for a in node.names
                            if a.name.startswith("_") and f"{target}.{a.name}" not in MODULES]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and node.attr.startswith("_")
                  and not node.attr.startswith("__")
                  and f"{aliases[node.value.id]}.{node.attr}" not in MODULES):
                bad.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, bad


def test_no_export_is_shadowed_by_a_submodule():
    """Importing a submodule binds its name on the package: no commlib module
    may be named like a name commlib exports, or that name would become the
    module (``commlib.grouped_allreduce(...)``: 'module' object is not callable)."""
    import importlib
    import types

    import commlib

    for module in set(commlib._EXPORTS):
        importlib.import_module(f"commlib.{module}")
    for name in commlib.__all__:
        assert not isinstance(getattr(commlib, name), types.ModuleType), name


def test_horovod_module_names_only_re_export():
    """Horovod's module names stay importable, as re-exports of the modules
    that hold the code (collectives/ of each frontend): no definitions."""
    for name in ("commlib.torch.mpi_ops", "commlib.torch.functions",
                 "commlib.tensorflow.mpi_ops", "commlib.tensorflow.functions"):
        tree = ast.parse(MODULES[name].read_text())
        defined = [node.name for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert not defined, f"{name} defines {defined}"
