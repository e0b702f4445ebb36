"""One rank's share of a prepared graph, and the batches built from it.

At start-up a rank reads from the (memory-mapped) prepared graph only:

- for each adjacency plane its model uses, the block of its row range along the
  plane's row axis and column range along the plane's column axis, from the tiles
  that cover it (:func:`~dgl_scalegnn.data.tiles.read_block`);
- the features of its X row range and Z column range (the input state ``(x, z, y)``);
- labels and masks of its row range along the logits' row axis;
- :math:`\\hat d^{-1/2}` of the vertex ranges it touches.

Planes whose row and column ranges coincide on this rank (all of them on one process)
share one block, and its extraction. Per step, :meth:`RankStore.batch` builds the rank's
mini-batch from a shared sorted sample and the sampler's scaling with no communication
(Algorithm 2, :func:`~dgl_scalegnn.sampling.blocks.extract_block`); evaluation reads the
blocks as they are (:meth:`RankStore.full_graph`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis, Plane, block_range
from dgl_scalegnn.core.schedule import GCN_KIND, LayerKind, adjacency_planes, logits_layout
from dgl_scalegnn.data.normalize import renormalize_block
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.data.tiles import TiledAdjacency, Verify, no_check, read_block, release_pages
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import build_local_spmm
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.blocks import (
    ColumnMap,
    CSRBlock,
    SampledBlock,
    compact,
    gather_candidates,
    gathered_count,
)
from dgl_scalegnn.sampling.uniform import EdgeScaling, UniformSampler

__all__ = ["RankStore", "FullGraph", "load_csr_block"]

SPLITS = ("train", "val", "test")
# A block's vertex ranges: ((row start, row stop), (column start, column stop)).
BlockRanges = tuple[tuple[int, int], tuple[int, int]]


def load_csr_block(
    adjacency: TiledAdjacency,
    rows: tuple[int, int],
    cols: tuple[int, int],
    verify: Verify = no_check,
    normalisation: str = "symmetric",
) -> tuple[CSRBlock, int]:
    """Read block ``rows x cols`` of the (memory-mapped) tiled adjacency, in the
    ``normalisation`` the model's layers multiply by
    (:func:`~dgl_scalegnn.data.normalize.renormalize_block`).

    Returns the block and the bytes read from the adjacency arrays to build it.
    """
    (r0, r1), (c0, c1) = rows, cols
    read = read_block(adjacency, rows, cols, verify)
    verify("degrees", r0, r1)
    verify("degrees", c0, c1)
    entries = renormalize_block(
        read.indptr,
        read.indices,
        read.values,
        r0,
        adjacency.degrees[r0:r1],
        adjacency.degrees[c0:c1],
        normalisation,
    )
    # read.indices is ours: offset it in place rather than through a copy
    in_place = entries.indices is read.indices
    indices = np.subtract(entries.indices, c0, out=entries.indices if in_place else None)
    block = CSRBlock(
        row_start=r0,
        row_stop=r1,
        col_start=c0,
        col_stop=c1,
        indptr=torch.from_numpy(entries.indptr),
        indices=torch.from_numpy(
            indices.astype(np.int32 if c1 - c0 < 2**31 else np.int64, copy=False)
        ),
        row_scale=torch.from_numpy(entries.row_scale),
        col_scale=torch.from_numpy(entries.col_scale),
        unit_scales=normalisation == "sum",  # ones: renormalize_block
    )
    return block, read.bytes_read


#: Rows of a column range copied between two releases of the mapping's pages.
COPY_ROWS = 65536


def _copy_by_rows(array: np.ndarray, rows: int = COPY_ROWS) -> np.ndarray:
    """A contiguous copy of the (memory-mapped) slice ``array``, ``rows`` rows at a time,
    dropping the mapping's resident pages after each: a column range reads every column
    of its rows, so copying it at once would first hold all of them (1.28 GB of a rank's
    5M feature rows at 10M vertices on 1x2x2x2, beside the 640 MB copy)."""
    out = np.empty(array.shape, dtype=array.dtype)
    for start in range(0, array.shape[0], rows):
        out[start : start + rows] = array[start : start + rows]
        release_pages(array)
    return out


@dataclass(frozen=True)
class FullGraph:
    """This rank's share of the whole graph for evaluation (views of the resident store).

    ``blocks``: the normalised adjacency block per plane; ``features`` in state
    ``(x, z, y)``; ``labels``/``masks``: rows along the logits' row axis; ``rows``: every
    vertex, split along every axis.
    """

    rows: RowPartition
    blocks: Mapping[Plane, CSRBlock]
    features: torch.Tensor
    labels: torch.Tensor
    masks: Mapping[str, torch.Tensor]


class RankStore:
    """The share of a prepared graph that this rank of ``grid`` needs.

    Parameters
    ----------
    graph : PreparedGraph
        Usually memory-mapped (:func:`~dgl_scalegnn.data.prepared.open_prepared`).
    grid : Grid4D
        This rank's coordinates decide which ranges it reads.
    num_layers : int
        With ``kind``, decides which adjacency planes (at most three) and the label axis.
    kernel : str
        Local SpMM kernel for the built batches.
    device : torch.device
        Where the share is kept and batches are built.
    kind : LayerKind
        The model's layer type as the schedule sees it
        (:attr:`~dgl_scalegnn.model.convs.base.GraphLayer.kind`): the layouts its layers
        read and the normalisation of the blocks.
    """

    def __init__(
        self,
        graph: PreparedGraph,
        grid: Grid4D,
        num_layers: int,
        kernel: str = "auto",
        device: torch.device | str = "cpu",
        kind: LayerKind = GCN_KIND,
    ) -> None:
        self.meta = graph.meta
        self.grid, self.kernel, self.device = grid, kernel, torch.device(device)
        n = graph.meta.num_nodes
        self.blocks: dict[Plane, CSRBlock] = {}
        self.bytes_read = 0
        # Planes whose row and column ranges coincide share one block, and one extraction
        # per step; the host keeps each block's indptr to size the gathered entries.
        self._range_of: dict[Plane, BlockRanges] = {}
        by_range: dict[BlockRanges, CSRBlock] = {}
        self._host_indptr: dict[BlockRanges, torch.Tensor] = {}
        for plane in adjacency_planes(num_layers, kind):
            ranges = self._vertex_range(plane.rows), self._vertex_range(plane.cols)
            if ranges not in by_range:
                block, bytes_read = load_csr_block(
                    graph.adjacency, *ranges, graph.verify, kind.normalisation
                )
                by_range[ranges] = block.to(self.device)
                self._host_indptr[ranges] = block.indptr
                self.bytes_read += bytes_read
            self.blocks[plane] = by_range[ranges]
            self._range_of[plane] = ranges
        adjacency = graph.adjacency
        for array in (adjacency.rows, adjacency.cols, adjacency.values, adjacency.degrees):
            release_pages(array)
        self._column_maps = {
            ranges: ColumnMap(block.col_stop - block.col_start, self.device)
            for ranges, block in by_range.items()
        }
        self._block_of_range = by_range
        self.feature_rows = self._vertex_range(INPUT_LAYOUT.rows)
        f0, f1 = block_range(
            graph.meta.num_features, grid.size(INPUT_LAYOUT.cols), grid.coord(INPUT_LAYOUT.cols)
        )
        r0, r1 = self.feature_rows
        graph.verify("features", r0, r1)
        self.features = self._load(graph.features[r0:r1, f0:f1])
        self.label_axis = logits_layout(num_layers, kind=kind).rows
        self.label_rows = self._vertex_range(self.label_axis)
        l0, l1 = self.label_rows
        for name in ("labels", *(f"{split}_mask" for split in SPLITS)):
            graph.verify(name, l0, l1)
        self.labels = self._load(graph.labels[l0:l1])
        self.masks = {split: self._load(getattr(graph, f"{split}_mask")[l0:l1]) for split in SPLITS}
        self.num_nodes = n

    def _load(self, array: np.ndarray) -> torch.Tensor:
        """A (memory-mapped) slice as a tensor on the device, counting the bytes.

        On the CPU a contiguous slice stays a view of the read-only mapping (nothing
        writes to a rank's share), so its pages are the page cache's, not a copy; torch's
        warning about a non-writable array is expected there. A slice that had to be
        copied (a column range of the features, or any slice moved to an accelerator)
        read every column of its rows through the mapping: those pages are dropped
        (:func:`release_pages`; 128 MB a rank on 1x2x2x2 with the 1M sparse graph), a
        block of rows at a time for a column range (:func:`_copy_by_rows`).
        """
        contiguous = array if array.flags.c_contiguous else _copy_by_rows(array)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(contiguous).to(self.device)
        self.bytes_read += tensor.numel() * tensor.element_size()
        if not (self.device.type == "cpu" and np.may_share_memory(contiguous, array)):
            release_pages(array)
        return tensor

    def _vertex_range(self, axis: Axis) -> tuple[int, int]:
        return block_range(self.meta.num_nodes, self.grid.size(axis), self.grid.coord(axis))

    def nbytes(self) -> int:
        """Bytes of graph data this rank holds (a block shared by planes counts once)."""
        tensors = [self.features, self.labels, *self.masks.values()]
        blocks = {id(b): b for b in self.blocks.values()}.values()
        return sum(b.nbytes() for b in blocks) + sum(t.numel() * t.element_size() for t in tensors)

    def _local(self, rows: RowPartition, axis: Axis, start: int) -> torch.Tensor:
        return rows.ids(axis, self.grid.coord(axis)) - start

    def column_map(self, plane: Plane) -> ColumnMap:
        """The persistent column map of ``plane``'s block (shared by planes sharing it)."""
        return self._column_maps[self._range_of[plane]]

    def _spans(self, rows: RowPartition, plane: Plane) -> tuple[tuple[int, int], tuple[int, int]]:
        """Offsets of the plane block's row and column vertices in the sorted sample."""
        coord = self.grid.coord
        return rows.range(plane.rows, coord(plane.rows)), rows.range(plane.cols, coord(plane.cols))

    def batch(
        self, sample: torch.Tensor, step: int, scaling: EdgeScaling | None = None
    ) -> RankBatch:
        """This rank's mini-batch for the sorted sample ``sample`` (no communication).

        Give the sample where the sampler drew it (the CPU): the partition offsets, every
        block's row and column spans and its gathered entry count are read there, and
        only the ids are copied to the device. The device is waited for once, for the
        kept entry counts of all blocks together
        (:func:`~dgl_scalegnn.sampling.blocks.compact`). ``scaling`` is the sampler's
        (:meth:`~dgl_scalegnn.sampling.sampler.VertexSampler.scaling`); without it, that
        of a uniform sample of ``sample``'s size. Each adjacency block is a
        :class:`~dgl_scalegnn.sampling.blocks.SampledBlock`: its rows' entry counts
        before sampling come with it.
        """
        if scaling is None:
            scaling = UniformSampler(self.num_nodes, int(sample.numel())).scaling()
        rows = RowPartition.of(sample, self.num_nodes, self.grid.shape, device=self.device)
        planes = {ranges: plane for plane, ranges in self._range_of.items()}  # one per block
        spans = {ranges: self._spans(rows, plane) for ranges, plane in planes.items()}
        gathered = torch.stack(
            [
                gathered_count(self._host_indptr[ranges], sample[r_lo:r_hi] - ranges[0][0])
                for ranges, ((r_lo, r_hi), _) in spans.items()
            ]
        ).tolist()  # host tensors: no device wait
        candidates = {
            ranges: gather_candidates(
                self._block_of_range[ranges],
                rows.vertex_ids,
                spans[ranges],
                self._column_maps[ranges],
                num_gathered,
            )
            for ranges, num_gathered in zip(spans, gathered)
        }
        kept = torch.stack([c.num_kept() for c in candidates.values()]).tolist()  # the wait
        spmm = {
            ranges: SampledBlock(
                build_local_spmm(compact(c, num_kept, scaling), self.kernel), c.row_lengths()
            )
            for (ranges, c), num_kept in zip(candidates.items(), kept)
        }
        feature_rows = self._local(rows, INPUT_LAYOUT.rows, self.feature_rows[0])
        label_rows = self._local(rows, self.label_axis, self.label_rows[0])
        return RankBatch(
            step=step,
            rows=rows,
            adjacency={plane: spmm[ranges] for plane, ranges in self._range_of.items()},
            features=self.features.index_select(0, feature_rows),
            labels=self.labels.index_select(0, label_rows),
            masks={split: mask.index_select(0, label_rows) for split, mask in self.masks.items()},
        )

    def full_graph(self) -> FullGraph:
        """The whole graph for evaluation: views of the resident share, nothing copied; the
        ids of every vertex are made on the device (their split is found from the range on
        the host), never copied to it."""
        everything = ((0, self.num_nodes),)
        return FullGraph(
            rows=RowPartition.of_ranges(everything, self.num_nodes, self.grid.shape, self.device),
            blocks=self.blocks,
            features=self.features,
            labels=self.labels,
            masks=self.masks,
        )
