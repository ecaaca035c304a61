"""The structure stays as docs/architecture.md draws it: moetune.pipeline's layers import only the
layers before them in the data path, moetune.analysis imports nothing of the pipeline, and no
module takes part in an import cycle. Imports inside functions count as much as those at the top
(a cycle that only loads because one import sits in a function is still a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# folder -> import name (pyproject.toml's package-dir)
PACKAGES = {"pipeline": "moetune.pipeline", "analysis": "moetune.analysis"}
# moetune.pipeline's layers in the order the data flows (pipeline/__init__.py)
LAYERS = ("errors", "paths", "settings", "spec", "job", "store", "trial", "decide", "tune", "report", "cli")
BASE = LAYERS[:3]  # one layer: the error base, where files are, the environment; no later layer


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


def import_graph(root: Path = REPO, packages: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    files = {}
    for folder, package in packages.items():
        files.update(modules(root / folder, package))
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
    """A pipeline module's place in LAYERS (the BASE modules share the first); None outside."""
    parts = module.split(".")
    if parts[:2] != ["moetune", "pipeline"] or len(parts) < 3:
        return None
    top = parts[2]
    return 0 if top in BASE else LAYERS.index(top) - len(BASE) + 1 if top in LAYERS else None


def against_layers(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            if src.startswith("moetune.analysis") and dst.startswith("moetune.pipeline"):
                bad.append(f"{src} -> {dst}: analysis imports nothing of the pipeline")
            ls, ld = layer(src), layer(dst)
            if ls is not None and ld is not None and ld > ls:
                bad.append(f"{src} -> {dst}: layer {LAYERS[ls + len(BASE) - 1]} imports a later layer")
    return sorted(bad)


def test_every_pipeline_module_sits_in_a_layer():
    """Every pipeline module belongs to a layer."""
    graph = import_graph()
    outside = [m for m in graph if m.startswith("moetune.pipeline.") and layer(m) is None]
    assert outside == []
    assert len([m for m in graph if m.startswith("moetune.pipeline.")]) > 30  # the walk saw the tree


def test_no_import_cycle():
    """The project's import graph has no cycle."""
    assert cycles(import_graph()) == []


def test_imports_follow_the_layers():
    """No pipeline module imports from a layer above its own."""
    assert against_layers(import_graph()) == []


def test_the_walk_finds_cycles_and_layer_breaks(tmp_path):
    """The checks themselves: a function-level import that closes a circle, and a lower layer that
    reaches up, are both found."""
    pkg = tmp_path / "pipeline"
    for sub in ("spec", "tune"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "a.py").write_text("def f():\n    from moetune.pipeline.tune import b\n")
    (pkg / "tune" / "b.py").write_text("from moetune.pipeline.spec.a import f\n")
    graph = import_graph(tmp_path, {"pipeline": "moetune.pipeline"})
    assert cycles(graph) == [["moetune.pipeline.spec.a", "moetune.pipeline.tune.b"]]
    assert against_layers(graph) == [
        "moetune.pipeline.spec.a -> moetune.pipeline.tune.b: layer spec imports a later layer"]
