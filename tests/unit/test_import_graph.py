"""The modules of commlib/ and frontends/ import each other along a DAG and
meet only at public seams.

Every module is parsed (nothing is imported), and every import statement
counts, those inside functions too: a lazy import that closes a cycle is
still a cycle. Checked: no cycles; nothing in commlib/ imports a framework
frontend (frontends register themselves with commlib.dispatch); every
``commlib.*`` module named in an import exists.

Public seams (the packages are commlib, commlib.torch and commlib.tensorflow,
each with its subpackages; ``_name`` means one underscore, dunders are public):

- a private module (a ``_name`` module, as commlib._lib or
  commlib.torch._dispatch) is imported only by modules of its own package;
  so a frontend never imports commlib._lib or commlib._core, nor cffi,
  nor takes ``ffi``/``lib`` from a commlib module;
- only the binding modules that commlib/_lib.py's docstring lists import
  commlib._lib (or commlib._core, or cffi): they alone touch cffi;
- no module imports a ``_name`` from another module, nor reads ``m._name``
  of another module ``m``;
- no module reads a private attribute that another module's objects define:
  ``x._name`` (or ``getattr``/``hasattr``/``setattr``/``delattr`` of
  ``x, "_name"``), with ``x`` not ``self``/``cls``/``super()``, is refused
  when ``_name`` is defined only in other modules of commlib or frontends/
  (defined: assigned as an attribute anywhere in the module, bound in a
  class body, or set by ``setattr``/``object.__setattr__``). Reading
  ``_name`` on another object of one's own module's classes is allowed;
  private names no module of ours defines (torch's ``_version``, Keras'
  ``_iterations``) are the frameworks' business, not checked here.
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


def _package_of(name: str) -> str:
    """The package (a key of PACKAGES) that holds module ``name``."""
    return max((p for p in PACKAGES if name == p or name.startswith(p + ".")), key=len)


def _private_module(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


CFFI = {"cffi", "_cffi_backend"}
CORE = ("commlib._lib", "commlib._core")


def test_private_modules_stay_in_their_package():
    bad = []
    for name in MODULES:
        for target, names, line in _imports(name):
            targets = [target] + [f"{target}.{n}" for n in names
                                  if f"{target}.{n}" in MODULES or f"{target}.{n}" in CORE]
            for t in targets:
                if t in CFFI and _is_frontend(name):
                    bad.append(f"{name}:{line} imports {t}")
                if (t.startswith("commlib") and _private_module(t)
                        and _package_of(t) != _package_of(name)):
                    bad.append(f"{name}:{line} imports {t} (private to {_package_of(t)})")
            if _is_frontend(name) and target.startswith("commlib") and not _is_frontend(target):
                bad += [f"{name}:{line} takes {n} from {target}" for n in names if n in ("ffi", "lib")]
        tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
        aliases = _module_aliases(name, tree)
        for node in ast.walk(tree):  # commlib._lib reached as an attribute of commlib
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                t = f"{aliases[node.value.id]}.{node.attr}"
                if ((t in MODULES or t in CORE) and _private_module(t)
                        and _package_of(t) != _package_of(name)):
                    bad.append(f"{name}:{node.lineno} uses {t} (private to {_package_of(t)})")
    assert not bad, bad


def _binding_modules() -> set[str]:
    """The modules commlib/_lib.py's docstring names after 'Binding modules:'."""
    doc = ast.get_docstring(ast.parse(MODULES["commlib._lib"].read_text()))
    listed = doc.split("Binding modules:", 1)[1].split(".", 1)[0] if "Binding modules:" in doc else ""
    return {f"commlib.{n.strip(' `')}" for n in listed.replace("\n", " ").split(",") if n.strip()}


def test_only_binding_modules_touch_cffi():
    listed = _binding_modules()
    assert listed, "commlib/_lib.py's docstring lists no 'Binding modules:'"
    users = {name for name in MODULES for target, names, _ in _imports(name)
             if target in CORE or target in CFFI
             or any(f"{target}.{n}" in CORE for n in names)} - set(CORE)
    assert users == listed, (f"touch cffi but are not listed: {sorted(users - listed)}; "
                             f"listed but do not: {sorted(listed - users)}")


def _private(attr) -> bool:
    return isinstance(attr, str) and attr.startswith("_") and not attr.startswith("__")


_ATTR_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def _named_attribute(call: ast.Call) -> tuple[ast.expr, str] | None:
    """(object, name) of ``getattr(x, "_name", ...)`` and its kin, and of
    ``object.__setattr__(x, "_name", v)``."""
    f = call.func
    fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if fname not in _ATTR_CALLS + ("__setattr__",) or len(call.args) < 2:
        return None
    arg = call.args[1]
    if isinstance(arg, ast.Constant) and _private(arg.value):
        return call.args[0], arg.value
    return None


def _defined_attributes(tree: ast.Module) -> set[str]:
    """The private attribute names a module defines (see the module's docstring)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = ([item] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.ClassDef))
                           else item.targets if isinstance(item, ast.Assign)
                           else [item.target] if isinstance(item, ast.AnnAssign) else [])
                for t in targets:
                    out.add(t.name if hasattr(t, "name") else getattr(t, "id", ""))
        elif isinstance(node, ast.Call):
            found = _named_attribute(node)
            if found and isinstance(node.func, (ast.Name, ast.Attribute)) and (
                    getattr(node.func, "id", None) == "setattr"
                    or getattr(node.func, "attr", None) == "__setattr__"):
                out.add(found[1])
    return {n for n in out if _private(n)}


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    return ((isinstance(value, ast.Name) and value.id in ("self", "cls"))
            or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "super"))


def test_no_private_attributes_of_other_modules():
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}
    defined = {name: _defined_attributes(tree) for name, tree in trees.items()}
    definers: dict[str, set] = {}
    for name, attrs in defined.items():
        for a in attrs:
            definers.setdefault(a, set()).add(name)
    bad = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                obj, attr = node.value, node.attr
            elif isinstance(node, ast.Call) and _named_attribute(node):
                obj, attr = _named_attribute(node)
            else:
                continue
            if not _private(attr) or _own(obj) or attr in defined[name] or attr not in definers:
                continue
            bad.append(f"{name}:{node.lineno} reads {ast.unparse(obj)}.{attr} "
                       f"(defined in {', '.join(sorted(definers[attr]))})")
    assert not bad, "\n".join(bad)
