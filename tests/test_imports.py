"""The package's import graph: no cycles between localsgd modules (imports inside functions
count too: a deferred import hides a cycle, it does not remove it), no module takes another's
private (``_name``) names, ``import localsgd`` stays light, and every public name resolves."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import localsgd

SRC = Path(localsgd.__file__).resolve().parent
# (importing module, imported module, name): the exceptions, each with its reason
PRIVATE_ALLOWED: set[tuple[str, str, str]] = set()  # none today
# packages whose modules share their private helpers (the package, not the module, is the unit
# of privacy): localsgd.data was one module, split by idea; its __init__ re-exports the helpers
# the tests reach (data._find_cifar)
PRIVATE_SHARED = {"localsgd.data"}


def _shares_privates(importer: str, target: str) -> bool:
    return any((importer == p or importer.startswith(p + ".")) and target.startswith(p + ".")
               for p in PRIVATE_SHARED)


def _module_name(path: Path) -> str:
    parts = ("localsgd", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str | None, int]]:
    """(imported localsgd module, imported name or None, line) for every import in the file,
    at any depth; ``from pkg import sub`` names the submodule ``pkg.sub`` when it is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names
                    if a.name.split(".")[0] == "localsgd"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "localsgd":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.append((sub, None, node.lineno))
                else:
                    out.append((target, alias.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: {m for m, _, _ in _imports(name, path, known) if m in known and m != name}
            for name, path in modules.items()}


def test_the_module_list_is_read():
    graph = _graph()
    assert {"localsgd.training.loop", "localsgd.engines.ddp", "localsgd.training.runner",
            "localsgd.timing.simulate"} <= set(graph)
    assert "localsgd.engines.replicas" in graph["localsgd.training.loop"]


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    known = set(modules)
    bad = []
    for name, path in modules.items():
        for target, imported, line in _imports(name, path, known):
            last = (imported or target.rpartition(".")[2])
            if (last.startswith("_") and not last.startswith("__") and target != name
                    and (name, target, last) not in PRIVATE_ALLOWED
                    and not _shares_privates(name, target)):
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {target}.{last}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_private_exceptions_are_still_needed():
    modules = _modules()
    used = {(name, target, imported) for name, path in modules.items()
            for target, imported, _ in _imports(name, path, set(modules))}
    assert PRIVATE_ALLOWED <= used, f"stale entries: {PRIVATE_ALLOWED - used}"
    shared = {p for p in PRIVATE_SHARED for name, target, imported in used
              if imported and imported.startswith("_") and not imported.startswith("__")
              and target != name and _shares_privates(name, target)
              and (name == p or name.startswith(p + "."))}
    assert shared == PRIVATE_SHARED, f"stale entries: {PRIVATE_SHARED - shared}"


def test_import_localsgd_is_light_and_every_public_name_resolves():
    code = ("import sys, localsgd\n"
            "heavy = [m for m in ('torch', 'pandas', 'numpy') if m in sys.modules]\n"
            "assert not heavy, f'import localsgd imported {heavy}'\n"
            "missing = [n for n in localsgd.__all__ if getattr(localsgd, n, None) is None]\n"
            "assert not missing, missing\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_come_from_their_modules():
    for name in localsgd.__all__:
        if name == "__version__":
            continue
        value = getattr(localsgd, name)
        module = importlib.import_module(localsgd._EXPORTS[name])
        assert getattr(module, name) is value
    assert "Topology" in dir(localsgd)


def test_all_lists_exactly_the_exports():
    assert sorted(localsgd.__all__) == sorted(["__version__", *localsgd._EXPORTS])


def _public(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def test_no_name_is_re_exported_from_a_second_module():
    # one address per name (CHANGELOG.md): a module's __all__ lists only what it defines;
    # a package's __init__ is its face and the package root maps names to their homes
    second = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("localsgd") for a in node.names}
        second += [f"{path.relative_to(SRC)}: {n}" for n in _public(tree) if n in imported]
    assert second == [], second
    # the package root's names point at the module that defines each (or a subpackage: its
    # __init__ is its face)
    for name, module in localsgd._EXPORTS.items():
        file = Path(importlib.import_module(module).__file__)
        if file.name == "__init__.py":
            continue
        tree = ast.parse(file.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
        assert name in defined, f"localsgd.{name} points at {module}, which imports it"
