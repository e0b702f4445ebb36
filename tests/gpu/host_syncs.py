"""Count the calls that make the host wait for an accelerator, on CPU tensors.

On CUDA, reading a value back (``.item()``, ``int(t)``, ``.tolist()``) or running an
operator whose output size depends on the data (``nonzero``, ``bincount``, ``unique``,
``masked_select``, boolean indexing, ``repeat_interleave`` without ``output_size``)
synchronises the host with the device. The same calls on CPU tensors are free but can
be counted: a dispatch mode sees the ATen operators and a function mode sees
``Tensor.tolist`` (which reads the data without an operator).

Example
-------
>>> import torch
>>> with HostSyncCounter() as syncs:
...     n = int(torch.arange(5).sum())
...     ids = torch.nonzero(torch.arange(5) > 2)
>>> syncs.total, sorted(syncs.calls)
(2, ['_local_scalar_dense', 'nonzero'])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter"]

aten = torch.ops.aten
# Operators whose output size (or value, for _local_scalar_dense) the host must read.
_DATA_DEPENDENT = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.bincount.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
}


def _waits_for_device(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in _DATA_DEPENDENT:
        return True
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None and len(args) < 2
    if func is aten.index.Tensor:  # boolean-mask indexing is a nonzero in disguise
        return any(i is not None and i.dtype == torch.bool for i in args[1])
    return False


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, calls: Counter, host_resident: set[int]) -> None:
        super().__init__()
        self.calls = calls
        self.host_resident = host_resident

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and args[0].data_ptr() in self.host_resident:
            return func(*args, **kwargs)
        if _waits_for_device(func, args, kwargs):
            self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **kwargs)


class _TolistCounter(TorchFunctionMode):
    def __init__(self, calls: Counter) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            self.calls["tolist"] += 1
        return func(*args, **(kwargs or {}))


class HostSyncCounter:
    """Context manager; ``calls`` counts each kind of host-synchronising call.

    ``host_resident`` are tensors that stay on the host on a GPU run too (Adam's step
    counters, kept on the CPU unless ``capturable``): reading them is not counted.
    """

    def __init__(self, host_resident: Iterable[torch.Tensor] = ()) -> None:
        self.calls: Counter = Counter()
        resident = {tensor.data_ptr() for tensor in host_resident}
        self._modes = (_TolistCounter(self.calls), _DispatchCounter(self.calls, resident))

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __enter__(self) -> HostSyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
