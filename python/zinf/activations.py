# SPDX-License-Identifier: Apache-2.0
"""Activation offload for torch autograd (zinf.torch.offload_activations).

Inside ``with offload_activations(...)``, every tensor autograd saves for backward that is
large enough (``min_bytes``) goes to zinf's ActivationStore (pinned memory or NVMe) when it is
saved, and comes back when backward unpacks it, read ahead in reverse order on the NVMe tier.
Built on ``torch.autograd.graph.saved_tensors_hooks`` (torch >= 1.13). What stays in memory:
tensors below the threshold, parameters and other leaves that require grad (they are alive
anyway, so offloading them would free nothing), non-CPU tensors (the device path is not built
yet) and tensors that are not contiguous. A tensor saved twice (the same memory, shape and
dtype, while the first is alive, as when two operations save the same input) goes to the store
once and is read back once. Inputs that ``torch.utils.checkpoint`` keeps for its recomputation are saved tensors too,
so checkpointed blocks send their inputs to the store.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Union
import weakref

import torch

from zinf import _native
from zinf.pinned import AioSettings, NvmePaths, fs_paths, int_arg, io_options


class _Saved:
    """One tensor in the store, shared by every pack that saved the same memory."""

    __slots__ = ("handle", "shape", "dtype", "nbytes", "unpacks", "tensor", "source",
                 "__weakref__")

    def __init__(self, handle, shape, dtype, nbytes, source):
        self.handle = handle
        # The tensor saved (weakly): an address means the same memory only while it lives,
        # since the allocator hands freed memory to the next tensor of that size.
        self.source = weakref.ref(source)
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes
        self.unpacks = 0      # unpacks done; the tensor is loaded on the first
        self.tensor = None    # the loaded tensor, kept for later unpacks of the same save


class ActivationStore:
    """Where offloaded activations wait for backward.

    ``tier``: "cpu" (pinned host memory, at most ``pinned_budget_bytes`` held; a tensor past it
    stays in memory) or "nvme" (swap files in ``nvme_path``, a directory or a list of them, at
    most ``capacity_bytes`` at once, staged through ``pinned_budget_bytes``). ``prefetch_depth``
    tensors are read back ahead of backward on the NVMe tier. Usable across iterations; one
    ``offload_activations`` block at a time.
    """

    def __init__(self, tier: str = "cpu", nvme_path: NvmePaths = None,
                 capacity_bytes: int = 16 << 30, pinned_budget_bytes: int = 256 << 20,
                 prefetch_depth: int = 2, checksums: bool = True,
                 aio: AioSettings = None) -> None:
        if tier not in ("cpu", "nvme"):
            raise ValueError(f"ActivationStore: tier {tier!r}: expected 'cpu' or 'nvme'")
        dirs = []
        if tier == "nvme":
            if nvme_path is None:
                raise ValueError("ActivationStore: tier 'nvme' needs nvme_path")
            dirs = fs_paths(nvme_path, "nvme_path")
        self.tier = tier
        self.pinned_budget_bytes = int_arg(pinned_budget_bytes, "pinned_budget_bytes")
        self._native = _native.ActivationStore(tier, dirs,
                                               int_arg(capacity_bytes, "capacity_bytes"),
                                               self.pinned_budget_bytes,
                                               int_arg(prefetch_depth, "prefetch_depth",
                                                       0, (1 << 32) - 1),
                                               bool(checksums), io_options(aio))

    def stats(self):
        """Counters: saved, loaded, bytes_saved, bytes_written, bytes_read, hits, on_demand,
        held_tensors, held_bytes, pinned_bytes_peak."""
        return self._native.stats()

    def clear(self):
        """Forgets every tensor not loaded back (an iteration cut short)."""
        self._native.clear()


@contextlib.contextmanager
def offload_activations(store: Optional[ActivationStore] = None, min_bytes: int = 1 << 20,
                        **store_options: Any) -> Iterator[ActivationStore]:
    """Sends the tensors autograd saves inside the block to ``store`` (an ActivationStore, or
    one made from ``store_options``) and brings them back in backward.

    ``min_bytes``: smaller tensors stay in memory (the copy would cost more than it frees).
    Yields the store; its ``stats()`` tell what moved. Backward may run after the block ends.
    """
    if store is None:
        store = ActivationStore(**store_options)
    elif store_options:
        raise ValueError("offload_activations: give a store or its options, not both")
    # The same memory saved twice maps to one _Saved (weakly: forgotten with its packs).
    by_memory: "weakref.WeakValueDictionary[Any, Any]" = weakref.WeakValueDictionary()
    cpu_full = [False]

    def pack(t):
        if (t.device.type != "cpu" or not t.is_contiguous()
                or (t.is_leaf and t.requires_grad) or isinstance(t, torch.nn.Parameter)):
            return t
        nbytes = t.numel() * t.element_size()
        if nbytes < min_bytes:
            return t
        key = (t.data_ptr(), nbytes, t.dtype, tuple(t.shape))
        saved = by_memory.get(key)
        if saved is not None and saved.source() is not None:
            return saved
        if cpu_full[0] and store.tier == "cpu":
            return t
        try:
            handle = store._native.save(f"{tuple(t.shape)}:{t.dtype}", t.data_ptr(), nbytes)
        except ValueError:
            if store.tier != "cpu":
                raise
            # The pinned budget is full: this and later tensors of the block stay in memory.
            cpu_full[0] = True
            return t
        saved = _Saved(handle, t.shape, t.dtype, nbytes, t)
        by_memory[key] = saved
        return saved

    def unpack(x):
        if not isinstance(x, _Saved):
            return x
        if x.tensor is None:
            x.tensor = torch.empty(x.shape, dtype=x.dtype)
            store._native.load(x.handle, x.tensor.data_ptr(), x.nbytes)
        x.unpacks += 1
        return x.tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield store
