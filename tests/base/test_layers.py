"""The structure stays as docs/architecture.md draws it, read from the code's own imports with no
remapping (the folder moetune/ is the import name moetune): the layers import only the layers before
them in the data path, the two parts apart (analysis, workloads) import no layer, and no module
takes part in an import cycle. Imports inside functions count as much as those at the top (a cycle
that only loads because one import sits in a function is still a cycle)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# moetune's layers in the order the data flows (moetune/__init__.py); the base is one layer
LAYERS = ("experiment", "store", "estimate", "job", "trial", "decide", "tune", "report", "cli")
BASE = ("__init__", "errors", "paths", "settings")
# apart from the layers: the trace analysis (imports nothing of moetune but itself) and the in-job
# programs (run by path in the job's interpreter: they may read the analysis, nothing else)
APART = {"analysis": ("moetune.analysis",), "workloads": ("moetune.workloads", "moetune.analysis")}


def modules(folder: Path, package: str) -> dict[str, Path]:
    """Import name -> file, for every module of a package folder."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join([package, *parts])] = path
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules a file imports, anywhere in it ('from a import b' counts a.b when b is a
    module, else a)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph(root: Path = REPO, package: str = "moetune") -> dict[str, set[str]]:
    """Module -> the modules of the package it imports; the folder root/package is the package."""
    files = modules(root / package, package)
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> int | None:
    """A module's place: 0 for the base, then LAYERS in order; None for the parts apart."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top in BASE:
        return 0
    return LAYERS.index(top) + 1 if top in LAYERS else None


def against_layers(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            apart = APART.get(src.split(".")[1]) if src.count(".") else None
            if apart is not None and not dst.startswith(apart):
                bad.append(f"{src} -> {dst}: {src.split('.')[1]} imports no layer of moetune")
            ls, ld = layer(src), layer(dst)
            if ls is not None and ld is not None and ld > ls:
                bad.append(f"{src} -> {dst}: layer {([*BASE[:1], *LAYERS])[ls]} imports a later layer")
    return sorted(bad)


def test_every_module_sits_in_a_layer_or_apart():
    """Every module of moetune belongs to the base, a layer, or a part apart."""
    graph = import_graph()
    outside = [m for m in graph if m != "moetune" and layer(m) is None and m.split(".")[1] not in APART]
    assert outside == []
    assert len(graph) > 60  # the walk saw the tree


def test_no_import_cycle():
    """The project's import graph has no cycle."""
    assert cycles(import_graph()) == []


def test_imports_follow_the_layers():
    """No module imports from a layer above its own; the parts apart import no layer."""
    assert against_layers(import_graph()) == []


def test_the_package_folder_is_its_import_name():
    """pyproject maps no folder to another import name: what the walk reads is what Python imports."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools
    import moetune
    assert Path(moetune.__file__).resolve().parent == REPO / "moetune"


def test_the_walk_finds_cycles_and_layer_breaks(tmp_path):
    """The checks themselves: a function-level import that closes a circle, a lower layer that
    reaches up, and a part apart that imports a layer, are all found."""
    pkg = tmp_path / "moetune"
    for sub in ("experiment", "tune", "workloads"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "experiment" / "a.py").write_text("def f():\n    from moetune.tune import b\n")
    (pkg / "tune" / "b.py").write_text("from moetune.experiment.a import f\n")
    (pkg / "workloads" / "w.py").write_text("import moetune.experiment.a\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["moetune.experiment.a", "moetune.tune.b"]]
    assert against_layers(graph) == [
        "moetune.experiment.a -> moetune.tune.b: layer experiment imports a later layer",
        "moetune.workloads.w -> moetune.experiment.a: workloads imports no layer of moetune"]
