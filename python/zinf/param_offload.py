# SPDX-License-Identifier: Apache-2.0
"""Layer-wise parameter offload for torch modules (zinf.torch.offload_parameters).

Each unit's parameters (one flat byte record per unit) live on NVMe (a prefetch::LayerStore,
the store OffloadEngine's nvme parameter tier runs on: read ahead in the order traced on the
first iteration, onto the CUDA device on torch's stream, or onto the host) or in zinf's
pinned pool, and are brought into the module only while the unit computes: a forward
pre-hook fetches them, a forward hook releases them (``.data`` becomes an empty tensor), an
autograd function on the unit's outputs fetches them again when backward reaches the unit,
and one on its inputs releases them once the unit's backward is done. The optimizer's step
goes through ``ParameterOffload.step(optimizer)``, which brings each unit in, updates it and
writes the new values back to the store.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterable, List, Optional, Type, Union

import torch

from zinf import _native
from zinf.pinned import AioSettings, NvmePaths, fs_paths, io_options, pinned_empty

_SLOT_ALIGN = 64  # every parameter's bytes start on a 64-byte boundary of its unit's record


def _tensors_in(obj):
    """The tensors of a module's inputs or outputs (a tensor, or tuples/lists of them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _tensors_in(x)]
    return []


def _replace_tensors(obj, new, it=None):
    """`obj` with its tensors replaced, in _tensors_in order, by those of `new`."""
    it = iter(new) if it is None else it
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_replace_tensors(x, None, it) for x in obj)
    return obj


def _wrap(fn, offload, unit, obj):
    """Routes the tensors of `obj` that need a gradient through autograd function `fn`."""
    tensors = _tensors_in(obj)
    want = [t.requires_grad for t in tensors]
    if not any(want):
        return obj
    routed = iter(fn.apply(offload, unit, *[t for t, w in zip(tensors, want) if w]))
    return _replace_tensors(obj, [next(routed) if w else t for t, w in zip(tensors, want)])


class _FetchForBackward(torch.autograd.Function):
    """Identity on a unit's outputs; its backward runs before the unit's own backward and
    brings the unit's parameters back."""

    @staticmethod
    def forward(ctx, offload, unit, *tensors):
        ctx.offload, ctx.unit = offload, unit
        # detach(): the same memory, but not a view in autograd's sense, so that the caller
        # may modify the result in place (a view made in a custom Function may not be).
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.offload._fetch(ctx.unit)
        return (None, None) + grads


class _ReleaseAfterBackward(torch.autograd.Function):
    """Identity on a unit's inputs; its backward runs once the unit's backward has produced
    the gradients of its inputs (and, before that, of its parameters: the engine runs the
    nodes made inside the unit first) and releases the unit's parameters."""

    @staticmethod
    def forward(ctx, offload, unit, *tensors):
        ctx.offload, ctx.unit = offload, unit
        # detach(): the same memory, but not a view in autograd's sense, so that the caller
        # may modify the result in place (a view made in a custom Function may not be).
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.offload._release(ctx.unit)
        return (None, None) + grads


def _outside_compiled_graphs(fn):
    """`fn`, run by torch.compile's graphs as an ordinary Python call (torch.compiler.disable,
    torch >= 2.1): the hooks swap a parameter's tensor (``p.data``) between its fetched record
    and an empty one, which a traced graph would capture as one tensor (AOTAutograd then
    fails its backward on a changed version, inductor on a shape). Outside the graphs they run
    as in eager mode, and each unit's computation between them is compiled."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return fn if disable is None else disable(fn)


def _refuse_ties_outside_units(model, units, in_unit):
    """ValueError naming both modules when a parameter of a unit (ids in `in_unit`) is also a
    parameter of a module outside every unit (a weight tied to the embedding or the head):
    the unit's parameters are released between its uses, and the module outside would then
    compute with an empty tensor (torch's shape error in forward)."""
    inside = {id(m) for u in units for m in u.modules()}
    names = {}  # id(param) -> its name under the unit
    for name, m in model.named_modules():
        if id(m) in inside:
            for pname, p in m.named_parameters(recurse=False):
                names.setdefault(id(p), f"{name}.{pname}" if name else pname)
    for name, m in model.named_modules():
        if id(m) in inside:
            continue
        for pname, p in m.named_parameters(recurse=False):
            if id(p) in in_unit:
                outside = f"{name}.{pname}" if name else pname
                raise ValueError(f"zinf: {outside!r} (in {type(m).__name__} {name!r}, outside "
                                 f"every unit) is tied to {names.get(id(p), '?')!r} of unit "
                                 f"{in_unit[id(p)]}: a unit's parameters are released between "
                                 "its uses; untie them, or make the module a unit too")


def _nvme_dirs(nvme_path):
    return fs_paths(nvme_path, "nvme_path")


class ParameterOffload:
    """The parameters of a model's units kept on NVMe or in pinned memory, fetched around each
    unit's forward and backward. Made by zinf.torch.offload_parameters (see its docstring)."""

    def __init__(self, model: torch.nn.Module, units: List[torch.nn.Module],
                 nvme_path: NvmePaths = None, device: str = "nvme",
                 prefetch_depth: int = 2, checksums: bool = True,
                 aio: AioSettings = None) -> None:
        self._removed = False
        io = io_options(aio)  # a bad setting fails before the model is touched
        if device not in ("nvme", "cpu"):
            raise ValueError(f"zinf: device must be 'nvme' or 'cpu', got {device!r}")
        if not isinstance(prefetch_depth, int) or prefetch_depth < 0:
            raise ValueError(f"zinf: prefetch_depth must be an int >= 0, got {prefetch_depth!r}")
        if device == "nvme" and not nvme_path:
            raise ValueError("zinf: device='nvme' needs nvme_path (a directory, or a list)")
        if not units:
            raise ValueError("zinf: offload_parameters found no unit in the model")
        self.model = model
        self.units = list(units)
        self.device = device
        self.prefetch_depth = prefetch_depth
        seen: Dict[int, Any] = {}
        self._layout = []  # per unit: [(param, offset, nbytes, shape)]
        self._unit_bytes = []
        exec_device = None
        for u, m in enumerate(self.units):
            slots, offset = [], 0
            for p in m.parameters():
                if id(p) in seen:
                    raise ValueError(f"zinf: a parameter of unit {u} ({type(m).__name__}) is "
                                     f"shared with unit {seen[id(p)]}; units must not share "
                                     "parameters")
                seen[id(p)] = u
                if exec_device is None:
                    exec_device = p.device
                elif p.device != exec_device:
                    raise ValueError(f"zinf: parameters on {exec_device} and {p.device}; move "
                                     "the model to one device before offload_parameters")
                nbytes = p.numel() * p.element_size()
                slots.append((p, offset, nbytes, p.shape))
                offset = (offset + nbytes + _SLOT_ALIGN - 1) // _SLOT_ALIGN * _SLOT_ALIGN
            if not slots:
                raise ValueError(f"zinf: unit {u} ({type(m).__name__}) has no parameters")
            self._layout.append(slots)
            self._unit_bytes.append(max(offset, 1))
        assert exec_device is not None  # every unit has a parameter (checked above)
        _refuse_ties_outside_units(model, self.units, seen)
        self.exec_device = exec_device
        self._resident = [True] * len(self.units)
        self._acquires = 0
        self._keep = False  # inside materialized(): nothing is released
        self.resident_peak_forward = 0
        self._store = None
        self._pinned = None
        # The store first: a bad path fails before the model is touched.
        self._stream = None  # CUDA: torch's stream, adopted by the store as its compute stream
        if device == "nvme":
            if exec_device.type == "cuda":
                index = exec_device.index
                if index is None:
                    index = torch.cuda.current_device()
                self._stream = torch.cuda.current_stream(index)
                self._store = _native.LayerStore(
                    self._unit_bytes, _nvme_dirs(nvme_path), prefetch_depth, bool(checksums),
                    io, device="cuda", device_index=index, stream=self._stream.cuda_stream)
            elif exec_device.type == "cpu":
                self._store = _native.LayerStore(self._unit_bytes, _nvme_dirs(nvme_path),
                                                 prefetch_depth, bool(checksums), io)
            else:
                raise ValueError(f"zinf: device='nvme' runs on CPU or CUDA parameters, not "
                                 f"{exec_device}")
        else:
            self._pinned = [pinned_empty(n, torch.uint8) for n in self._unit_bytes]
        for u in range(len(self.units)):
            self._write_back(u)
            self._release(u)
        self._handles = []
        for u, m in enumerate(self.units):
            self._handles.append(m.register_forward_pre_hook(
                lambda mod, args, u=u: self._before_forward(u, args)))
            self._handles.append(m.register_forward_hook(
                lambda mod, args, out, u=u: self._after_forward(u, out)))

    # ---- the hooks --------------------------------------------------------------------------

    @_outside_compiled_graphs
    def _before_forward(self, u, args):
        self._fetch(u)
        self.resident_peak_forward = max(self.resident_peak_forward, len(self.resident_units()))
        if torch.is_grad_enabled() and not self._keep:
            return _wrap(_ReleaseAfterBackward, self, u, args)
        return None

    @_outside_compiled_graphs
    def _after_forward(self, u, out):
        if not self._keep:
            self._release(u)
        if torch.is_grad_enabled() and not self._keep:
            return _wrap(_FetchForBackward, self, u, out)
        return None

    # ---- fetch, release, write back ---------------------------------------------------------

    def _fetch(self, u, traced=True):
        if self._resident[u]:
            return
        self._acquires += 1
        n = self._unit_bytes[u]
        if self._store is not None:
            record = self._fetch_record(u, n, traced)
        elif self.exec_device.type == "cpu":
            record = self._pinned[u].clone()
        else:
            record = self._pinned[u].to(self.exec_device, non_blocking=True)
        with torch.no_grad():
            for p, offset, nbytes, shape in self._layout[u]:
                p.data = record[offset:offset + nbytes].view(p.dtype).view(shape)
                if not traced:
                    # materialized() and remove(): each parameter its own storage, so that
                    # torch.save of the model's state_dict writes each one's bytes alone (a
                    # view writes its unit's whole record, and a unit mixing dtypes cannot be
                    # saved at all: torch refuses one storage viewed as two types).
                    p.data = p.data.clone()
        self._resident[u] = True

    def _fetch_record(self, u, n, traced):
        """Unit u's bytes in a new tensor on the execution device. Traced: the store copies
        the unit from its read-ahead window into the tensor on the compute stream (CUDA:
        torch's stream, no host copy). Untraced (materialized()): read from the store into
        host memory, then copied over."""
        if not traced:
            host = torch.empty(n, dtype=torch.uint8,
                               pin_memory=self.exec_device.type == "cuda")
            self._store.read(u, host.data_ptr(), n)
            return host.to(self.exec_device, non_blocking=True)
        record = torch.empty(n, dtype=torch.uint8, device=self.exec_device)
        if self._stream is None:
            self._store.fetch_into(u, record.data_ptr(), n)
            return record
        current = torch.cuda.current_stream(self._stream.device)
        if current != self._stream:
            # The tensor was allocated on the caller's stream: the copy on the adopted stream
            # waits for what that stream did before, and the caller's stream waits for the copy.
            self._stream.wait_stream(current)
            self._store.fetch_into(u, record.data_ptr(), n)
            current.wait_stream(self._stream)
            record.record_stream(self._stream)
        else:
            self._store.fetch_into(u, record.data_ptr(), n)
        return record

    def _release(self, u):
        if not self._resident[u] or self._keep:
            return
        with torch.no_grad():
            for p, _, _, _ in self._layout[u]:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._resident[u] = False

    def _write_back(self, u):
        """Stores unit u's current parameter values (it must be resident)."""
        n = self._unit_bytes[u]
        record = torch.zeros(n, dtype=torch.uint8)
        with torch.no_grad():
            for p, offset, nbytes, shape in self._layout[u]:
                record[offset:offset + nbytes].view(p.dtype).view(shape).copy_(p.data)
        if self._store is not None:
            self._store.write(u, record.data_ptr(), n)
        else:
            self._pinned[u].copy_(record)

    # ---- the public side --------------------------------------------------------------------

    def resident_units(self):
        """Indices of the units whose parameters are in the module now."""
        return [u for u, r in enumerate(self._resident) if r]

    def io_settings(self):
        """device='nvme': the store's I/O engine and settings (engine, block_size,
        queue_depth, threads), as the ``aio`` argument set them."""
        if self._store is None:
            raise ValueError("zinf: io_settings() is for device='nvme'")
        return self._store.io()

    def stats(self):
        """Fetch counters. nvme: the prefetcher's ``acquires``, ``hits`` (read ahead before
        they were needed), ``on_demand``, ``retraces`` (order changes), ``bytes_read``,
        ``read_busy_seconds`` (time with a read in flight), ``acquire_blocked_seconds``,
        ``stall_seconds`` (the compute stream waiting for a unit), ``bytes_written``; and the
        device's: ``fetches`` (traced fetches), ``bytes_to_device`` (host -> device copies:
        one per unit read into the window), ``bytes_on_device`` (window -> the parameters'
        tensor, one per fetch), ``pageable_copies`` (0: every host copy is from pinned
        staging), ``device`` ("cuda" or "host"). cpu: ``acquires`` (each a copy from pinned
        memory on demand)."""
        if self._store is not None:
            return self._store.stats()
        return {"acquires": self._acquires, "hits": 0, "on_demand": self._acquires,
                "retraces": 0}

    def end_iteration(self):
        """Ends an iteration of the traced order (step() does it; call it in loops without a
        step, e.g. evaluation, so that their order is traced as its own iteration)."""
        if self._store is not None:
            self._store.end_iteration()

    def materialized(self, write_back=True):
        """Every unit's parameters in the module for the block (e.g. to build a state='nvme'
        optimizer, read or load a state_dict); on exit they are written back to the store
        (unless write_back=False) and released. Its reads are not part of the traced order
        (they do not happen every iteration)."""
        self._check_not_removed("materialized")
        return self._materialized(write_back, traced=False)

    def _check_not_removed(self, what):
        if self._removed:
            raise ValueError(f"zinf: {what}() after remove(): the parameters are back in the "
                             "module for good; step the optimizer directly")

    @contextlib.contextmanager
    def _materialized(self, write_back, traced):
        for u in range(len(self.units)):
            self._fetch(u, traced)
        self._keep = True
        try:
            yield self
        finally:
            self._keep = False
            for u in range(len(self.units)):
                if write_back:
                    self._write_back(u)
                self._release(u)

    def step(self, optimizer, closure=None):
        """Runs ``optimizer.step()`` over the offloaded model and writes the updated values
        back to the store, then ends the iteration of the traced order.

        An optimizer that updates each parameter on its own (torch.optim.*, zinf.torch
        Adam/AdamW with state='cpu') steps one unit at a time: the unit is fetched, updated
        and written back before the next, so one unit is in the module at a time; the
        parameters outside every unit step first. zinf.torch Adam/AdamW with state='nvme'
        runs one pipelined step over all parameters, so every unit is fetched for it."""
        self._check_not_removed("step")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        offloaded = getattr(optimizer, "_offloaded", None) is not None
        if offloaded:
            if getattr(optimizer, "_overlap", False):
                raise ValueError("zinf: offload_parameters with overlap=True: the updates "
                                 "would start during backward into released parameters")
            with self._materialized(True, traced=True):  # every step: part of the order
                optimizer.step()
        else:
            self._step_by_unit(optimizer)
        self.end_iteration()
        return loss

    def _step_by_unit(self, optimizer):
        in_unit = {id(s[0]) for slots in self._layout for s in slots}
        groups = optimizer.param_groups
        saved = [g["params"] for g in groups]
        batches = [(None, {id(p) for ps in saved for p in ps if id(p) not in in_unit})]
        batches += [(u, {id(s[0]) for s in slots}) for u, slots in enumerate(self._layout)]
        try:
            for u, ids in batches:
                if not any(id(p) in ids for ps in saved for p in ps):
                    continue
                for g, ps in zip(groups, saved):
                    g["params"] = [p for p in ps if id(p) in ids]
                if u is not None:
                    self._fetch(u)
                optimizer.step()
                if u is not None:
                    self._write_back(u)
                    self._release(u)
        finally:
            for g, ps in zip(groups, saved):
                g["params"] = ps

    def remove(self):
        """Brings every unit back into the module for good and removes the hooks; step() and
        materialized() are ValueErrors afterwards, a second remove() does nothing."""
        if self._removed:
            return
        self._removed = True
        for h in self._handles:
            h.remove()
        self._handles = []
        for u in range(len(self.units)):
            self._fetch(u, traced=False)  # no iteration follows; each parameter its own storage
        self._store = None
        self._pinned = None


def offload_parameters(model: torch.nn.Module,
                       unit: Union[Type[torch.nn.Module], Iterable[torch.nn.Module]],
                       nvme_path: NvmePaths = None, device: str = "nvme",
                       prefetch_depth: int = 2, checksums: bool = True,
                       aio: AioSettings = None) -> ParameterOffload:
    """Keeps the parameters of `model`'s units on NVMe (``device="nvme"``, swap files under
    ``nvme_path``: a directory, or a list to stripe over) or in zinf's pinned memory
    (``device="cpu"``) and brings each unit's parameters in only while it computes.

    ``unit``: a module class (every outermost submodule of that class is a unit, e.g. the
    transformer block) or a list of submodules. Parameters outside every unit (embeddings,
    the head) stay where they are. The model must be on its execution device (CPU, or CUDA)
    before the call; the values are stored then and each unit's parameters become empty
    tensors until fetched.

    With ``device="nvme"`` the reads go ``prefetch_depth`` units ahead of the compute in the
    order traced on the first iteration (forward, backward and the step's fetches); an order
    that changes is fetched on demand for the rest of that iteration and traced anew.
    ``aio``: the store's I/O settings, a ds_config's ``"aio"`` block as a dict or the path of a
    ds_config file (None: the library's defaults); ``io_settings()`` tells what it took.

    Returns a :class:`ParameterOffload`: step the optimizer with ``offload.step(optimizer)``
    (it writes the updated values back), and use ``with offload.materialized():`` for
    anything that needs every parameter at once (building a state='nvme' optimizer,
    ``model.state_dict()``). Raises zinf.IoError naming the directory when the store cannot
    be made there, before the model is changed. ``torch.compile`` may be applied before or
    after (torch >= 2.1): the hooks run outside the compiled graphs.
    """
    if isinstance(unit, type):
        found: List[torch.nn.Module] = []
        for m in model.modules():
            if isinstance(m, unit) and not any(m in set(f.modules()) for f in found):
                found.append(m)
        units = found
    else:
        units = list(unit)
        inside = set(model.modules())
        for m in units:
            if m not in inside:
                raise ValueError(f"zinf: unit {type(m).__name__} is not a submodule of the model")
        for i, m in enumerate(units):
            for j, other in enumerate(units):
                if i != j and m in set(other.modules()):
                    raise ValueError(f"zinf: unit {i} ({type(m).__name__}) lies inside unit "
                                     f"{j}; units must not nest")
    return ParameterOffload(model, units, nvme_path=nvme_path, device=device,
                            prefetch_depth=prefetch_depth, checksums=checksums, aio=aio)
