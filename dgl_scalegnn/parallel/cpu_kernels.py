"""Native CPU kernels for the element-wise tail and RMSNorm, and for the full-graph
evaluation's SpMM (:func:`csr_scaled_rows`): one loop per kernel.

On CPU the eager tail makes one pass over the ``(rows, cols)`` block per torch
operation and ``torch.compile`` measured slower still; these C loops
(``cpu_kernels.c``) read each input once and write each output once. They are built on
first use with the system C compiler (``$CC``, else ``cc``; ``-O3 -fopenmp``, no fused
multiply-adds, and ``-march=native`` where the compiler takes it: the vector width of
this CPU) into ``kernels/`` of the cache directory
(:func:`~dgl_scalegnn.config.default_cache_dir`, private to the user) keyed by the
source, the compiler and the machine, and linked against the OpenMP runtime torch has
loaded, so that they share its threads. Loading a library runs its code, so a build
is reused only if it and its manifest (``cpu_kernels_<key>.json``, the SHA-256 of what
was compiled) belong to this user, are writable by no one else, and the library's
SHA-256 is the one recorded; otherwise it is built again, with one log line saying why.
Where no compiler works, or for tensors that are not float32 on CPU (CUDA, bfloat16),
the callers run their eager torch kernels: :func:`usable` tells them. The tail's
kernels of every kind take their arguments as one record (:class:`TailArgs` forward,
:class:`TailGradArgs` backward), defined here, the lowest module that reads them.

>>> x = torch.tensor([[3.0, -4.0]])
>>> out = torch.empty(1, 1)
>>> if usable(x):
...     row_square_sums(x, out)
... else:
...     torch.sum(x * x, dim=1, keepdim=True, out=out)
tensor([[25.]])
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from dgl_scalegnn.config import ConfigError, default_cache_dir
from dgl_scalegnn.parallel.dropout_hash import keep_threshold

__all__ = [
    "TailArgs",
    "TailOutputs",
    "TailGradArgs",
    "load",
    "usable",
    "row_square_sums",
    "tail_forward",
    "tail_backward",
    "add_row_scaled",
    "csr_scaled_rows",
    "csr_row_sums",
    "pread_runs",
]

_log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -ffp-contract=off: no fused multiply-adds, so the forward rounds as the eager kernels do
_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
#: Tried first, dropped when the compiler refuses them (the build is cached per CPU model).
_NATIVE_FLAGS = ("-march=native",)
_LIBRARIES = ("-lm",)

# ctypes signatures: p pointer (None for NULL), i int64, n int (threads), f float, s int32
_SIGNATURES = {
    "row_square_sums": "ppiin",
    "tail_forward": "ppnffpfnpppsppiin",
    "norm_backward": "pppppfpppniin",
    "add_row_scaled": "pppiin",
    "masked_grad": "ppfpiin",
    "csr_scaled_rows": "ppnpppiipiiin",
    "csr_row_sums": "ppnpppiin",
    "pread_runs": "niippip",
}
#: Kernels that return a value (the others return nothing).
_RETURNS = {"pread_runs": ctypes.c_int64}
_CTYPES = {
    "p": ctypes.c_void_p,
    "i": ctypes.c_int64,
    "n": ctypes.c_int,
    "f": ctypes.c_float,
    "s": ctypes.c_int32,
}


def _rows(tensor: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if tensor is None else tensor[rows]


@dataclass(frozen=True)
class TailArgs:
    """The arguments of the layer tail's forward kernel, whichever kind runs it (eager,
    compiled or native), for all rows of a shard or a block of them (:meth:`rows`).

    Attributes
    ----------
    x : torch.Tensor
        ``(rows, cols)``: the local shard.
    gain : torch.Tensor or None
        ``(cols,)``: the RMSNorm gain of this rank's columns; ``None`` without the norm.
    residual : torch.Tensor or None
        ``(rows, cols)``, added last; ``None`` without the residual.
    row_hash, col_hash : torch.Tensor or None
        ``(rows, 1)`` and ``(1, cols)``: the dropout hashes
        (:func:`~dgl_scalegnn.parallel.dropout_hash.dropout_hashes`); ``None`` without
        dropout.
    rate : float
        The dropout rate :math:`p` (0: no dropout).
    relu : bool
        ``False`` (the final RMSNorm: with the norm, no dropout, no mask) leaves the ReLU
        out.
    width : int
        The global width :math:`d` of the rows, for the inverse RMS.
    eps : float
        The RMSNorm's :math:`\\epsilon`.
    keep_mask : bool
        Give ``live`` (:class:`TailOutputs`), for the backward.
    inv_rms : torch.Tensor or None
        ``(rows, 1)``: the rows' inverse RMS over the columns of every rank; with the
        norm and ``None`` (the rows' columns are all here), the forward computes it from
        ``x`` in the same pass, :math:`(s / d + \\epsilon)^{-1/2}` with :math:`s` the
        row sums of squares.
    overwrite : bool
        Write ``y`` over ``x`` (the caller's own matrix, read by nothing after; no
        autograd): no new ``(rows, cols)`` matrix, and the one written is in cache.
        The native and the blocked eager kernels do; the compiled one gives a new
        matrix.
    """

    x: torch.Tensor
    gain: torch.Tensor | None
    residual: torch.Tensor | None
    row_hash: torch.Tensor | None
    col_hash: torch.Tensor | None
    rate: float
    relu: bool
    width: int
    eps: float
    keep_mask: bool = False
    inv_rms: torch.Tensor | None = None
    overwrite: bool = False

    @property
    def scale(self) -> float:
        """The inverted dropout's scale :math:`1 / (1 - p)`."""
        return 1.0 / (1.0 - self.rate)

    @property
    def device(self) -> torch.device:
        return self.x.device

    def rows(self, rows: slice) -> TailArgs:
        """The arguments for a block of rows (the gain and column hashes are shared)."""
        return replace(
            self,
            x=self.x[rows],
            residual=_rows(self.residual, rows),
            row_hash=_rows(self.row_hash, rows),
            inv_rms=_rows(self.inv_rms, rows),
        )


class TailOutputs(NamedTuple):
    """What the tail's forward kernel gives, or the buffers it writes that into.

    ``y`` ``(rows, cols)``; ``live`` (only with ``keep_mask``) 0/1 bytes ``(rows, cols)``
    marking the elements that pass ReLU and dropout, where the tail's derivative is
    ``inv_rms * gain / (1 - rate)`` (elsewhere 0); ``inv_rms`` ``(rows, 1)``, ``None``
    without the norm.
    """

    y: torch.Tensor
    live: torch.Tensor | None
    inv_rms: torch.Tensor | None

    def rows(self, rows: slice) -> TailOutputs:
        """The outputs' views of a block of rows."""
        return TailOutputs(self.y[rows], _rows(self.live, rows), _rows(self.inv_rms, rows))


@dataclass(frozen=True)
class TailGradArgs:
    """The arguments of the tail's backward kernel: the gradient of ``y`` and what the
    forward kept (for all rows or a block of them, :meth:`rows`).

    Attributes
    ----------
    grad : torch.Tensor
        ``(rows, cols)``: the gradient of ``y``.
    live : torch.Tensor or None
        The forward's ``live`` (:class:`TailOutputs`); ``None``: all ones.
    x, inv_rms, gain : torch.Tensor or None
        The forward's input, inverse RMS and gain; ``None`` without the norm.
    rate : float
        The dropout rate :math:`p`.
    width : int
        The global width :math:`d` of the rows.
    finish : bool
        The square sums ``s`` were summed over this rank's columns only: the gradient of
        ``x`` includes its part through them, :math:`2 x\\, \\partial s`; otherwise the
        caller adds it once :math:`\\partial s` is summed over the other columns' ranks.
    """

    grad: torch.Tensor
    live: torch.Tensor | None
    x: torch.Tensor | None
    inv_rms: torch.Tensor | None
    gain: torch.Tensor | None
    rate: float
    width: int
    finish: bool

    @property
    def scale(self) -> float:
        """The inverted dropout's scale :math:`1 / (1 - p)`."""
        return 1.0 / (1.0 - self.rate)

    @property
    def device(self) -> torch.device:
        return self.grad.device

    def rows(self, rows: slice) -> TailGradArgs:
        """The arguments for a block of rows (the gain is shared)."""
        return replace(
            self,
            grad=self.grad[rows],
            live=_rows(self.live, rows),
            x=_rows(self.x, rows),
            inv_rms=_rows(self.inv_rms, rows),
        )


_library: ctypes.CDLL | None = None
_load_failure: str | None = None


def _machine_key() -> str:
    """What a build depends on beyond the source and flags: compiler, CPU, platform."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next(
            (line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")),
            "",
        )
    return f"{platform.machine()}|{platform.system()}|{model}"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _build_key(compiler: str) -> str:
    """What the build depends on: source, compiler and its version, flags, machine."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout
    flags = " ".join(_FLAGS + _NATIVE_FLAGS)
    return hashlib.sha256(
        "\n".join((_SOURCE.read_text(), compiler, version, flags, _machine_key())).encode()
    ).hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Untrusted(Exception):
    """A build that must not be loaded; the message says why."""


def _check_owner(path: Path) -> None:
    """Refuse ``path`` (not followed if a link) if someone else could have written it."""
    status, uid = path.lstat(), os.geteuid()
    if status.st_uid != uid:
        raise _Untrusted(f"{path} belongs to uid {status.st_uid}, not to you (uid {uid})")
    if status.st_mode & 0o022:
        mode = status.st_mode & 0o7777
        raise _Untrusted(f"{path} is writable by its group or others (mode {mode:04o})")


def _recorded_library(manifest: Path) -> Path:
    """The library that ``manifest`` records, once both are checked (module docstring).

    Raises
    ------
    _Untrusted
        If either is someone else's or writable by others, the manifest is unreadable,
        or the library's SHA-256 is not the one recorded.
    """
    try:
        _check_owner(manifest)
        record = json.loads(manifest.read_text())
        library = manifest.with_name(record["library"])
        _check_owner(library)
        digest = _sha256(library)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _Untrusted(f"{manifest} is unreadable or names no library ({error})") from None
    if digest != record["sha256"]:
        raise _Untrusted(f"the SHA-256 of {library} is not the one {manifest.name} records")
    return library


def _build(compiler: str) -> Path:
    """The library, compiled once per (source, compiler, flags, machine) and reused
    after the checks of the module docstring; atomic on disk, so concurrent ranks may
    build at the same time."""
    key = _build_key(compiler)
    directory = default_cache_dir("kernels")
    manifest = directory / f"cpu_kernels_{key}.json"
    if manifest.exists():
        try:
            return _recorded_library(manifest)
        except _Untrusted as problem:
            _log.warning("building the native CPU kernels again: %s", problem)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = Path(scratch) / "cpu_kernels.so"
        for flags in (_FLAGS + _NATIVE_FLAGS, _FLAGS):
            result = subprocess.run(
                [compiler, *flags, str(_SOURCE), "-o", str(built), *_LIBRARIES],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode == 0:
                break
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:500]}")
        digest = _sha256(built)
        # named by its content: a concurrent build never replaces the file another loads
        target = directory / f"cpu_kernels_{key}_{digest[:16]}.so"
        record = Path(scratch) / "manifest.json"
        record.write_text(json.dumps({"library": target.name, "sha256": digest}) + "\n")
        # whatever the umask: a group-writable build would be refused at its next load
        os.chmod(built, 0o700)
        os.chmod(record, 0o600)
        os.replace(built, target)
        os.replace(record, manifest)
    return target


def load() -> ctypes.CDLL | None:
    """The kernel library, built on the first call; ``None`` (and one log line) where it
    cannot be built or loaded."""
    global _library, _load_failure
    if _library is not None or _load_failure is not None:
        return _library
    try:
        compiler = _compiler()
        if compiler is None:
            raise RuntimeError(f"no C compiler ({os.environ.get('CC', 'cc')!r} not found)")
        library = ctypes.CDLL(str(_build(compiler)), use_errno=True)
        for name, signature in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = [_CTYPES[code] for code in signature]
            function.restype = _RETURNS.get(name)
        _library = library
    # AttributeError: a symbol is missing; ConfigError: the cache directory is not private
    except (OSError, RuntimeError, AttributeError, ConfigError) as error:
        _load_failure = str(error)
        _log.warning("native CPU kernels unavailable, running eager kernels: %s", error)
    return _library


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether the native kernels can take these tensors: the library loads and every
    tensor given is on the CPU, every float one float32 (``None`` entries are skipped).
    The kernels read contiguous memory: the wrappers below make their inputs so."""
    for tensor in tensors:
        if tensor is None:
            continue
        if tensor.device.type != "cpu":
            return False
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            return False
    return load() is not None


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _call(name: str, *args: object) -> None:
    library = load()
    assert library is not None, "call usable() first"
    getattr(library, name)(*args)


def row_square_sums(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = sum_j x[i, j]^2`` for ``x`` ``(rows, cols)``, ``out`` ``(rows, 1)``."""
    x = x.contiguous()  # bound to a name: a temporary must outlive the call
    rows, cols = x.shape
    _call("row_square_sums", _ptr(x), _ptr(out), rows, cols, torch.get_num_threads())
    return out


def tail_forward(args: TailArgs) -> TailOutputs:
    """The tail's forward (see ``cpu_kernels.c``) as one loop, with the same operations
    in the same order as the eager kernel; where ``args.inv_rms`` is ``None`` with the
    norm, the inverse RMS is computed in the same pass; with ``args.overwrite``, ``y``
    is ``x`` (its contiguous copy, where it is not)."""
    x, inv_rms, residual = (
        None if t is None else t.contiguous() for t in (args.x, args.inv_rms, args.residual)
    )
    rows, cols = x.shape
    scale, dropout = args.scale, args.rate > 0
    # the kernel takes the gain with the dropout scale in it, and `scale` only without it
    gain = None if args.gain is None else (args.gain * scale).contiguous()
    row_hash, col_hash = (
        t.contiguous() if dropout else None for t in (args.row_hash, args.col_hash)
    )
    compute_rms = gain is not None and inv_rms is None
    if compute_rms:
        inv_rms = x.new_empty(rows, 1)
    y = x if args.overwrite else torch.empty_like(x)
    live = torch.empty_like(x, dtype=torch.uint8) if args.keep_mask else None
    _call(
        "tail_forward",
        _ptr(x),
        _ptr(inv_rms),
        int(compute_rms),
        float(args.width),
        args.eps,
        _ptr(gain),
        scale,
        int(args.relu),
        _ptr(residual),
        _ptr(row_hash),
        _ptr(col_hash),
        keep_threshold(args.rate) if dropout else 0,
        _ptr(y),
        _ptr(live),
        rows,
        cols,
        torch.get_num_threads(),
    )
    return TailOutputs(y, live, inv_rms)


def tail_backward(
    args: TailGradArgs,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The tail's backward as one loop: gradients of ``x``, of the square sums and of the
    gain (the last two ``None`` without the norm), as the eager kernel's."""
    if args.inv_rms is None:
        return _masked_grad(args.grad, args.live, args.scale if args.rate > 0 else 1.0), None, None
    # the dropout scale enters as part of the gain; its gradient is the gain's times scale
    grad_x, grad_square_sum, grad_scaled_gain = _norm_backward(args, args.gain * args.scale)
    return grad_x, grad_square_sum, grad_scaled_gain * args.scale


def _norm_backward(
    args: TailGradArgs, gain: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :math:`y = (\\mathrm{live} \\odot x\\, r) \\odot \\gamma` with
    :math:`r = (s / d + \\epsilon)^{-1/2}` and :math:`\\gamma` ``gain``: of ``x``, of the
    square sums ``s`` and of the gain."""
    grad, x, inv_rms, gain = (t.contiguous() for t in (args.grad, args.x, args.inv_rms, gain))
    live = None if args.live is None else args.live.contiguous()
    rows, cols = grad.shape
    threads = torch.get_num_threads()
    grad_x = torch.empty_like(grad)
    grad_square_sum = torch.empty_like(inv_rms)
    gain_partials = grad.new_zeros(threads, cols)
    _call(
        "norm_backward",
        _ptr(grad),
        _ptr(live),
        _ptr(x),
        _ptr(inv_rms),
        _ptr(gain),
        float(args.width),
        _ptr(grad_square_sum),
        _ptr(gain_partials),
        _ptr(grad_x),
        int(args.finish),
        rows,
        cols,
        threads,
    )
    return grad_x, grad_square_sum, gain_partials.sum(dim=0)


def _masked_grad(grad: torch.Tensor, live: torch.Tensor, scale: float) -> torch.Tensor:
    """``grad * live * scale`` (the tail's backward without the norm)."""
    grad, live = grad.contiguous(), live.contiguous()
    rows, cols = grad.shape
    grad_x = torch.empty_like(grad)
    _call(
        "masked_grad",
        _ptr(grad),
        _ptr(live),
        scale,
        _ptr(grad_x),
        rows,
        cols,
        torch.get_num_threads(),
    )
    return grad_x


def add_row_scaled(grad_x: torch.Tensor, x: torch.Tensor, row_grad: torch.Tensor) -> torch.Tensor:
    """``grad_x += 2 x row_grad`` in place (``grad_x`` contiguous; ``row_grad`` ``(rows, 1)``)."""
    x, row_grad = x.contiguous(), row_grad.contiguous()
    rows, cols = grad_x.shape
    _call(
        "add_row_scaled",
        _ptr(grad_x),
        _ptr(x),
        _ptr(row_grad),
        rows,
        cols,
        torch.get_num_threads(),
    )
    return grad_x


def _csr_arrays(
    name: str, arrays: tuple[torch.Tensor | None, ...], start: int, stop: int
) -> tuple[torch.Tensor | None, ...]:
    """A block's ``(indptr, indices, row_scale, col_scale)`` as the CSR kernels read them
    (contiguous; arrays already so, as a block's are, are not copied; scales ``None``
    both, or neither), after refusing index arrays they cannot read or rows outside the
    block."""
    indptr, indices, row_scale, col_scale = arrays
    if indptr.dtype != torch.int64 or indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{name}: indptr int64 and indices int32/int64, got {indptr.dtype} and {indices.dtype}"
        )
    if not 0 <= start <= stop < indptr.numel():
        raise IndexError(f"{name}: rows [{start}, {stop}) of {indptr.numel() - 1}")
    if (row_scale is None) != (col_scale is None):
        raise ValueError(f"{name}: both scales, or neither (all ones)")
    return tuple(None if t is None else t.contiguous() for t in arrays)


def csr_scaled_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    x: torch.Tensor,
    start: int,
    stop: int,
) -> torch.Tensor:
    """Rows ``[start, stop)`` of a CSR block whose entry :math:`(i, j)` is
    :math:`r_i c_j` (``indptr`` int64, ``indices`` int32 or int64, ``row_scale`` :math:`r`,
    ``col_scale`` :math:`c`, ``None`` both where they are all ones) times ``x``
    ``(num_cols, D)``: ``(stop - start, D)``, :math:`r_i \\sum_j c_j x_j` row by row,
    without a value array or a CSR copy. ``x`` is read in place where its rows are
    contiguous, as those of a column slice are; the kernel may read past a row's last
    column, never past ``x``'s storage."""
    # bound to names: a copy made here must outlive the call
    indptr, indices, row_scale, col_scale = _csr_arrays(
        "csr_scaled_rows", (indptr, indices, row_scale, col_scale), start, stop
    )
    if x.stride(1) != 1 or x.stride(0) < x.shape[1]:
        x = x.contiguous()
    readable = x.untyped_storage().nbytes() // x.element_size() - x.storage_offset()
    out = x.new_empty(stop - start, x.shape[1])
    _call(
        "csr_scaled_rows",
        _ptr(indptr),
        _ptr(indices),
        int(indices.dtype == torch.int64),
        _ptr(row_scale),
        _ptr(col_scale),
        _ptr(x),
        x.stride(0),
        readable,
        _ptr(out),
        start,
        stop,
        x.shape[1],
        torch.get_num_threads(),
    )
    return out


def csr_row_sums(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    start: int,
    stop: int,
) -> torch.Tensor:
    """:func:`csr_scaled_rows` of a column of ones, ``(stop - start, 1)``, the same sums
    in the same order without reading a ``(num_cols, 1)`` operand:
    :math:`r_i \\sum_j c_j` (a SAGE layer's neighbour count); with the scales ``None``
    (all ones), the rows' entry counts."""
    indptr, indices, row_scale, col_scale = _csr_arrays(
        "csr_row_sums", (indptr, indices, row_scale, col_scale), start, stop
    )
    out = torch.empty(stop - start, 1, dtype=torch.float32)
    _call(
        "csr_row_sums",
        _ptr(indptr),
        _ptr(indices),
        int(indices.dtype == torch.int64),
        _ptr(row_scale),
        _ptr(col_scale),
        _ptr(out),
        start,
        stop,
        torch.get_num_threads(),
    )
    return out


def pread_runs(
    fd: int,
    base: int,
    row_bytes: int,
    starts: np.ndarray,
    counts: np.ndarray | None,
    out: np.ndarray,
) -> None:
    """Runs of rows of an open file into ``out`` (contiguous, packed), one ``pread`` a run:
    run ``i`` is ``counts[i]`` rows (one without ``counts``) of ``row_bytes`` from row
    ``starts[i]`` of the array at byte ``base``. Natively where the library loads, else a
    Python loop of the same reads (about 1.5 us a run against 0.7)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    counts = None if counts is None else np.ascontiguousarray(counts, dtype=np.int64)
    if not out.flags.c_contiguous:
        raise ValueError("pread_runs: out must be contiguous")
    library = load()
    if library is not None:
        read = library.pread_runs(
            fd,
            base,
            row_bytes,
            starts.ctypes.data,
            None if counts is None else counts.ctypes.data,
            starts.size,
            out.ctypes.data,
        )
        if read < 0:
            error = ctypes.get_errno() or errno.EIO
            raise OSError(error, f"reading rows of a prepared file: {os.strerror(error)}")
        return
    view = memoryview(out).cast("B")
    position = 0
    lengths = [1] * starts.size if counts is None else counts.tolist()
    for start, count in zip(starts.tolist(), lengths):
        end, offset = position + count * row_bytes, base + start * row_bytes
        while position < end:
            got = os.preadv(fd, [view[position:end]], offset)
            if got <= 0:
                raise OSError(errno.EIO, "reading rows of a prepared file: the file is short")
            position, offset = position + got, offset + got
