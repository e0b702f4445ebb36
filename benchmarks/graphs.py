"""The presets of :mod:`benchmarks.scale_presets` at a size, prepared once for every method.

:class:`Size` is one preset at one size (B = N/:data:`BATCH_FRACTION`), :func:`parse_sizes`
reads them from a command line (``preset=N,N;preset=N``), and :func:`setup_graph`
prepares one in a work directory, each step in its own process with its seconds and
peak memory: ``scalegnn prepare`` (streaming, bounded memory), the peers' DGL graph
(``graph.bin``, :func:`generate_main`) and DistDGL's partitions (:func:`partition_main`,
not started where its predicted peak does not fit the host).
:class:`Graph` is what the methods of :mod:`benchmarks.methods` read.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import growth_report, scale_presets
from benchmarks.baselines import distdgl
from benchmarks.harness import BenchError, host_available_mb, measured

#: B = N / BATCH_FRACTION for the runs at fixed B/N.
BATCH_FRACTION = 100
#: DistDGL's partitioning is not started where its predicted peak
#: (:func:`predicted_partition_mb`) is this many times the host's available memory: at
#: 10M vertices (sparse) and 2.45M (products-like) it was killed after 2-3 minutes.
PARTITION_MARGIN = 1.1


@dataclass(frozen=True)
class Graph:
    """One graph, ready for the methods that read it: ``scalegnn train`` its config file
    and prepared directory (none: the config's data), the peers its ``dgl.save_graphs``
    file, DistDGL its partitions; ``setup_s``: what preparing them took."""

    name: str
    config_file: str
    num_classes: int
    num_nodes: int
    prepared: Path | None = None
    dgl_file: Path | None = None
    part_config: Path | None = None
    setup_s: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Size:
    """One preset at one size."""

    preset: str
    num_nodes: int

    @property
    def name(self) -> str:
        return f"{self.preset}-{self.num_nodes}"

    @property
    def batch_size(self) -> int:
        return max(1, self.num_nodes // BATCH_FRACTION)


def _count(text: str) -> int:
    """A vertex count: ``3000000``, ``3e6`` or ``3m`` (``k``: thousands).

    >>> _count("2.45m"), _count("20k"), _count("1e6")
    (2450000, 20000, 1000000)
    """
    scale = {"k": 1e3, "m": 1e6}.get(text[-1].lower(), 1.0)
    return round(float(text[:-1] if scale != 1.0 else text) * scale)


def parse_sizes(spec: str) -> tuple[Size, ...]:
    """The sizes of ``spec`` (``preset=N,N;preset=N``), smallest first per preset.

    >>> [s.name for s in parse_sizes("sparse=3m,1000000")]
    ['sparse-1000000', 'sparse-3000000']
    """
    sizes = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        preset, _, counts = part.partition("=")
        scale_presets.preset(preset.strip())  # refuses an unknown name
        for n in sorted(_count(c.strip()) for c in counts.split(",") if c.strip()):
            sizes.append(Size(preset.strip(), n))
    if not sizes:
        raise ValueError(f"no sizes in {spec!r}; give preset=N,N;preset=N")
    return tuple(sizes)


def predicted_partition_mb(
    size: Size, measured_mb: Mapping[str, Sequence[tuple[int, float]]]
) -> tuple[float, float] | None:
    """DistDGL's partitioning peak (MB) at ``size`` and the exponent it grows by, from the
    peaks ``measured_mb`` at smaller sizes (``(vertices, MB)`` per preset): the preset's
    largest measured peak grown as :math:`N^e`, with :math:`e` fitted over the preset's
    sizes, or the mean of the other presets' fits where it has fewer than two (1 where
    none has two). ``None`` where the preset has no measured size.

    >>> sparse = Size("sparse", 10_000_000)
    >>> mb, e = predicted_partition_mb(sparse, {"sparse": [(1e6, 3260.0), (3e6, 8897.0)]})
    >>> round(mb), round(e, 2)
    (26735, 0.91)
    >>> products = Size("products-like", 2_449_029)
    >>> mb, e = predicted_partition_mb(
    ...     products, {"sparse": [(1e6, 3260.0), (3e6, 8897.0)], "products-like": [(1e6, 12264.0)]}
    ... )
    >>> round(mb), round(e, 2)
    (27805, 0.91)
    """
    own = sorted(measured_mb.get(size.preset, ()))
    if not own:
        return None

    def fit(points: Sequence[tuple[int, float]]) -> float | None:
        return growth_report.exponent([n for n, _ in points], [mb for _, mb in points])

    slope = fit(own)
    if slope is None:
        fits = [fit(points) for preset, points in measured_mb.items() if preset != size.preset]
        others = [e for e in fits if e is not None]
        slope = sum(others) / len(others) if others else 1.0
    n, mb = own[-1]
    return mb * (size.num_nodes / n) ** slope, slope


def setup_graph(
    size: Size,
    work: Path,
    steps: Iterable[str] = ("generate", "partition"),
    partition_peaks: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    partitions: tuple[int, str] = (8, "random"),
) -> tuple[Graph, dict[str, Any]]:
    """Prepare ``size`` once (kept in ``work``): ``scalegnn prepare`` and the ``steps``
    asked for, ``generate`` (the peers' DGL graph) and ``partition`` (DistDGL's
    ``partitions``: their count and ``random`` or ``metis``). Returns the graph and the
    seconds and peak memory of each step (a failed step: its error). The partitioning is
    not started where its peak predicted from ``partition_peaks`` (the smaller sizes'
    peaks, :func:`predicted_partition_mb`) exceeds :data:`PARTITION_MARGIN` times the
    host's available memory: the step then holds the prediction."""
    base = work / size.name
    base.mkdir(parents=True, exist_ok=True)
    done = base / "setup.json"
    config_file = scale_presets.CONFIG_FILES[size.preset]
    setup: dict[str, Any] = json.loads(done.read_text()) if done.exists() else {}
    if "prepare" not in setup:
        cfg = scale_presets.preset(size.preset, size.num_nodes)
        argv = ["dgl_scalegnn.cli", "prepare", "--config", config_file]
        for key, value in dataclasses.asdict(cfg).items():  # exactly the peers' graph
            argv += ["--set", f"data.synthetic.{key}={str(value).lower()}"]
        argv += ["--out", str(base / "prepared")]
        setup["prepare"] = measured(argv, base / "prepare.log", 2, 7200)
        done.write_text(json.dumps(setup))
    spec = base / "peers.json"
    parts, method = partitions
    spec.write_text(json.dumps({**dataclasses.asdict(size), "parts": parts, "method": method}))
    needed = set(steps)
    for step in ("generate", "partition"):
        if step in needed and step not in setup:
            module = ["benchmarks.graphs", step, str(spec)]
            if "error" in setup.get("generate", {}):
                setup[step] = {"error": "the graph was not generated"}
                continue
            if step == "partition" and (skipped := _partition_skipped(size, partition_peaks or {})):
                setup[step] = skipped
                done.write_text(json.dumps(setup))
                continue
            started = time.perf_counter()
            try:
                setup[step] = measured(module, base / f"{step}.log", 2, 7200)
            except BenchError as error:  # e.g. killed for memory
                setup[step] = {
                    "error": str(error)[-1500:],
                    "peak_rss_mb": error.peak_rss_mb,
                    "seconds_until_failure": time.perf_counter() - started,
                }
            done.write_text(json.dumps(setup))
    graph = Graph(
        name=size.preset,
        config_file=config_file,
        prepared=base / "prepared",
        dgl_file=base / "graph.bin",
        part_config=base / f"parts{parts}" / f"{distdgl.GRAPH_NAME}.json",
        num_classes=scale_presets.preset(size.preset).num_classes,
        num_nodes=size.num_nodes,
        setup_s={step: f["seconds"] for step, f in setup.items() if "seconds" in f},
    )
    return graph, setup


def _partition_skipped(
    size: Size, partition_peaks: Mapping[str, Sequence[tuple[int, float]]]
) -> dict[str, Any] | None:
    """The partition step's record where its predicted peak does not fit this host."""
    predicted = predicted_partition_mb(size, partition_peaks)
    available = host_available_mb()
    if predicted is None or predicted[0] <= PARTITION_MARGIN * available:
        return None
    mb, slope = predicted
    return {
        "error": f"predicted peak {mb:.0f} MB (the smaller sizes' peaks grown as "
        f"N^{slope:.2f}), above the {available:.0f} MB this host has available",
        "predicted_peak_rss_mb": mb,
        "available_mb": available,
    }


def load_saved(path: Path | str, name: str, num_classes: int):
    """The ``dgl.save_graphs`` file ``path`` as a :class:`NodeDataset` (its masks, saved
    as uint8, boolean again)."""
    from dgl_scalegnn._dgl import dgl
    from dgl_scalegnn.data.graph import NodeDataset

    graphs, _ = dgl.load_graphs(str(path))
    graph = graphs[0]
    for split in ("train", "val", "test"):
        graph.ndata[f"{split}_mask"] = graph.ndata[f"{split}_mask"].bool()
    return NodeDataset(name, graph, num_classes)


def generate_main(spec_path: str) -> int:
    """Inside a child: generate the preset and save it for the peers (``graph.bin``)."""
    from dgl_scalegnn._dgl import dgl
    from dgl_scalegnn.data.synthetic import generate

    spec = json.loads(Path(spec_path).read_text())
    dataset = generate(scale_presets.preset(spec["preset"], int(spec["num_nodes"])))
    dgl.save_graphs(str(Path(spec_path).parent / "graph.bin"), [dataset.graph])
    return 0


def partition_main(spec_path: str) -> int:
    """Inside a child: DistDGL's partitions of the saved graph (``parts<count>``)."""
    base = Path(spec_path).parent
    spec = json.loads(Path(spec_path).read_text())
    num_classes = scale_presets.preset(spec["preset"]).num_classes
    dataset = load_saved(base / "graph.bin", spec["preset"], num_classes)
    distdgl.partition(dataset, base / f"parts{spec['parts']}", spec["parts"], spec["method"])
    return 0


if __name__ == "__main__":
    sys.exit({"generate": generate_main, "partition": partition_main}[sys.argv[1]](sys.argv[2]))
