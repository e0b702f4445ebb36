"""The package's dependencies run one way, so the data flow reads from the imports.

Layers, lowest first; a module may import from its own layer or any lower one:

    config, _dgl, profiling,  (base modules: no import from the layers above)
    heap, errors, cache_dir,
    yaml_reader
    native                    native code: build, signature checks, loading
    core                      axes and layouts, grid shape, the model's schedule, seeds, costs
    data                      datasets, generator, normalisation, prepared format
    distributed               launch, process groups, collectives, watchdog
    parallel                  3D PMM operators, local SpMM kernels, row partitions
    sampling                  uniform sampling, block extraction, the rank's store, batches
    model                     the parallel model, the single-process reference, projections
    evaluation, perfmodel     full-graph evaluation (its buffer plan, engines, evaluator);
                              the cost model, which prices the same plan
    train                     trainer, checkpoints, metrics, run wiring
    cli, api, __init__        the ``scalegnn`` command; the public API that
                              ``import dgl_scalegnn`` gives
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dgl_scalegnn"

LAYERS = [
    {"config", "errors", "cache_dir", "yaml_reader", "_dgl", "profiling", "heap"},
    {"native"},
    {"core"},
    {"data"},
    {"distributed"},
    {"parallel"},
    {"sampling"},
    {"model"},
    {"evaluation", "perfmodel"},
    {"train"},
    {"cli", "api", "__init__"},
]


def _unit(module: str) -> str:
    """``dgl_scalegnn.sampling.store`` -> ``sampling``; ``dgl_scalegnn`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    return next(index for index, units in enumerate(LAYERS) if unit in units)


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        graph[name] = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("dgl_scalegnn")
        }
    return graph


def test_every_package_is_placed_in_a_layer():
    units = {_unit(module) for module in _imports()}
    assert {unit for unit in units if not any(unit in layer for layer in LAYERS)} == set()


def test_no_module_imports_from_a_higher_layer():
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _imports().items()
        for target in targets
        if _layer(_unit(target)) > _layer(_unit(module))
    )
    assert upward == []


def test_module_imports_have_no_cycle():
    graph = _imports()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path, module, target]
            if target not in state and (cycle := visit(target, [*path, module])):
                return cycle
        state[module] = "done"
        return None

    cycles = [visit(module, []) for module in sorted(graph) if module not in state]
    assert [cycle for cycle in cycles if cycle] == []
