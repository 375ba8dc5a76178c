"""The package's import graph: no circles between modules, and no import from a lower layer to a higher
one (function-level imports count too). The layers, lowest first, are the architecture's floors."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "yue"
# Each top-level name of the package, by floor; a module may import its own floor's and lower ones'.
LAYERS = [
    {"config", "settings", "errors", "jsonl", "tokenizer", "registry", "chat", "infill"},  # typed settings, text, names
    {"model"},  # tensors to tensors: the trained model, knowing no kernel
    {"kernels"},  # the decode path built onto a model for this device
    {"decode"},  # the decode loop over a model
    {"engine", "batcher"},  # model + tokenizer + loop
    {"train", "bench", "serve"},  # what users run on an engine
    {"cli", "__main__"},  # thin commands over all of it (`python -m yue`)
]
FLOOR = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        package = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, `level - 1` floors up
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import submodule` depends on the submodule, not on the package's facade.
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            else:
                continue
            graph[m] |= {t for t in targets if t in modules and t != m}
    return graph


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOOR.get(parts[1]) if len(parts) > 1 else None


def test_every_top_level_name_has_a_floor():
    names = {p.stem if p.is_file() else p.name for p in ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    names -= {"__init__", "__pycache__", "assets"}
    assert names <= set(FLOOR), f"give these a floor in LAYERS: {sorted(names - set(FLOOR))}"


def test_no_module_imports_from_a_higher_floor():
    upward = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if _floor(m) is not None and _floor(t) is not None and _floor(t) > _floor(m)
    ]
    assert not upward, upward


def test_the_model_and_the_decode_loop_import_no_kernel():
    """`yue.model` and `yue.decode` reach the decode paths only through the `PreparedModel` that
    `yue.kernels` builds (its `DecodePaths`: decode sets, stacks, heads and layout)."""
    assert not [
        f"{m} -> {t}"
        for m, ts in _graph().items()
        for t in ts
        if m.startswith(("yue.model", "yue.decode")) and t.startswith("yue.kernels")
    ]


def test_the_import_graph_has_no_circles():
    graph, state, circles = _graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                circles.append(" -> ".join([*path[path.index(t) :], t]))
            elif t not in state:
                visit(t, [*path, t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, circles
