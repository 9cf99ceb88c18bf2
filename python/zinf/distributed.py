# SPDX-License-Identifier: Apache-2.0
"""zinf over torch.distributed: data-parallel Adam/AdamW in which each rank keeps 1/N of the
fp32 master weights and moments (ZeRO stage 1 or 2, as ``stage`` says, 2 by default as
DeepSpeed's ZeRO-Offload; zinf::dist::ShardedOptimizer).

    torch.distributed.init_process_group("gloo")        # torchrun sets RANK, WORLD_SIZE, ...
    opt = zinf.distributed.ShardedAdamW(model.parameters(), lr=1e-3)
    loss.backward()                                     # this rank's gradients, not averaged
    opt.step()                                          # averages, updates 1/N, all-gathers
    opt.last_step_stats["allgather_bytes"]              # what the step's collectives moved

The collectives go through a process group of torch.distributed on CPU tensors (gloo, or mpi):
zinf's callback adapter calls back into Python with its buffers (DLPack capsules that
torch.utils.dlpack.from_dlpack wraps without a copy), and emulates what gloo lacks in torch
1.13 (reduce-scatter, an averaging all-reduce). NCCL groups and device tensors do not go
through this path (see docs/distributed.md).
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.utils.dlpack import from_dlpack

from zinf import _native
from zinf.pinned import AioSettings, NvmePaths, fs_path, fs_paths, int_arg, io_options
from zinf.torch import (Params, address_of, budget_error_in_python_terms,
                        check_adam_arguments, dtype_name, sub_group_and_record)

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _tensor(capsule):
    # zinf's buffer as a tensor without a copy (a DLPack capsule: see python/src/dist.cc for
    # why not a memoryview). It must not outlive the callback.
    return from_dlpack(capsule)


class _TorchGroup:
    """The callbacks of zinf's adapter over one process group. Each blocks until its result is
    in place (torch.distributed's synchronous calls); what torch raises (a timeout, a peer gone)
    fails the collective."""

    def __init__(self, group):
        self.group = group

    def all_gather(self, send, recv):
        send = _tensor(send)
        n = send.numel()
        if n == 0:
            return  # every rank has the same block size: nothing moves anywhere
        # gloo's all_gather writes each rank's block into the list's tensors: views of recv,
        # so the result lands in zinf's buffer without a copy of our own.
        dist.all_gather(list(_tensor(recv).split(n)), send, group=self.group)

    def all_reduce(self, data, dtype, op):
        data = _tensor(data)
        if data.numel() == 0:
            return
        if op not in _OPS:
            # The adapter on host memory sums and divides itself; an "avg" here is a bug.
            raise ValueError(f"zinf: all_reduce with op {op!r} (sum, max or min expected)")
        dist.all_reduce(data, op=_OPS[op], group=self.group)

    def broadcast(self, data, root):
        data = _tensor(data)
        if data.numel() == 0:
            return
        dist.broadcast(data, src=_global_rank(self.group, root), group=self.group)

    def barrier(self):
        dist.barrier(group=self.group)


def _global_rank(group, rank):
    # torch.distributed.broadcast takes the source's rank in the default group.
    if group is None or group is dist.GroupMember.WORLD:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


def collectives(process_group: Any = None, name: Optional[str] = None) -> "_native.Collectives":
    """zinf's Collectives (``zinf._native.Collectives``: rank, size, name, and the calls on
    host addresses) over a torch.distributed process group: the default group when None.
    torch.distributed must be initialised, with a backend that works on CPU tensors (gloo,
    mpi): ValueError for nccl. Every rank must make it, as it makes the group; the result is
    what ShardedAdam uses. ``name`` (default: the backend's) appears in zinf's errors."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("zinf: torch.distributed is not initialised (call "
                         "torch.distributed.init_process_group first)")
    backend = str(dist.get_backend(process_group))
    if backend == "nccl":
        raise ValueError("zinf: a nccl process group works on device tensors, which zinf's "
                         "torch.distributed path does not take yet; give a gloo group "
                         "(torch.distributed.new_group(backend='gloo'))")
    g = _TorchGroup(process_group)
    return _native.callback_collectives(
        dist.get_rank(process_group), dist.get_world_size(process_group), name or backend,
        g.all_gather, g.all_reduce, g.broadcast, g.barrier)


def _shown(value):
    # A setting as its rank's message shows it: floats as Python writes them (0.001), tuples
    # of them alike; one line whatever it is.
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    try:
        text = repr(float(value))
    except (TypeError, ValueError):
        text = repr(value)
    return " ".join(text.split())


def _agree(comm, items):
    """Collective: refuses, on every rank with the same ValueError, ranks whose ``items``
    ((what, value) pairs) differ, naming the lowest such rank and its first difference from
    rank 0: "rank 1's parameter 3 has shape [4, 8], rank 0's [32]". One all-gather of a
    40-byte digest (SHA-256 and length) when they agree; a second one, of the descriptions
    themselves, only to name the difference."""
    world = comm.size
    if world == 1:
        return
    text = "\n".join(f"{what}\t{value}" for what, value in items).encode()
    head = hashlib.sha256(text).digest() + len(text).to_bytes(8, "little")
    heads = _all_gather_bytes(comm, head)
    if all(h == heads[0] for h in heads):
        return
    longest = max(int.from_bytes(h[32:], "little") for h in heads)
    texts = _all_gather_bytes(comm, text.ljust(longest, b"\0"))
    ours = texts[0].rstrip(b"\0").decode().split("\n")
    r = next(r for r in range(1, world) if heads[r] != heads[0])
    theirs = texts[r].rstrip(b"\0").decode().split("\n")
    # The counts (parameters, groups) come before what they count, so the first line that
    # differs is one both ranks have.
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)) - 1)
    what, value = theirs[i].split("\t", 1)
    ours_value = ours[i].split("\t", 1)[1]
    raise ValueError(f"zinf: the ranks built different sharded optimizers: rank {r}'s {what} "
                     f"{value}, rank 0's {ours_value} (every rank builds it over the same "
                     f"parameters and settings)")


def _all_gather_bytes(comm, data):
    # Every rank's `data` (the same length on each), in rank order.
    n = len(data)
    send = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    recv = torch.empty(n * comm.size, dtype=torch.uint8)
    comm.all_gather(send.data_ptr(), n, recv.data_ptr(), recv.numel())
    out = recv.numpy().tobytes()
    return [out[r * n:(r + 1) * n] for r in range(comm.size)]


class _ShardedAdamBase(torch.optim.Optimizer):
    """Adam/AdamW across the ranks of a torch.distributed process group, each rank keeping 1/N
    of every parameter's fp32 master weights and moments.

    Every rank builds it over the same parameters (the same shapes, the same initial values:
    rank 0's are broadcast at construction), and every rank calls ``step()`` together. Each
    parameter is one group of zinf::dist::ShardedOptimizer: padded to a multiple of N, rank r
    keeps elements [r s, (r + 1) s). A step averages the ranks' gradients (so do not average
    them first: DistributedDataParallel around the model would give the same values for
    twice the traffic), updates this rank's slice with zinf's CPU Adam, and all-gathers the
    updated slices into every rank's parameters.

    ``stage`` is DeepSpeed's zero_optimization.stage: 2 (the default) reduce-scatters the
    gradients, so each rank receives only its slice of the average; 1 all-reduces them (every
    rank receives the whole average, twice the bytes, and keeps its slice). Both keep the
    model's parameters whole on every rank, as torch holds them; 3, which partitions the
    parameters too, and 0, which keeps the whole optimizer state on every rank, are
    ValueError. ``last_step_stats`` has the step's ``allgather_bytes``,
    ``reduce_scatter_bytes`` and ``all_reduce_bytes`` (a ring's bytes into this rank). With
    the same gradient on every rank the result is bitwise that of zinf.torch.Adam(W) on one
    process; otherwise bitwise that of one process fed the average (where the average is
    exact in fp32).

    ``state="cpu"`` (default): this rank's slices of the masters and moments in zinf's pinned
    pool (``pinned_budget`` bytes at most; by default what they need). ``state="nvme"``: in
    swap files under ``nvme_path`` (a directory or a list), in its ``rank<R>`` subfolder
    (created; all ranks may share one path), streamed through ``pipeline_depth`` pinned
    buffers of ``sub_group_size`` elements, with ``checksums`` and ``state_precision`` as in
    zinf.torch.AdamW.

    Parameters must be float32 CPU tensors; gradients float32, bfloat16 or float16 (widened
    to float32 before the reduce-scatter). Every parameter must have a gradient at every
    step, on every rank (a rank that raises for a missing one leaves the others waiting in
    the collective until the process group's timeout). Per-group lr, betas, eps and
    weight_decay work, and changes between steps take effect at the next step.

    Errors: a collective that fails (a peer gone, torch.distributed's timeout, an exception
    in a callback) raises zinf.IoError on that rank naming the operation and the rank, and
    every later step raises too: the job must end (torch.distributed cannot resume a group
    after a peer is lost). Not supported: ``state_dict()`` / ``load_state_dict()`` (use
    ``save(dir)`` / ``load(dir)``), ``overlap=True``, amsgrad, sparse gradients, and
    torch.nn.utils.clip_grad_norm_ before step() (it would see this rank's gradients, not the
    average: pass ``step(clip=...)``).
    """

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, adamw, threads,
                 process_group=None, state="cpu", nvme_path=None, sub_group_size=None,
                 pipeline_depth=4, pinned_budget=None, checksums=True, state_precision="fp32",
                 aio=None, stage=2):
        # What this rank can check and set up alone (no collective runs there), then the
        # ranks' agreement, then the first collective that depends on it: the parameters'
        # broadcast. A rank whose arguments are refused, or whose setup fails (an nvme_path
        # missing on its node), takes part in the agreement all the same and then raises its
        # own error, so that the other ranks fail at once naming it instead of waiting in the
        # broadcast for the group's timeout.
        refused = None
        try:
            items = self._build(params, lr, betas, eps, weight_decay, amsgrad, adamw, threads,
                                process_group, state, nvme_path, sub_group_size,
                                pipeline_depth, pinned_budget, checksums, state_precision,
                                aio, stage)
            items.insert(0, ("arguments", "were accepted"))
        except Exception as e:  # told to the other ranks, then raised as it is
            if not (dist.is_available() and dist.is_initialized()):
                raise
            refused = e
            why = " ".join(f"{type(e).__name__}: {e}".split())  # one line
            items = [("arguments", f"were refused ({why})")]
        try:
            comm = self.__dict__.get("collectives") or collectives(process_group)
        except Exception:
            if refused is not None:
                raise refused from None
            raise
        try:
            # Ranks built over other parameters or settings are refused on every rank,
            # naming the first difference, instead of aborting inside gloo, waiting for the
            # group's timeout or training on silently with other updates.
            _agree(comm, items)
        except Exception:  # the ranks differ, or the agreement's collective failed
            if refused is not None:
                raise refused from None  # this rank's own error says more
            self._sharded = None  # this rank's folders go with it
            raise
        if refused is not None:
            raise refused
        self.reload_parameters()

    def _build(self, params, lr, betas, eps, weight_decay, amsgrad, adamw, threads,
               process_group, state, nvme_path, sub_group_size, pipeline_depth, pinned_budget,
               checksums, state_precision, aio, stage):
        # Returns what the ranks must agree on (_description).
        check_adam_arguments(lr, betas, eps, weight_decay, amsgrad, state, state_precision)
        if stage == 0 and not isinstance(stage, bool):
            raise ValueError("zinf: stage=0 keeps the whole optimizer state on every rank (plain "
                             "data parallelism), which the sharded optimizer does not offer; "
                             "give stage 1 or 2")
        if stage == 3:
            raise ValueError("zinf: stage=3 partitions the parameters too, but torch holds the "
                             "model's parameters whole on every rank; the sharded optimizer "
                             "runs stage 1 or 2")
        if isinstance(stage, bool) or stage not in (1, 2):
            raise ValueError(f"zinf: stage must be 1 or 2, got {stage!r}")
        io = io_options(aio)
        threads = int_arg(threads, "threads")
        pipeline_depth = int_arg(pipeline_depth, "pipeline_depth", 1, (1 << 32) - 1)
        if pinned_budget is not None:
            pinned_budget = int_arg(pinned_budget, "pinned_budget")
        if state_precision != "fp32" and state != "nvme":
            raise ValueError(f"zinf: state_precision={state_precision!r} is for state='nvme'")
        if state == "nvme" and not nvme_path:
            raise ValueError("zinf: state='nvme' needs nvme_path (a directory, or a list)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=True)
        super().__init__(params, defaults)
        self._adamw = adamw
        self.stage = int(stage)
        self._flat = [p for g in self.param_groups for p in g["params"]]
        for p in self._flat:
            self._check_param(p)
            if p.numel() == 0:
                raise ValueError("zinf: a parameter with no elements")
        sub_group_size, record = sub_group_and_record(sub_group_size, state_precision)
        self.collectives = collectives(process_group)
        world = self.collectives.size
        if pinned_budget is not None:
            budget = pinned_budget
        elif state == "nvme":
            budget = pipeline_depth * record
        else:
            # The whole slice state of every parameter, each sub-group padded as a record.
            budget = sum(math.ceil(math.ceil(p.numel() / world) / sub_group_size) * record
                         for p in self._flat)
        dirs = []
        if state == "nvme":
            dirs = fs_paths(nvme_path, "nvme_path")
        try:
            self._sharded = _native.ShardedOptimizer(
                [p.numel() for p in self._flat], self.collectives, state, dirs,
                int(sub_group_size), int(pipeline_depth), int(budget), int(threads),
                bool(checksums), str(state_precision), io, int(stage))
        except ValueError as e:
            raise budget_error_in_python_terms(e) from None
        self._index = {id(p): i for i, p in enumerate(self._flat)}
        self._hyper_given = [None] * len(self._flat)
        self.last_step_stats = None
        self.last_step_skipped = False
        return self._description(state, state_precision, sub_group_size)

    def _description(self, state, state_precision, sub_group_size):
        # What every rank must build alike, in order, as (what, value) pairs that read "rank
        # R's <what> <value>": whatever the ranks' updates or collectives depend on. Node-local
        # settings (nvme_path, threads, pipeline_depth, pinned_budget, aio, checksums) may
        # differ.
        items = [("optimizer is", "Adam" if not self._adamw else "AdamW"),
                 ("stage is", str(self.stage)), ("state is", state),
                 ("state_precision is", state_precision),
                 ("sub_group_size is", str(sub_group_size)),
                 ("parameter count is", str(len(self._flat)))]
        for i, p in enumerate(self._flat):
            items.append((f"parameter {i} has shape", str(list(p.shape))))
            items.append((f"parameter {i} has dtype", str(p.dtype)))
        items.append(("param group count is", str(len(self.param_groups))))
        for g, group in enumerate(self.param_groups):
            items.append((f"param group {g} has", f"{len(group['params'])} parameters"))
            for key in ("lr", "betas", "eps", "weight_decay"):
                items.append((f"param group {g} has {key}", _shown(group[key])))
        return items

    @staticmethod
    def _check_param(p):
        if p.dtype != torch.float32:
            raise ValueError(f"zinf: parameters must be float32, got {p.dtype}")
        address_of(p, "parameter")

    def reload_parameters(self):
        """Collective. Broadcasts rank 0's parameters to every rank (so that the ranks start
        from the same values whatever their seeds) and takes them as the master weights; the
        moments start at zero. Called at construction; call it again after changing the
        parameters outside the optimizer (loading a model's state_dict, say)."""
        with torch.no_grad():
            for i, p in enumerate(self._flat):
                self.collectives.broadcast(p.data_ptr(), p.numel() * p.element_size(), 0)
                self._sharded.set_params(i, p.data_ptr(), p.numel())

    def _give_hyper(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = (float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                     float(group["weight_decay"]), bool(group.get("bias_correction", True)),
                     self._adamw)
            for p in group["params"]:
                i = self._index_of(p)
                if self._hyper_given[i] != hyper:
                    self._sharded.set_hyper(i, *hyper)
                    self._hyper_given[i] = hyper

    def _index_of(self, p):
        i = self._index.get(id(p))
        if i is None:
            raise ValueError("zinf: a parameter added after construction; the sharded "
                             "optimizer fixes its parameters when it is built")
        return i

    @torch.no_grad()
    def step(self, closure=None, *, loss_scale=None, clip=None):
        """Collective: every rank calls it. Averages the ranks' gradients, updates this rank's
        slice and gives every parameter its new values.

        ``loss_scale``: the factor the loss was multiplied by (fp16 loss scaling); divided out
        of the update. ``clip``: clip the global L2 norm of the averaged, unscaled gradients
        to this (torch's clip_grad_norm_ rule, over every rank's slices). If any averaged
        gradient is inf or NaN, every rank skips the step (nothing changes) and
        ``last_step_skipped`` is True. ``last_step_stats``: zinf's statistics of this rank's
        part (``global_grad_norm``, ``skipped``, bytes moved, ...)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if loss_scale is not None and (not loss_scale > 0 or loss_scale == float("inf")):
            raise ValueError(f"zinf: loss_scale must be finite and > 0, got {loss_scale}")
        if clip is not None and not clip >= 0:
            raise ValueError(f"zinf: clip must be >= 0, got {clip}")
        grads = []
        for p in self._flat:
            self._check_param(p)
            if p.grad is None:
                raise ValueError("zinf: every parameter needs a gradient at every step of the "
                                 "sharded optimizer (the ranks reduce all of them together)")
            if p.grad.is_sparse:
                raise ValueError("zinf: sparse gradients are not supported")
            if p.grad.numel() != p.numel():
                raise ValueError(f"zinf: a parameter of {p.numel()} elements has a gradient of "
                                 f"{p.grad.numel()}")
            dtype_name(p.grad.dtype)
            if p.grad.device.type != "cpu":
                raise ValueError(f"zinf: gradients must be in CPU memory, got {p.grad.device}")
            # fp32 and contiguous: what the reduce-scatter takes (a copy only when needed).
            grads.append(p.grad.to(torch.float32).contiguous())
        self._give_hyper()
        stats = self._sharded.step([g.data_ptr() for g in grads],
                                   [p.data_ptr() for p in self._flat],
                                   [p.numel() for p in self._flat],
                                   float(clip or 0.0), float(loss_scale or 1.0))
        self.last_step_stats = stats
        self.last_step_skipped = bool(stats["skipped"])
        return loss

    def shard_numel(self, index):
        """Elements of parameter `index` (in param_groups order) this rank keeps, padding
        included, and where its slice starts (shard_offset)."""
        return self._sharded.shard_numel(index)

    def shard_offset(self, index):
        return self._sharded.shard_offset(index)

    def read_shard(self, index):
        """(master, exp_avg, exp_avg_sq) of this rank's slice of parameter `index`: three new
        float32 tensors of shard_numel(index) elements (the padding is zero)."""
        n = self._sharded.shard_numel(index)
        out = [torch.empty(n, dtype=torch.float32) for _ in range(3)]
        self._sharded.read_state(index, *(t.data_ptr() for t in out), n)
        return tuple(out)

    def save(self, directory):
        """Collective. Every rank writes its slices in ``directory/rank<R>``, rank 0 the
        manifest ``directory/zinf-sharded`` (a shared file system, or the same path on every
        node). Raises on every rank if any rank failed. The previous checkpoint in
        ``directory`` stays loadable until every rank has written and rank 0 committed this
        one: a rank killed during the save leaves it (docs/reliability.md, section 8)."""
        self._sharded.save(fs_path(directory, "directory"))

    def load(self, directory):
        """Collective. Restores what save() wrote and gives every parameter its saved master
        weights. A checkpoint saved by another world size is resharded: each rank reads some
        saved ranks' folders (the checkpoint must be visible from every rank) and the slices
        are redistributed; the same parameter groups are required."""
        self._sharded.load(fs_path(directory, "directory"))
        with torch.no_grad():
            for i, p in enumerate(self._flat):
                s = self._sharded.shard_numel(i)
                full = torch.empty(s * self.collectives.size, dtype=torch.float32)
                mine = full[s * self.collectives.rank:s * (self.collectives.rank + 1)]
                self._sharded.read_state(i, mine.data_ptr(), 0, 0, s)
                # In place: this rank's slice is its block of `full`.
                self.collectives.all_gather(mine.data_ptr(), s * 4, full.data_ptr(),
                                            full.numel() * 4)
                p.copy_(full[:p.numel()].view_as(p))
        self._hyper_given = [None] * len(self._flat)

    def state_dict(self):
        raise NotImplementedError("zinf: the sharded optimizer's state is split across ranks; "
                                  "checkpoint it with save(dir) / load(dir)")

    def load_state_dict(self, state_dict):
        raise NotImplementedError("zinf: the sharded optimizer's state is split across ranks; "
                                  "checkpoint it with save(dir) / load(dir)")


class ShardedAdam(_ShardedAdamBase):
    """torch.optim.Adam's arguments (L2 weight decay added to the gradient), sharded across
    the ranks of ``process_group`` (the default group when None). See _ShardedAdamBase."""

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, threads: int = 0,
                 process_group: Any = None, state: str = "cpu",
                 nvme_path: NvmePaths = None, sub_group_size: Optional[int] = None,
                 pipeline_depth: int = 4, pinned_budget: Optional[int] = None,
                 checksums: bool = True, state_precision: str = "fp32",
                 aio: AioSettings = None, stage: int = 2) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, False, threads,
                         process_group, state=state, nvme_path=nvme_path,
                         sub_group_size=sub_group_size, pipeline_depth=pipeline_depth,
                         pinned_budget=pinned_budget, checksums=checksums,
                         state_precision=state_precision, aio=aio, stage=stage)


class ShardedAdamW(_ShardedAdamBase):
    """torch.optim.AdamW's arguments (decoupled weight decay), sharded across the ranks of
    ``process_group`` (the default group when None). See _ShardedAdamBase."""

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, threads: int = 0,
                 process_group: Any = None, state: str = "cpu",
                 nvme_path: NvmePaths = None, sub_group_size: Optional[int] = None,
                 pipeline_depth: int = 4, pinned_budget: Optional[int] = None,
                 checksums: bool = True, state_precision: str = "fp32",
                 aio: AioSettings = None, stage: int = 2) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, True, threads,
                         process_group, state=state, nvme_path=nvme_path,
                         sub_group_size=sub_group_size, pipeline_depth=pipeline_depth,
                         pinned_budget=pinned_budget, checksums=checksums,
                         state_precision=state_precision, aio=aio, stage=stage)
