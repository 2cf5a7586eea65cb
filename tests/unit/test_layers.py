"""The package's shape, checked: imports only go downward through the layers below (lazy
imports inside functions count too), there is no import cycle, and no Slurm command is
spelled outside slurmagent/slurm/ (everything else asks the seam for a named verb).
docs/architecture.md explains the layers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Source folders and the package each is installed as (conf/, skills/ … are mapped by pyproject).
SOURCES = {
    "slurmagent": "slurmagent",
    "skills": "slurmagent.skills",
    "conf": "slurmagent.conf",
    "sbatch_templates": "slurmagent.sbatch_templates",
    "hydra_plugins": "hydra_plugins",
}
# Lowest first. A module may import modules of its own layer or of a lower one. The first
# matching prefix of a module's name gives its layer (more specific prefixes first).
LAYERS: list[tuple[str, ...]] = [
    ("slurmagent.errors",),
    ("slurmagent.records", "slurmagent.files", "slurmagent.syntax", "slurmagent.commands"),
    ("slurmagent.config", "slurmagent.conf"),
    ("slurmagent.slurm",),
    # runtime primitives that skills and the job layer share: checkpoint files, the job's
    # environment schema, the stop flag
    ("slurmagent.primitives",),
    ("slurmagent.safety",),
    ("slurmagent.recovery", "slurmagent.hpo", "slurmagent.schedule"),
    ("slurmagent.skills",),
    ("slurmagent.runtime",),
    # other trainers' loops given the job's protocol (Lightning, Hugging Face): what training code
    # uses, like runtime/, which they build on
    # and where a task's metrics go besides its directory (TensorBoard, MLflow), which the job starts
    ("slurmagent.integrations", "slurmagent.track", "slurmagent.notify"),
    ("slurmagent.job",),
    ("slurmagent.supervise",),
    ("slurmagent.launch",),
    ("slurmagent.examples",),
    # entry points: the command line, render, the Hydra plugin shims, the package itself
    ("slurmagent.cli", "slurmagent.__main__", "slurmagent.render", "slurmagent.sbatch_templates", "hydra_plugins"),
]
# the package's own __init__, at the top too, matched only as itself: a new package is in no layer
# until it is listed here (and in docs/architecture.md), instead of falling under "slurmagent"
EXACT = {"slurmagent"}
SLURM_COMMANDS = {"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "sacctmgr", "sprio", "sshare"}


def modules() -> Iterator[tuple[str, Path]]:
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def layer(module: str) -> int:
    if module in EXACT:
        return len(LAYERS) - 1
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return best[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, as a line."""
    return [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in graph.items()
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]


def folder(module: str, path: Path) -> str:
    """The folder a module's file is in, as a package name ("" for the package root's own files)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return "" if package in EXACT else package


def imports(path: Path, module: str) -> set[str]:
    """Every slurmagent module `path` imports, at module level or inside a function."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    known = dict(modules())
    return {m for m in out if m in known and m != module}


def test_every_import_goes_downward() -> None:
    bad = upward({module: imports(path, module) for module, path in modules()})
    assert not bad, "\n".join(bad)


def test_every_folder_is_one_layer() -> None:
    """A folder's modules share one layer (the package root's own files are the exception: errors,
    config, render … each stand alone), so the folder names say where a thing sits."""
    layers: dict[str, set[int]] = {}
    for module, path in modules():
        if folder(module, path):
            layers.setdefault(folder(module, path), set()).add(layer(module))
    spans = {name: sorted(found) for name, found in layers.items() if len(found) > 1}
    assert not spans, spans


def test_no_import_cycles() -> None:
    graph = {module: imports(path, module) for module, path in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_slurm_commands_are_spelled_only_in_the_seam() -> None:
    found = []
    for module, path in modules():
        if module.startswith("slurmagent.slurm."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: [{first.value!r}, …]")
    assert not found, "Slurm argv outside slurmagent/slurm/ (add a verb to the seam):\n" + "\n".join(found)


def test_the_layer_rules_can_fail() -> None:
    """The checks above see what they must: a module of an unlisted package is in no layer, an
    upward import and a folder across two layers are reported."""
    assert layer("slurmagent.runtime.loop") > layer("slurmagent.primitives.checkpoint")
    assert layer("slurmagent.job.stop") > layer("slurmagent.runtime.loop") > layer("slurmagent.skills.registry")
    assert layer("slurmagent.cli.safety") == len(LAYERS) - 1
    assert layer("slurmagent") == len(LAYERS) - 1
    sample = ROOT / "slurmagent" / "job" / "stop.py"
    assert "slurmagent.safety.gate" in imports(sample, "slurmagent.job.stop")
    try:  # a new package, not listed: not silently filed under the package root
        layer("slurmagent.newpkg.mod")
    except AssertionError as exc:
        assert "slurmagent.newpkg.mod is in no layer" in str(exc)
    else:
        raise AssertionError("an unlisted package got a layer")
    # an upward folder arrow, injected: the seam importing the views
    assert upward({"slurmagent.slurm.seam": {"slurmagent.supervise.views", "slurmagent.errors"}}) == [
        f"slurmagent.slurm.seam (layer {layer('slurmagent.slurm.seam')}) imports slurmagent.supervise.views "
        f"(layer {layer('slurmagent.supervise.views')})"
    ]
    assert folder("slurmagent.cli.plan", ROOT / "slurmagent" / "cli" / "plan.py") == "slurmagent.cli"
    assert folder("slurmagent.errors", ROOT / "slurmagent" / "errors.py") == ""
