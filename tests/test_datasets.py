"""Dataset loaders on real files: Cora from the shared directory, and small directories
written here in the exact on-disk formats that DGL's and OGB's readers parse."""

from __future__ import annotations

import gzip
import os
import pickle
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import DataConfig, SyntheticConfig
from dgl_scalegnn.data.cache import cache_directory, cache_problem, prepare_cached
from dgl_scalegnn.data.datasets import dataset_from_graph, load_dataset, source_files
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.prepared import open_prepared, prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from tests.helpers import SHARED_DATA

SHARED_PLANETOID = SHARED_DATA / "planetoid"


def _fail_download(*args, **kwargs):
    raise AssertionError(f"a download was attempted: {args} {kwargs}")


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch, tmp_path):
    """Every download entry point of DGL and OGB fails the test; the cache is per test."""
    import ogb.nodeproppred.dataset_dgl as ogb_dataset_dgl

    monkeypatch.setattr(dgl.data.utils, "download", _fail_download)
    monkeypatch.setattr(dgl.data.dgl_dataset, "download", _fail_download)
    monkeypatch.setattr(dgl.data.dgl_dataset.DGLBuiltinDataset, "download", _fail_download)
    monkeypatch.setattr(ogb_dataset_dgl, "download_url", _fail_download)
    monkeypatch.setattr(ogb_dataset_dgl, "decide_download", _fail_download)
    monkeypatch.setattr("builtins.input", _fail_download)  # OGB's update prompt
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SCALEGNN_DATA_ROOT", raising=False)


def _mask_sizes(graph) -> tuple[int, int, int]:
    return tuple(int(graph.ndata[key].sum()) for key in ("train_mask", "val_mask", "test_mask"))


def _check_dtypes(dataset) -> None:
    ndata = dataset.graph.ndata
    assert ndata["feat"].dtype == torch.float32
    assert all(ndata[key].dtype == torch.bool for key in ("train_mask", "val_mask", "test_mask"))
    assert ndata["label"].dtype == (torch.float32 if dataset.multilabel else torch.int64)


# ---------------------------------------------------------------- Planetoid (DGL)


def test_cora_from_shared_files_without_download(monkeypatch, tmp_path):
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(SHARED_PLANETOID.parent))
    for _ in range(2):  # the second load reads DGL's processed cache
        dataset = load_dataset(DataConfig(name="cora"))
        graph = dataset.graph
        assert (graph.num_nodes(), graph.num_edges()) == (2708, 10556)
        assert (dataset.num_features, dataset.num_classes) == (1433, 7)
        assert _mask_sizes(graph) == (140, 500, 1000)
        assert not dataset.multilabel
        _check_dtypes(dataset)
    staged = list((tmp_path / "cache" / "cora").glob("*/cora_v2_d697a464"))
    assert len(staged) == 1
    assert (staged[0] / "cora_v2_dgl_graph.bin").is_file()
    shared_file = (SHARED_PLANETOID / "ind.cora.graph").resolve()  # the root may be a link
    assert (staged[0] / "ind.cora_v2.graph").resolve() == shared_file


def write_planetoid(directory: Path, name: str, skipped_tests: tuple[int, ...] = ()) -> dict:
    """Planetoid files for a ring of 540 vertices, 3 classes, one-hot features.

    Vertex ``i`` has class ``i % 3`` and feature ``i % 3``. Vertices 0..19 are the labelled
    training set, 0..519 make ``allx``; 520..539 are test vertices listed in shuffled
    order in ``test.index``, except ``skipped_tests`` (Citeseer's isolated vertices).
    """
    num_classes, num_all, num_train = 3, 520, 20
    tests = [v for v in range(num_all, num_all + 20) if v not in skipped_tests]
    tests = list(np.random.default_rng(0).permutation(tests))
    num_nodes = num_all + 20

    def features(vertices):
        rows = sp.lil_matrix((len(vertices), num_classes), dtype=np.float32)
        for row, vertex in enumerate(vertices):
            rows[row, vertex % num_classes] = 1.0
        return sp.csr_matrix(rows)

    def onehot(vertices):
        return np.eye(num_classes, dtype=np.int32)[[v % num_classes for v in vertices]]

    graph = defaultdict(list)
    for vertex in range(num_nodes):
        graph[vertex].append((vertex + 1) % num_nodes)
        graph[(vertex + 1) % num_nodes].append(vertex)
    objects = {
        "x": features(range(num_train)),
        "y": onehot(range(num_train)),
        "allx": features(range(num_all)),
        "ally": onehot(range(num_all)),
        "tx": features(tests),
        "ty": onehot(tests),
        "graph": graph,
    }
    directory.mkdir(parents=True, exist_ok=True)
    for part, value in objects.items():
        with open(directory / f"ind.{name}.{part}", "wb") as file:
            pickle.dump(value, file)
    (directory / f"ind.{name}.test.index").write_text("".join(f"{v}\n" for v in tests))
    return {"num_nodes": num_nodes, "tests": sorted(int(v) for v in tests)}


@pytest.mark.parametrize(
    ("name", "skipped", "raw_dirname"),
    [("citeseer", (523, 531), "citeseer_d6836239"), ("pubmed", (), "pubmed_35464cad")],
)
def test_planetoid_from_written_files(monkeypatch, tmp_path, name, skipped, raw_dirname):
    info = write_planetoid(tmp_path / "root" / "planetoid", name, skipped)
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path / "root"))
    dataset = load_dataset(DataConfig(name=name))
    graph = dataset.graph
    assert (graph.num_nodes(), graph.num_edges()) == (info["num_nodes"], 2 * info["num_nodes"])
    assert (dataset.num_features, dataset.num_classes) == (3, 3)
    assert _mask_sizes(graph) == (20, 500, 20 - len(skipped))
    assert torch.nonzero(graph.ndata["test_mask"])[:, 0].tolist() == info["tests"]
    _check_dtypes(dataset)
    labelled = torch.ones(info["num_nodes"], dtype=torch.bool)
    labelled[list(skipped)] = False  # isolated test vertices get zero rows from DGL
    expected = torch.arange(info["num_nodes"]) % 3
    assert torch.equal(graph.ndata["label"][labelled], expected[labelled])
    assert torch.equal(graph.ndata["feat"][labelled].argmax(1), expected[labelled])
    assert list((tmp_path / "cache" / name).glob(f"*/{raw_dirname}"))


def test_missing_planetoid_file_is_named(monkeypatch, tmp_path):
    write_planetoid(tmp_path / "planetoid", "pubmed")
    (tmp_path / "planetoid" / "ind.pubmed.ty").unlink()
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path))
    with pytest.raises(DatasetError, match=r"planetoid/ind\.pubmed\.ty"):
        load_dataset(DataConfig(name="pubmed"))


def test_unset_and_absent_roots_are_explained(tmp_path):
    with pytest.raises(DatasetError, match="SCALEGNN_DATA_ROOT"):
        load_dataset(DataConfig(name="cora"))
    absent = tmp_path / "nowhere"
    with pytest.raises(DatasetError, match=str(absent)):
        load_dataset(DataConfig(name="reddit", root=str(absent)))


# ---------------------------------------------------------------- Reddit (DGL)


def test_reddit_from_written_files(tmp_path):
    num_nodes = 40
    source = np.arange(num_nodes)
    target = (source + 1) % num_nodes
    adjacency = sp.coo_matrix(
        (np.ones(2 * num_nodes), (np.r_[source, target], np.r_[target, source])),
        shape=(num_nodes, num_nodes),
    )
    node_types = np.array([1, 1, 2, 3] * (num_nodes // 4))
    features = np.stack([source, source % 7], axis=1).astype(np.float64)
    (tmp_path / "reddit").mkdir()
    sp.save_npz(tmp_path / "reddit" / "reddit_graph.npz", adjacency)
    np.savez(
        tmp_path / "reddit" / "reddit_data.npz",
        feature=features,
        label=source % 5,
        node_types=node_types,
    )

    dataset = load_dataset(DataConfig(name="reddit", root=str(tmp_path)))
    graph = dataset.graph
    assert (graph.num_nodes(), graph.num_edges()) == (num_nodes, 2 * num_nodes)
    assert (dataset.num_features, dataset.num_classes) == (2, 41)  # DGL fixes Reddit's 41
    _check_dtypes(dataset)
    original = graph.ndata["feat"][:, 0].long()  # DGL reorders vertices; feature 0 is the id
    assert sorted(original.tolist()) == list(range(num_nodes))
    assert torch.equal(graph.ndata["label"], original % 5)
    assert torch.equal(graph.ndata["train_mask"], torch.from_numpy(node_types == 1)[original])
    assert _mask_sizes(graph) == (20, 10, 10)
    assert list((tmp_path / "cache" / "reddit").glob("*/reddit_69f818f5/reddit_data.npz"))


def test_missing_reddit_file_is_named(tmp_path):
    (tmp_path / "reddit").mkdir()
    with pytest.raises(DatasetError, match=r"reddit/reddit_data\.npz.*reddit/reddit_graph\.npz"):
        load_dataset(DataConfig(name="reddit", root=str(tmp_path)))


# ---------------------------------------------------------------- OGB

OGB_NODES = 30
OGB_SPLIT = {"train": np.arange(0, 15), "valid": np.arange(15, 22), "test": np.arange(22, 30)}


def _write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as file:
        file.writelines(",".join(str(value) for value in np.atleast_1d(row)) + "\n" for row in rows)


def _ogb_graph() -> tuple[np.ndarray, np.ndarray]:
    """A directed ring and float features whose first column is the vertex id."""
    ids = np.arange(OGB_NODES)
    edges = np.stack([ids, (ids + 1) % OGB_NODES], axis=1)
    features = np.stack([ids, ids * 0.5, np.ones(OGB_NODES)], axis=1).astype(np.float32)
    return edges, features


def write_ogb_csv(root: Path, folder: str, split: str, extra_node_files=()) -> Path:
    """OGB's csv layout (arxiv, products): raw/*.csv.gz, split/<split>/, release marker."""
    directory = root / folder
    edges, features = _ogb_graph()
    raw = directory / "raw"
    _write_csv_gz(raw / "edge.csv.gz", edges)
    _write_csv_gz(raw / "num-node-list.csv.gz", [OGB_NODES])
    _write_csv_gz(raw / "num-edge-list.csv.gz", [len(edges)])
    _write_csv_gz(raw / "node-feat.csv.gz", features)
    _write_csv_gz(raw / "node-label.csv.gz", np.arange(OGB_NODES) % 5)
    for file in extra_node_files:
        _write_csv_gz(raw / file, np.full(OGB_NODES, 2020))
    for part, index in OGB_SPLIT.items():
        _write_csv_gz(directory / "split" / split / f"{part}.csv.gz", index)
    (directory / "RELEASE_v1.txt").write_text("ogb test layout\n")
    return directory


def _check_ogb(dataset, num_classes: int, num_edges: int) -> None:
    graph = dataset.graph
    assert (graph.num_nodes(), graph.num_edges()) == (OGB_NODES, num_edges)
    assert (dataset.num_features, dataset.num_classes) == (3, num_classes)
    _check_dtypes(dataset)
    assert graph.ndata["label"].shape == (OGB_NODES,)
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert torch.nonzero(graph.ndata[key])[:, 0].tolist() == OGB_SPLIT[part].tolist()


def test_ogbn_arxiv_from_ogb_layout(tmp_path):
    directory = write_ogb_csv(tmp_path, "ogbn_arxiv", "time", ["node_year.csv.gz"])
    for _ in range(2):  # the second load reads OGB's processed file
        dataset = load_dataset(DataConfig(name="ogbn-arxiv", root=str(tmp_path)))
        _check_ogb(dataset, num_classes=40, num_edges=OGB_NODES)
        assert torch.equal(dataset.graph.ndata["label"], torch.arange(OGB_NODES) % 5)
    assert (directory / "processed" / "dgl_data_processed").is_file()


def test_ogb_cache_is_the_in_memory_graph_and_goes_stale_with_its_split(tmp_path):
    directory = write_ogb_csv(tmp_path, "ogbn_arxiv", "time", ["node_year.csv.gz"])
    cfg = DataConfig(name="ogbn-arxiv", root=str(tmp_path), permutation_seed=2)
    split = directory / "split" / "time"
    assert source_files(cfg) == [
        directory / "RELEASE_v1.txt",
        *(split / f"{part}.csv.gz" for part in ("test", "train", "valid")),
    ]
    cached = open_prepared(prepare_cached(cfg))
    reference = prepare_in_memory(load_dataset(cfg), permutation_seed=2)
    assert cached.meta == reference.meta
    for name, array in reference.arrays().items():
        assert np.array_equal(cached.arrays()[name], array), name
    assert cache_problem(cache_directory(cfg), cfg) is None
    os.utime(split / "valid.csv.gz", ns=(0, 0))  # a new download of the split
    assert cache_problem(cache_directory(cfg), cfg).startswith("stale")


def test_ogbn_products_with_numpy_split_dict(tmp_path):
    directory = write_ogb_csv(tmp_path, "ogbn_products", "sales_ranking")
    for part in OGB_SPLIT:
        (directory / "split" / "sales_ranking" / f"{part}.csv.gz").unlink()
    torch.save(OGB_SPLIT, directory / "split" / "sales_ranking" / "split_dict.pt")
    allowed = set(map(str, torch.serialization.get_safe_globals()))
    dataset = load_dataset(DataConfig(name="ogbn-products", root=str(tmp_path)))
    _check_ogb(dataset, num_classes=47, num_edges=2 * OGB_NODES)  # OGB adds inverse edges
    # the allowance was scoped: no numpy type stays allowed (torch may register its own
    # types lazily, e.g. when torch.distributed.tensor is first imported)
    added = set(map(str, torch.serialization.get_safe_globals())) - allowed
    assert not any("numpy" in name for name in added), added


def test_ogbn_papers100m_nan_labels_become_minus_one(tmp_path):
    directory = tmp_path / "ogbn_papers100M"
    edges, features = _ogb_graph()
    labels = (np.arange(OGB_NODES) % 5).astype(np.float64)[:, None]
    unlabelled = np.array([3, 17, 29])
    labels[unlabelled] = np.nan
    split = {part: np.setdiff1d(index, unlabelled) for part, index in OGB_SPLIT.items()}
    (directory / "raw").mkdir(parents=True)
    np.savez(
        directory / "raw" / "data.npz",
        edge_index=edges.T.astype(np.int64),
        num_nodes_list=np.array([OGB_NODES]),
        num_edges_list=np.array([len(edges)]),
        node_feat=features.astype(np.float16),  # as OGB ships papers100M
        node_year=np.full((OGB_NODES, 1), 2020),
    )
    np.savez(directory / "raw" / "node-label.npz", node_label=labels)
    for part, index in split.items():
        _write_csv_gz(directory / "split" / "time" / f"{part}.csv.gz", index)
    (directory / "RELEASE_v1.txt").write_text("ogb test layout\n")

    dataset = load_dataset(DataConfig(name="ogbn-papers100M", root=str(tmp_path)))
    graph = dataset.graph
    assert (graph.num_nodes(), graph.num_edges()) == (OGB_NODES, OGB_NODES)
    assert (dataset.num_features, dataset.num_classes) == (3, 172)
    _check_dtypes(dataset)
    expected = torch.arange(OGB_NODES) % 5
    expected[unlabelled] = -1
    assert torch.equal(graph.ndata["label"], expected)
    in_a_mask = graph.ndata["train_mask"] | graph.ndata["val_mask"] | graph.ndata["test_mask"]
    assert not in_a_mask[unlabelled].any()
    assert int(in_a_mask.sum()) == OGB_NODES - len(unlabelled)


def test_missing_ogb_directory_and_marker_are_named(tmp_path):
    with pytest.raises(DatasetError, match=str(tmp_path / "ogbn_arxiv")):
        load_dataset(DataConfig(name="ogbn-arxiv", root=str(tmp_path)))
    directory = write_ogb_csv(tmp_path, "ogbn_arxiv", "time", ["node_year.csv.gz"])
    (directory / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetError, match=r"RELEASE_v1\.txt"):
        load_dataset(DataConfig(name="ogbn-arxiv", root=str(tmp_path)))
    (directory / "RELEASE_v1.txt").write_text("")
    (directory / "raw" / "node_year.csv.gz").unlink()
    with pytest.raises(DatasetError, match=r"raw/node_year\.csv\.gz"):
        load_dataset(DataConfig(name="ogbn-arxiv", root=str(tmp_path)))


# ---------------------------------------------------------------- dgl.save_graphs files


def _small_graph(label: torch.Tensor, num_nodes: int = 12):
    ids = torch.arange(num_nodes)
    graph = dgl.graph((ids, (ids + 1) % num_nodes), num_nodes=num_nodes)
    graph.ndata["feat"] = torch.randn(num_nodes, 4, dtype=torch.float64)
    graph.ndata["label"] = label
    graph.ndata["train_mask"] = (ids < 6).to(torch.uint8)
    graph.ndata["val_mask"] = (ids >= 6) & (ids < 9)
    graph.ndata["test_mask"] = ids >= 9
    return graph


def test_dgl_file_single_label_with_saved_num_classes(tmp_path):
    path = tmp_path / "graph.bin"
    graph = _small_graph(torch.arange(12) % 3)
    dgl.save_graphs(str(path), [graph], {"num_classes": torch.tensor([5])})
    dataset = load_dataset(DataConfig(name="dgl", path=str(path)))
    assert (dataset.num_classes, dataset.multilabel, dataset.num_features) == (5, False, 4)
    assert _mask_sizes(dataset.graph) == (6, 3, 3)
    _check_dtypes(dataset)
    # DGL 2.1.0 stores a 0-dim tensor without its value: refused, with the fix
    dgl.save_graphs(str(path), [graph], {"num_classes": torch.tensor(5)})
    with pytest.raises(DatasetError, match=r"torch\.tensor\(\[7\]\)"):
        load_dataset(DataConfig(name="dgl", path=str(path)))


def test_dgl_file_multilabel(tmp_path):
    path = tmp_path / "graph.bin"
    targets = (torch.arange(12)[:, None] % torch.tensor([2, 3, 4, 5]) == 0).float()
    dgl.save_graphs(str(path), [_small_graph(targets)])
    dataset = load_dataset(DataConfig(name="dgl", path=str(path)))
    assert (dataset.num_classes, dataset.multilabel) == (4, True)
    assert torch.equal(dataset.graph.ndata["label"], targets)
    _check_dtypes(dataset)


def test_dgl_file_errors_name_file_and_key(tmp_path):
    missing = tmp_path / "absent.bin"
    with pytest.raises(DatasetError, match=str(missing)):
        load_dataset(DataConfig(name="dgl", path=str(missing)))
    path = tmp_path / "unlabelled.bin"
    graph = _small_graph(torch.zeros(12, dtype=torch.int64))
    del graph.ndata["label"]
    dgl.save_graphs(str(path), [graph])
    with pytest.raises(DatasetError, match=rf"{path}.*'label'"):
        load_dataset(DataConfig(name="dgl", path=str(path)))


def test_dataset_from_graph_converts_without_touching_the_graph():
    graph = _small_graph((torch.arange(12) % 4)[:, None])
    dataset = dataset_from_graph(graph, name="mine")
    assert (dataset.name, dataset.num_classes) == ("mine", 4)
    assert dataset.graph.ndata["label"].shape == (12,)
    _check_dtypes(dataset)
    assert graph.ndata["train_mask"].dtype == torch.uint8  # the caller's graph is unchanged
    assert graph.ndata["label"].shape == (12, 1)


def test_dataset_from_graph_refuses_unlabelled_vertices_in_a_mask():
    label = torch.arange(12) % 3
    label[0] = -1
    with pytest.raises(DatasetError, match="train_mask"):
        dataset_from_graph(_small_graph(label))
    with pytest.raises(DatasetError, match="num_classes is 2"):
        dataset_from_graph(_small_graph(torch.arange(12) % 3), num_classes=2)


def test_synthetic_goes_through_the_generator():
    cfg = DataConfig(name="synthetic", synthetic=SyntheticConfig(num_nodes=300, avg_degree=4.0))
    assert load_dataset(cfg).num_nodes == generate(cfg.synthetic).num_nodes
