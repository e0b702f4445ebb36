"""The native CPU kernels of the layer tail and RMSNorm against independent oracles.

Values and gradients are checked against float64 autograd, the forward bit for bit
against the eager float32 kernels (the same operations in the same order), and every
test asserts that the native kernel ran (the tail counts its calls by kind), so a
silent fallback to the eager kernels fails here instead of passing.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from dgl_scalegnn import native
from dgl_scalegnn.config import ParallelConfig
from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.data import row_reads
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.parallel import cpu_kernels, elementwise
from dgl_scalegnn.parallel.dropout_hash import dropout_hashes, dropout_mask
from dgl_scalegnn.parallel.elementwise import LayerTail, LocalRows, TailArgs
from dgl_scalegnn.parallel.norm import rms_norm
from dgl_scalegnn.parallel.partition import RowPartition, ShardSpec


def test_the_library_builds_here_and_native_kernels_are_the_default():
    assert cpu_kernels.LIBRARY.load() is not None, cpu_kernels.LIBRARY.failure
    assert ParallelConfig().native_kernels


@pytest.mark.parametrize("library", [cpu_kernels.LIBRARY, row_reads.LIBRARY], ids=["cpu", "rows"])
def test_every_declared_prototype_is_its_definition_in_the_source(library):
    """Each function Python calls, its parameters' types and names in order, and its
    return type, as the C source defines it; and the loaded functions take those."""
    library.check()
    loaded = library.load()
    for name, signature in library.signatures.items():
        function = getattr(loaded, name)
        assert len(function.argtypes) == len(signature.parameters), name


#: cpu_kernels.c's row_square_sums as its prototype, and prototypes that disagree with it.
_ROW_SQUARE_SUMS = "void row_square_sums(const float *x, float *out, int64_t rows, int64_t cols, "
_DISAGREEING = {
    "a parameter's type": _ROW_SQUARE_SUMS + "int64_t threads)",
    "two parameters swapped": _ROW_SQUARE_SUMS.replace("rows, int64_t cols", "cols, int64_t rows")
    + "int threads)",
    "a parameter missing": _ROW_SQUARE_SUMS.replace(", int64_t cols", "") + "int threads)",
    "the return type": _ROW_SQUARE_SUMS.replace("void", "int64_t") + "int threads)",
    "a pointer's target": _ROW_SQUARE_SUMS.replace("const float *x", "const int32_t *x")
    + "int threads)",
}


@pytest.mark.parametrize("prototype", _DISAGREEING.values(), ids=_DISAGREEING.keys())
def test_a_prototype_that_disagrees_with_its_definition_is_never_loaded(prototype, caplog):
    library = native.NativeLibrary(
        cpu_kernels.LIBRARY.source, [prototype], "these kernels", "running eager kernels"
    )
    with pytest.raises(native.SignatureMismatch) as refused:
        library.check()
    declared, defined = native.Signature.of(prototype), _ROW_SQUARE_SUMS + "int threads)"
    assert str(refused.value).startswith(
        f"row_square_sums is declared {declared} but cpu_kernels.c defines {defined}: "
    )
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert library.load() is None
    assert "these kernels unavailable, running eager kernels: row_square_sums" in caplog.text


def test_a_function_the_source_does_not_define_is_refused():
    library = native.NativeLibrary(
        cpu_kernels.LIBRARY.source, ["void row_square_sum(float *out)"], "", ""
    )
    with pytest.raises(native.SignatureMismatch, match="defines no such function"):
        library.check()


def test_a_call_passes_its_arguments_by_their_declared_names():
    x, out = torch.tensor([[3.0, -4.0]]), torch.empty(1, 1)
    arguments = dict(x=x.data_ptr(), out=out.data_ptr(), rows=1, cols=2, threads=1)
    with pytest.raises(TypeError, match="row_square_sums takes x, out, rows, cols, threads"):
        cpu_kernels.LIBRARY.call("row_square_sums", **{**arguments, "columns": 2})
    cpu_kernels.LIBRARY.call("row_square_sums", **dict(reversed(arguments.items())))
    assert out.item() == 25.0


def _inputs(rows: int, cols: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(*shape, dtype=torch.float64, generator=generator)
        for name, shape in (("x", (rows, cols)), ("gain", (cols,)), ("res", (rows, cols)))
    }


def _tail_by_autograd(x, square_sum, gain, residual, keep, width, eps, rate):
    if square_sum is not None:
        x = x * torch.rsqrt(square_sum / width + eps) * gain
    x = torch.relu(x) * keep / (1 - rate)
    return x + residual if residual is not None else x


class MirroredColumns:
    """Another rank holds a copy of these columns: global row sums are twice the local."""

    local = False

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial * 2


@pytest.mark.parametrize("rate", [0.0, 0.3])
@pytest.mark.parametrize("norm", ["none", "local", "reduced"])
@pytest.mark.parametrize("residual", [False, True])
def test_native_tail_values_and_gradients_match_float64_autograd(rate, norm, residual):
    rows, cols, eps = 301, 24, 1e-6
    width = 2 * cols if norm == "reduced" else cols
    statistics = MirroredColumns() if norm == "reduced" else LocalRows()
    ids = torch.randperm(5000, generator=torch.Generator().manual_seed(1))[:rows]
    keep = dropout_mask(77, ids, 5, cols, rate).double()
    weights = torch.linspace(-1, 1, rows * cols, dtype=torch.float64).view(rows, cols)
    tail = LayerTail(fuse=False, native=True)
    results = []
    for dtype in (torch.float64, torch.float32):
        leaves = {k: v.to(dtype).requires_grad_() for k, v in _inputs(rows, cols, seed=2).items()}
        x = leaves["x"]
        gain = leaves["gain"] * 1 if norm != "none" else None
        residual_input = leaves["res"] if residual else None
        if dtype == torch.float64:
            square_sum = (x * x).sum(1, keepdim=True) * width / cols if gain is not None else None
            y = _tail_by_autograd(x, square_sum, gain, residual_input, keep, width, eps, rate)
        else:
            y = tail(x, gain, residual_input, ids, statistics=statistics, key=77, col_start=5,
                     width=width, eps=eps, rate=rate)  # fmt: skip
        (y * weights.to(dtype)).sum().backward()
        results.append([y.detach(), *(leaves[k].grad for k in ("x", "gain", "res"))])
    # forward and backward; reduced: the square sums apart, and after the reduction the
    # gradient's completion
    kernels = {"none": 2, "local": 2, "reduced": 4}[norm]
    assert tail.calls == {"native": kernels, "compiled": 0, "eager": 0}
    for expected, got in zip(*results):
        if expected is None:
            assert got is None
        else:
            torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_native_forward_is_the_eager_forward_bit_for_bit():
    """Given the same row statistics, the forward kernels agree to the bit (the square
    sums themselves are summed in another order: equal to rounding)."""
    values = {k: v.float() for k, v in _inputs(257, 40, seed=3).items()}
    x = values["x"]
    x[3, 5] = float("nan")  # a NaN stays a NaN (the finiteness check must see it)
    native, eager = LayerTail(False, native=True), LayerTail(False, native=False)
    square_sums = [tail.run("square_sums", x) for tail in (native, eager)]
    torch.testing.assert_close(square_sums[0], square_sums[1], equal_nan=True)
    inv_rms = torch.rsqrt(square_sums[1] / 40 + 1e-6)
    row_hash, col_hash = dropout_hashes(9, torch.arange(257), 0, 40)
    gain = values["gain"]
    common = dict(x=x, residual=values["res"], row_hash=row_hash, col_hash=col_hash, width=40)
    cases = ((gain, True, 0.25), (gain, True, 0.0), (gain, False, 0.0), (None, True, 0.25))
    for case_gain, relu, rate in cases:
        case_inv_rms = None if case_gain is None else inv_rms
        args = TailArgs(
            **common,
            gain=case_gain,
            rate=rate,
            relu=relu,
            eps=0.0,
            keep_mask=relu,
            inv_rms=case_inv_rms,
        )
        (got, got_live, _), (expected, expected_live, _) = (
            t.run("forward", args) for t in (native, eager)
        )
        assert got[3].isnan().any()
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
        assert (got_live is None and expected_live is None) or torch.equal(got_live, expected_live)
    # With the square sums in the same pass (no inv_rms given): equal to their rounding.
    args = TailArgs(**common, gain=gain, rate=0.25, relu=True, eps=1e-6, keep_mask=True)
    (got, got_live, got_inv), (expected, expected_live, expected_inv) = (
        t.run("forward", args) for t in (native, eager)
    )
    torch.testing.assert_close(got_inv, expected_inv, equal_nan=True)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert (got_live != expected_live).sum() <= 1  # an element at 0 may round either way
    assert native.calls["native"] == 6 and eager.calls == {"native": 0, "compiled": 0, "eager": 6}


@pytest.mark.parametrize("native", [True, False])
def test_overwrite_writes_the_tail_over_its_input_without_autograd(monkeypatch, native):
    """``overwrite`` (an evaluation's own product): the result is ``x`` itself, equal to
    the bit to a new matrix's, for every switch of the tail; the eager kernel in blocks
    too. Under autograd the input is kept, as its backward reads it."""
    monkeypatch.setattr(elementwise, "_BLOCK_ELEMENTS", 40 * 8)  # blocks of 8 rows
    values = {k: v.float() for k, v in _inputs(57, 40, seed=6).items()}
    tail = LayerTail(False, native=native)
    kwargs = dict(statistics=LocalRows(), key=3, col_start=0, width=40, eps=1e-6)
    for gain, residual, rate in ((None, None, 0.0), (values["gain"], values["res"], 0.25)):
        with torch.no_grad():
            fresh = tail(values["x"], gain, residual, torch.arange(57), rate=rate, **kwargs)
            x = values["x"].clone()
            got = tail(x, gain, residual, torch.arange(57), rate=rate, overwrite=True, **kwargs)
        assert got.data_ptr() == x.data_ptr() and fresh.data_ptr() != values["x"].data_ptr()
        torch.testing.assert_close(got, fresh, rtol=0, atol=0)
    x = values["x"].clone().requires_grad_()
    y = tail(x, None, None, torch.arange(57), rate=0.0, overwrite=True, **kwargs)
    assert y.data_ptr() != x.data_ptr() and torch.equal(x.detach(), values["x"])
    kind = "native" if native else "eager"
    assert tail.calls[kind] == 5 and sum(tail.calls.values()) == 5


def test_non_contiguous_inputs_are_read_correctly():
    values = {k: v.float() for k, v in _inputs(64, 32, seed=4).items()}
    residual_view = values["res"].t().contiguous().t()  # same values, transposed strides
    assert not residual_view.is_contiguous()
    tail = LayerTail(False, native=True)
    kwargs = dict(statistics=None, key=1, col_start=0, width=32, eps=1e-6, rate=0.0)
    got = tail(values["x"], None, residual_view, torch.arange(64), **kwargs)
    torch.testing.assert_close(got, values["x"].relu() + values["res"], rtol=0, atol=0)
    assert tail.calls["native"] == 1


def test_tensors_the_kernels_cannot_take_run_eagerly():
    tail = LayerTail(False, native=True)
    x = torch.randn(8, 4, dtype=torch.float64)
    tail(x, None, None, torch.arange(8), statistics=None, key=1, col_start=0, width=4, eps=0,
         rate=0.0)  # fmt: skip
    assert tail.calls == {"native": 0, "compiled": 0, "eager": 1}
    assert not cpu_kernels.usable(torch.ones(2, dtype=torch.bfloat16))


@pytest.mark.parametrize("native", [True, False])
def test_rms_norm_matches_float64_autograd_on_both_kernels(monkeypatch, native):
    calls = {"native": 0}
    for name in ("row_square_sums", "tail_forward", "tail_backward"):
        original = getattr(cpu_kernels, name)

        def counted(*args, _original=original, **kwargs):
            calls["native"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cpu_kernels, name, counted)
    rows, cols, eps = 203, 24, 1e-6
    runtime = Runtime.single_process()
    spec = ShardSpec(INPUT_LAYOUT, RowPartition.of(torch.arange(rows), 1, runtime.grid.shape), cols)
    weights = torch.linspace(-1, 1, rows * cols, dtype=torch.float64).view(rows, cols)
    results = []
    for dtype in (torch.float64, torch.float32):
        values = _inputs(rows, cols, seed=5)
        x = values["x"].to(dtype).requires_grad_()
        gain = values["gain"].to(dtype).requires_grad_()
        if dtype == torch.float64:
            y = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps) * gain
        else:
            y = rms_norm(x, gain, spec, eps, runtime, LayerTail(fuse=False, native=native))
        (y * weights.to(dtype)).sum().backward()
        results.append([y.detach(), x.grad, gain.grad])
    # square sums and scaling in one pass, and the backward: two native calls or none
    assert calls["native"] == (2 if native else 0)
    for expected, got in zip(*results):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_without_a_compiler_the_tail_runs_eagerly_and_says_so(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cpu_kernels.LIBRARY, "_library", None)
    monkeypatch.setattr(cpu_kernels.LIBRARY, "failure", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    tail = LayerTail(False, native=True)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        y = tail(torch.randn(5, 3), None, None, torch.arange(5), statistics=None, key=1,
                 col_start=0, width=3, eps=0, rate=0.0)  # fmt: skip
    assert y.shape == (5, 3) and tail.calls == {"native": 0, "compiled": 0, "eager": 1}
    assert "native CPU kernels unavailable" in caplog.text and "no-such-compiler" in caplog.text


def test_ranks_share_one_build_in_the_cache(tmp_path):
    """Two processes building at once both load the kernels; one file stays in the cache."""
    code = "from dgl_scalegnn.parallel import cpu_kernels; assert cpu_kernels.LIBRARY.load()"
    env = {**os.environ, "SCALEGNN_CACHE_DIR": str(tmp_path)}
    processes = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    try:
        assert [p.wait(timeout=120) for p in processes] == [0, 0]
    finally:
        for process in processes:
            process.kill()
    assert sorted(p.suffix for p in (tmp_path / "kernels").iterdir()) == [".json", ".so"]


def test_csr_scaled_rows_takes_strided_inputs_and_refuses_rows_past_the_block():
    """The SpMM loop against a dense product, with every input a strided view (copied
    to contiguous memory before the call), and rows outside the block refused."""
    generator = torch.Generator().manual_seed(0)
    dense = (torch.rand(6, 5, generator=generator) < 0.5).float()
    row_scale, col_scale = torch.rand(12, generator=generator), torch.rand(10, generator=generator)
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), dense.sum(1).cumsum(0).long()])
    indices = dense.nonzero()[:, 1].to(torch.int32)
    x = torch.randn(5, 16, generator=generator)[:, ::2]
    expected = row_scale[::2, None] * (dense @ (col_scale[::2, None] * x))
    got = cpu_kernels.csr_scaled_rows(
        crow.repeat_interleave(2)[::2], indices, row_scale[::2], col_scale[::2], x, 1, 6
    )
    torch.testing.assert_close(got, expected[1:6])
    with pytest.raises(IndexError, match="rows"):
        cpu_kernels.csr_scaled_rows(crow, indices, row_scale, col_scale, x, 2, 7)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_csr_kernels_at_every_width_read_column_slices_in_place(index_dtype):
    """The SpMM loop at its accumulator widths (8 to 128, padded reads), across panels of
    128 columns, and at widths in between, reading ``x`` as a column slice of a wider
    matrix and whole, against a dense product; a row of 40 entries makes the look-ahead
    cross rows. Scales given as ``None`` (all ones) give the product with ones, bit for
    bit. The row sums are the SpMM of a column of ones, bit for bit, and the dense row
    sums; without scales, the rows' entry counts."""
    generator = torch.Generator().manual_seed(1)
    dense = (torch.rand(50, 60, generator=generator) < 0.2).float()
    dense[7] = (torch.rand(60, generator=generator) < 0.7).float()  # a high-degree row
    dense[:, 59] = 1.0  # every row reads x's last row, where a padded read must stop
    row_scale, col_scale = torch.rand(50, generator=generator), torch.rand(60, generator=generator)
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), dense.sum(1).cumsum(0).long()])
    indices = dense.nonzero()[:, 1].to(index_dtype)
    matrix = row_scale[:, None] * dense * col_scale[None, :]
    ones_50, ones_60 = torch.ones(50), torch.ones(60)
    for width in (1, 5, 8, 16, 32, 47, 64, 100, 128, 129, 300):
        wide = torch.randn(60, width + 3, generator=generator)
        for x in (wide[:, 2 : 2 + width], wide[:, 3:].contiguous()):  # rows width + 3 apart
            got = cpu_kernels.csr_scaled_rows(crow, indices, row_scale, col_scale, x, 3, 50)
            torch.testing.assert_close(got, (matrix @ x)[3:50])
            unit = cpu_kernels.csr_scaled_rows(crow, indices, None, None, x, 3, 50)
            scaled_by_ones = cpu_kernels.csr_scaled_rows(crow, indices, ones_50, ones_60, x, 3, 50)
            assert torch.equal(unit, scaled_by_ones), width
            torch.testing.assert_close(unit, (dense @ x)[3:50])
    sums = cpu_kernels.csr_row_sums(crow, indices, row_scale, col_scale, 3, 50)
    ones = cpu_kernels.csr_scaled_rows(
        crow, indices, row_scale, col_scale, torch.ones(60, 1), 3, 50
    )
    assert torch.equal(sums, ones)
    torch.testing.assert_close(sums[:, 0], matrix.sum(1)[3:50])
    counts = cpu_kernels.csr_row_sums(crow, indices, None, None, 3, 50)
    assert torch.equal(counts[:, 0], dense.sum(1)[3:50])
    with pytest.raises(IndexError, match="rows"):
        cpu_kernels.csr_row_sums(crow, indices, row_scale, col_scale, 3, 51)
    with pytest.raises(ValueError, match="both scales"):
        cpu_kernels.csr_row_sums(crow, indices, row_scale, None, 3, 50)


# x's 47-column rows end where an inaccessible page begins: a read of the padding
# columns past x's last row would fault (a crash of the child, not of the test run).
_GUARD_PAGE_CHILD = """
import ctypes, mmap, torch
from dgl_scalegnn.parallel import cpu_kernels
page = mmap.PAGESIZE
memory = mmap.mmap(-1, 2 * page)
start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(start + page), page, 0) == 0
floats = torch.frombuffer(memory, dtype=torch.float32, count=page // 4)
rows, width = 9, 47
x = floats[page // 4 - rows * width :].view(rows, width)
x.copy_(torch.randn(rows, width))
crow = torch.arange(rows + 1, dtype=torch.int64) * rows
indices = torch.arange(rows, dtype=torch.int32).repeat(rows)
got = cpu_kernels.csr_scaled_rows(crow, indices, None, None, x, 0, rows)
torch.testing.assert_close(got, x.sum(0).expand(rows, width))
print("read inside x")
"""


def test_padded_reads_stop_at_the_end_of_x():
    child = subprocess.run(
        [sys.executable, "-c", _GUARD_PAGE_CHILD], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0 and "read inside x" in child.stdout, child.stderr
