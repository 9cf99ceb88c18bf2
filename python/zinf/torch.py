# SPDX-License-Identifier: Apache-2.0
"""zinf for PyTorch: pinned tensors from zinf's budgeted pool, CPU Adam/AdamW optimizers,
layer-wise parameter offload (offload_parameters), and O_DIRECT file objects for torch.save and
torch.load (FastFileWriter, FastFileReader, from zinf.fast_file).

Everything here works on CPU tensors with torch 1.13 and later; zinf's native module never
links libtorch, tensors are handed over as (address, bytes, dtype).
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch

from zinf import _native

# Part of zinf.torch's API, defined in modules of their own: the tensor helpers in zinf.pinned
# (which the offload modules import instead of this one: no import cycle) and the O_DIRECT
# file objects in zinf.fast_file.
from zinf.activations import ActivationStore, offload_activations  # noqa: F401
from zinf.fast_file import FastFileReader, FastFileWriter  # noqa: F401
from zinf.param_offload import ParameterOffload, offload_parameters  # noqa: F401
from zinf.pinned import (MAX_ELEMENTS, AioSettings, NvmePaths, address_of,  # noqa: F401
                         dtype_name, fs_path, fs_paths, int_arg, io_options, is_zinf_pinned,
                         pinned_empty, pinned_zeros)

# What an optimizer takes as its parameters: tensors, or torch's parameter-group dicts.
Params = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]


def sub_group_and_record(sub_group_size: Optional[int], state_precision: str) -> Tuple[int, int]:
    """(elements per sub-group, bytes of one record) for zinf's optimizers (these and
    zinf.distributed's): None takes the library's default, records of 12 MiB whatever the
    precision; a record holds the fp32 master and the moments, its checksums and a 4 KiB pad
    (docs/engine.md)."""
    if sub_group_size is None:
        sub_group_size = _native.default_sub_group_elements(state_precision)
    elif isinstance(sub_group_size, bool) or not isinstance(sub_group_size, int) \
            or not _native.min_sub_group_elements <= sub_group_size <= MAX_ELEMENTS:
        # The ds_config's limit (zero_optimization.sub_group_size), on every door: each
        # sub-group is a record padded to 4 KiB, so 1 element would take 341x the state's room;
        # and zinf's bound on elements (2^50), under which the record's bytes stay countable.
        raise ValueError(f"zinf: sub_group_size must be an int of at least "
                         f"{_native.min_sub_group_elements} and at most 2^50 elements (or None "
                         f"for the default), got {sub_group_size!r}")
    per_element = {"fp32": 12, "bf16": 8, "int8": 6}[state_precision]
    return sub_group_size, per_element * sub_group_size + 8 * (sub_group_size // 64 + 1) + 4096


def budget_error_in_python_terms(e: ValueError) -> ValueError:
    """The library's refusal of a pinned budget ("OffloadedOptimizer: pinned_budget_bytes=N
    cannot hold ...; the smallest budget that works is M") in the Python argument's name, with
    how to get a budget that works; any other error as it is."""
    text = str(e)
    if "pinned_budget_bytes=" not in text:
        return e
    _, _, rest = text.partition("pinned_budget_bytes=")
    return ValueError(f"zinf: pinned_budget={rest} (pinned_budget=None takes the pipeline's "
                      "own need)")


def check_adam_arguments(lr: float, betas: Tuple[float, float], eps: float, weight_decay: float,
                         amsgrad: bool, state: str, state_precision: str) -> None:
    """ValueError for what zinf's optimizers (these and zinf.distributed's) cannot take."""
    if amsgrad:
        raise ValueError("zinf: amsgrad is not supported (zinf's kernel is Adam/AdamW)")
    if not 0.0 <= lr:
        raise ValueError(f"zinf: invalid learning rate {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"zinf: invalid eps {eps}")
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"zinf: invalid beta{i + 1} {b}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"zinf: invalid weight_decay {weight_decay}")
    if state not in ("cpu", "nvme"):
        raise ValueError(f"zinf: state must be 'cpu' or 'nvme', got {state!r}")
    if state_precision not in ("fp32", "bf16", "int8"):
        raise ValueError("zinf: state_precision must be 'fp32', 'bf16' or 'int8', got "
                         f"{state_precision!r}")


def tensor_arg(t: Any, what: str) -> Tuple[int, str, Any, Any, str]:
    """(data_ptr, dtype, shape, stride, device type) of a dense tensor: how the native door
    (_native.check_adam_tensors, CpuAdam.step) is told about a tensor, so that it can check
    its size, dtype, layout and device itself. ValueError naming `what` for anything else."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"zinf: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"zinf: {what} must be a dense tensor, got layout {t.layout}")
    # Sizes and strides as torch's tuples, the device type read only off the cpu: this runs
    # for every tensor of every update (~1 us). torch 1.13's stubs lack is_cpu.
    return (t.data_ptr(), str(t.dtype), t.shape, t.stride(),
            "cpu" if t.is_cpu else t.device.type)  # type: ignore[attr-defined]


def check_update_tensors(where: str, p: torch.Tensor, grad: torch.Tensor,
                         exp_avg: Optional[torch.Tensor] = None,
                         exp_avg_sq: Optional[torch.Tensor] = None) -> None:
    """ValueError "<where>: <argument> ..." unless the tensors of one update or rollback are
    what the kernel can take: on the cpu, float32/bfloat16/float16 (both moments one dtype),
    contiguous (no expanded or transposed tensor), each with the parameter's element count,
    no two sharing memory (the adam layer's check_update_tensors). Moments None: the update
    makes them."""
    _native.check_adam_tensors(
        where, tensor_arg(p, "params"), tensor_arg(grad, "grads"),
        None if exp_avg is None else tensor_arg(exp_avg, "exp_avg"),
        None if exp_avg_sq is None else tensor_arg(exp_avg_sq, "exp_avg_sq"))


def torch_group_keys(adamw: bool) -> Dict[str, Any]:
    """The param_group keys torch 2's Adam/AdamW carry beyond the hyper-parameters, with the
    values zinf's kernel implements: a zinf state_dict holding them loads into
    torch.optim.Adam(W) as it is (a missing key would be set to torch's default, and
    torch 2.13's decoupled_weight_decay decides which update its Adam runs). foreach and fused
    say how torch would run its own update; zinf's kernel is fused whatever they say, so the
    defaults (None) are given and any value is taken."""
    return dict(amsgrad=False, maximize=False, foreach=None, capturable=False,
                differentiable=False, fused=None, decoupled_weight_decay=adamw)


def check_group_keys(group: Dict[str, Any], adamw: bool, where: str) -> None:
    """ValueError for a param_group key of torch's whose value zinf's kernel cannot honour
    (torch.optim.AdamW's state_dict with maximize=True, a group given with capturable=True):
    refused rather than silently ignored. Absent keys are fine (torch 1.13 lacks some)."""
    why = {"amsgrad": "zinf's kernel is Adam/AdamW, without the max of past exp_avg_sq",
           "maximize": "zinf's kernel minimizes: negate the loss instead",
           "capturable": "torch's CUDA-graph capture of its own update; zinf's kernel runs "
                         "on the CPU, so give capturable=False",
           "differentiable": "zinf's update runs outside autograd, so give "
                             "differentiable=False"}
    for key, reason in why.items():
        if group.get(key):
            raise ValueError(f"zinf: {where}{key}={group[key]!r} is not supported ({reason})")
    decoupled = group.get("decoupled_weight_decay", adamw)
    if bool(decoupled) != adamw:
        mine, other = ("AdamW", "Adam") if adamw else ("Adam", "AdamW")
        raise ValueError(f"zinf: {where}decoupled_weight_decay={decoupled!r} is {other}'s "
                         f"update and this optimizer runs {mine}'s: use zinf.torch.{other}")


def adam_update(kernel: "_native.CpuAdam", adamw: bool, step: int, group: Dict[str, Any],
                p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, grad_scale: float = 1.0,
                where: str = "zinf: adam_update") -> None:
    """One update of `p` (CPU, contiguous; float32, bfloat16 or float16) by zinf's kernel with
    fp32 arithmetic: a float32 parameter in place; a bf16/fp16 one through an fp32 copy whose
    update the kernel rounds back into it (fused, round to nearest even). Moments float32 or
    bfloat16 in place (the kernel's bf16 codec); float16 moments through fp32 copies. The
    tensors are checked first (check_update_tensors; errors start with `where`), so a refused
    update changes nothing."""
    if not (isinstance(p, torch.Tensor) and isinstance(exp_avg, torch.Tensor)
            and p.dtype == torch.float32 and exp_avg.dtype in (torch.float32, torch.bfloat16)):
        # A copy is made below: the tensors as given are checked first. Otherwise the kernel
        # gets them as they are, and kernel.step checks them itself.
        check_update_tensors(where, p, grad, exp_avg, exp_avg_sq)
    step = int_arg(step, "step")
    beta1, beta2 = group["betas"]
    master = p if p.dtype == torch.float32 else p.detach().to(torch.float32)
    out = None if master is p else p
    m, v = exp_avg, exp_avg_sq
    if exp_avg.dtype == torch.float16:  # the kernel keeps fp32 or bf16 moments
        m, v = exp_avg.to(torch.float32), exp_avg_sq.to(torch.float32)
    kernel.step(tensor_arg(master, "params"), tensor_arg(grad, "grads"),
                tensor_arg(m, "exp_avg"), tensor_arg(v, "exp_avg_sq"), group["lr"], beta1, beta2,
                group["eps"], group["weight_decay"], step, group.get("bias_correction", True),
                adamw, grad_scale, None if out is None else tensor_arg(out, "params"), where)
    if m is not exp_avg:
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)


def check_rollback(adamw: bool, group: Dict[str, Any]) -> None:
    """ValueError unless the update made with `group`'s hyper-parameters can be undone: the
    update's own check, then beta1 and beta2 not 0 and, for AdamW, lr * weight_decay not 1
    (what the rollback divides by; the adam layer's check_rollback_params)."""
    beta1, beta2 = group["betas"]
    _native.check_adam_rollback(float(group["lr"]), float(beta1), float(beta2),
                                float(group["eps"]), float(group["weight_decay"]), bool(adamw))


def adam_rollback(adamw: bool, step: int, group: Dict[str, Any], p: torch.Tensor,
                  grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  where: str = "zinf: adam_rollback") -> None:
    """Undoes the update adam_update made at `step` from `grad`, in fp32 (torch operations):
    the moments and the parameter as they were before, up to fp32 rounding (and the rounding
    of a bf16/fp16 parameter or moment). Checked first as an update is (check_update_tensors,
    check_rollback): a refused rollback changes nothing."""
    check_update_tensors(where, p, grad, exp_avg, exp_avg_sq)
    check_rollback(adamw, group)
    beta1, beta2 = group["betas"]
    lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
    m, v = exp_avg.to(torch.float32), exp_avg_sq.to(torch.float32)
    x, g = p.detach().to(torch.float32), grad.detach().to(torch.float32)
    bc1, bc2 = 1.0, 1.0
    if group.get("bias_correction", True):
        bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    x = x + lr * (m / bc1) / ((v / bc2).sqrt() + eps)
    if adamw:
        x = x / (1.0 - lr * wd)
    else:
        g = g + wd * x  # L2: the gradient the update saw
    exp_avg.copy_((m - (1.0 - beta1) * g) / beta1)
    exp_avg_sq.copy_((v - (1.0 - beta2) * g * g) / beta2)
    p.data.copy_(x)


# A state='nvme' checkpoint's record of its parameters' shapes, saved inside each version
# beside the state (OffloadedOptimizer.set_checkpoint_file): JSON, zlib-compressed and in
# base64 (a transformer's shapes repeat, so thousands of them fit the file's 60 KiB bound).
_SHAPES_FILE = "param_shapes"
_SHAPES_LIMIT = 60 << 10


def _shapes_text(params) -> Optional[str]:
    text = json.dumps([list(p.shape) for p in params], separators=(",", ":"))
    packed = base64.b64encode(zlib.compress(text.encode(), 9)).decode()
    return packed if len(packed) <= _SHAPES_LIMIT else None  # past the bound: not checked


def _check_shapes(saved: str, params, directory: str) -> None:
    try:
        shapes = json.loads(zlib.decompress(base64.b64decode(saved)).decode())
    except (ValueError, zlib.error) as e:
        raise ValueError(f"zinf: load({directory!r}): its {_SHAPES_FILE} cannot be read: "
                         f"{e}") from None
    if len(shapes) != len(params) or any(math.prod(s) != p.numel()
                                         for s, p in zip(shapes, params)):
        return  # the load itself refuses other element counts, naming them
    for i, (shape, p) in enumerate(zip(shapes, params)):
        if list(shape) != list(p.shape):
            raise ValueError(f"zinf: load({directory!r}): parameter {i} is shaped "
                             f"{list(p.shape)}, the checkpoint's master {list(shape)} (the "
                             f"same {p.numel()} elements, another shape); nothing loaded")


class _CpuAdamBase(torch.optim.Optimizer):
    """Adam/AdamW with torch's arguments and param_groups, updated by zinf's CPU Adam kernel.

    Parameters must be float32 CPU tensors; gradients may be float32, bfloat16 or float16.
    The update is the kernel's fp32 arithmetic: equal to torch.optim.Adam(W) up to fp32
    rounding, not bitwise (the kernel fuses the operations), and bitwise the same for every
    ``state`` tier.

    ``state="cpu"`` (default): per parameter ``step`` and float32 ``exp_avg`` / ``exp_avg_sq``
    in zinf's pinned pool, as torch.optim.Adam names them.

    ``state="nvme"``: the fp32 master weights and both moments (12 bytes per parameter) live
    in swap files under ``nvme_path`` (a directory, or a list: striped over them), streamed
    through a ring of ``pipeline_depth`` pinned buffers of ``sub_group_size`` elements
    (default None: records of 12 MiB, 1M elements of fp32 state, 1.5M bf16, 2054336 int8;
    OffloadedOptimizer); each step reads and writes them back and copies the updated weights
    into the parameters. The masters are taken from the parameters at construction; after
    changing a parameter's values outside the optimizer call ``reload_parameters()``.
    Checksums (CRC32C) are verified on every read back unless ``checksums=False``. The state
    is not in ``self.state``: checkpoint it with ``save(dir)`` / ``load(dir)`` (zinf's
    format), or ``state_dict()`` / ``load_state_dict()`` (torch's, read from and written to
    the swap files).

    ``state_precision`` (state="nvme"): how the moments are stored, ``"fp32"`` (12 bytes per
    parameter with the master), ``"bf16"`` (8) or ``"int8"`` (6.125: 8-bit codes with a scale
    per 64 elements); the master weights stay fp32 and each step moves that many bytes
    (zinf.state_precision in docs/config.md). ``state_dict()`` gives the moments decoded to
    float32; ``load_state_dict()`` encodes them. A zinf checkpoint (``save``) records its
    precision, and ``load`` refuses one of another precision.

    ``aio`` (state="nvme"): the I/O settings of the state's engine, a ds_config's ``"aio"``
    block as a dict (``{"block_size": 1048576, "queue_depth": 32}``) or the path of a ds_config
    file; None keeps the library's defaults. ``io_settings()`` tells what the engine took.

    ``overlap=True`` (state="nvme"): each parameter's update is queued as soon as backward has
    produced its gradient (a gradient hook), so the state's NVMe reads, the updates and the
    write-backs run during backward; ``step()`` waits for the rest. It needs one backward per
    step with the gradients set to None before it (``zero_grad()`` of this optimizer does
    that), and the gradients must not be changed after backward (no clipping in this mode).
    """

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, adamw, threads,
                 state="cpu", nvme_path=None, sub_group_size=None, pipeline_depth=4,
                 pinned_budget=None, checksums=True, overlap=False, state_precision="fp32",
                 aio=None):
        check_adam_arguments(lr, betas, eps, weight_decay, amsgrad, state, state_precision)
        threads = int_arg(threads, "threads")
        pipeline_depth = int_arg(pipeline_depth, "pipeline_depth", 1, (1 << 32) - 1)
        if pinned_budget is not None:
            pinned_budget = int_arg(pinned_budget, "pinned_budget")
        io = io_options(aio)  # checked first: a bad setting changes nothing
        if state_precision != "fp32" and state != "nvme":
            raise ValueError(f"zinf: state_precision={state_precision!r} is for state='nvme' "
                             "(state='cpu' keeps torch's float32 exp_avg / exp_avg_sq tensors)")
        if overlap and state != "nvme":
            raise ValueError("zinf: overlap=True is for state='nvme' (the cpu tier updates on the "
                             "calling thread, so there is nothing to overlap)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=True, **torch_group_keys(adamw))
        self._adamw = adamw  # before super(): add_param_group checks the groups against it
        super().__init__(params, defaults)
        self._threads = threads
        self._tier = state
        self._offloaded = None
        self.last_step_skipped = False
        if state == "cpu":
            self._kernel = _native.CpuAdam(threads)
            return
        if not nvme_path:
            raise ValueError("zinf: state='nvme' needs nvme_path (a directory, or a list)")
        dirs = fs_paths(nvme_path, "nvme_path")
        self._flat = [p for g in self.param_groups for p in g["params"]]
        for p in self._flat:
            self._check_param(p)
            if p.numel() == 0:
                raise ValueError("zinf: state='nvme' got a parameter with no elements (released "
                                 "by offload_parameters? build the optimizer inside `with "
                                 "offload.materialized():`)")
        sub_group_size, record = sub_group_and_record(sub_group_size, state_precision)
        budget = pinned_budget if pinned_budget is not None else pipeline_depth * record
        try:
            self._offloaded = _native.OffloadedOptimizer(
                [p.numel() for p in self._flat], "nvme", dirs, int(sub_group_size),
                int(pipeline_depth), int(budget), int(threads), bool(checksums),
                str(state_precision), io)
        except ValueError as e:
            raise budget_error_in_python_terms(e) from None
        self._index = {id(p): i for i, p in enumerate(self._flat)}
        self._hyper_given = [None] * len(self._flat)
        shapes = _shapes_text(self._flat)
        if shapes is not None:
            self._offloaded.set_checkpoint_file(_SHAPES_FILE, shapes)
        self.reload_parameters()
        self.last_step_stats = None
        self._overlap = bool(overlap)
        self._queued = []  # (index, param, grad) given to the open step by the hooks
        self._given = set()  # their indices: each parameter at most once per step
        self._step_open = False
        if self._overlap:
            for p in self._flat:
                self._add_hook(p)

    def __setstate__(self, state):
        super().__setstate__(state)
        # torch's load_state_dict comes here with the loaded groups in place of these: one
        # saved by torch 1.13 (or by zinf before torch 2's keys) lacks some, which get the
        # values zinf implements, so the next state_dict carries them as torch 2's does.
        for group in self.param_groups:
            group.setdefault("bias_correction", True)
            for key, value in torch_group_keys(self._adamw).items():
                group.setdefault(key, value)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group, after two refusals. A torch key this kernel cannot honour
        (maximize=True, capturable=True, ...; check_group_keys); the constructor's groups
        come through here. A group that lists a parameter twice: torch
        warns ("optimizer contains a parameter group with duplicate parameters; in future,
        this will cause an error") and updates it twice a step; zinf's tiers would update it
        twice (cpu) or refuse the step after updating it once (nvme). A parameter in two
        groups is torch's own ValueError."""
        if isinstance(param_group, dict):
            check_group_keys(param_group, self._adamw, "a param_group's ")
        if isinstance(param_group, dict) and "params" in param_group:
            params = param_group["params"]
            if not isinstance(params, (torch.Tensor, set)):  # torch refuses a set itself
                params = param_group["params"] = list(params)
                first: Dict[int, int] = {}
                for i, p in enumerate(params):
                    if id(p) in first:
                        raise ValueError(
                            "zinf: optimizer contains a parameter group with duplicate "
                            f"parameters: parameter {i} is parameter {first[id(p)]} (torch "
                            "warns and updates it twice a step; zinf refuses it)")
                    first[id(p)] = i
        super().add_param_group(param_group)

    def _add_hook(self, p):
        # torch >= 2.1 tells when .grad is final; torch 1.13 only hands the gradient flowing
        # into the parameter, which is the final one when .grad was None (one backward per
        # step, grads set to None in between: zero_grad() here always does that).
        if hasattr(p, "register_post_accumulate_grad_hook"):
            p.register_post_accumulate_grad_hook(lambda param: self._on_grad(param, param.grad))
        else:
            p.register_hook(lambda grad, param=p: self._on_grad(param, grad))

    def _on_grad(self, p, grad):
        # Two ways a gradient is not the final one: on torch < 2.1 one already in .grad (the
        # hook sees only what flows in, not the sum); on every torch a second backward before
        # step() (its update was queued at the first). Both are refused before anything of
        # this gradient is queued.
        i = self._index.get(id(p))
        pre_accumulate = not hasattr(p, "register_post_accumulate_grad_hook")
        if (pre_accumulate and p.grad is not None) or (i is not None and i in self._given):
            raise RuntimeError(
                "zinf: overlap=True needs one backward per step with the gradients set to None "
                "before it (optimizer.zero_grad() does that; model.zero_grad() on torch < 2.0 "
                "leaves zeros): the update starts as each gradient arrives, so a second "
                "backward before step() cannot be added to it")
        if i is None:
            return None
        grad = grad.detach()
        grad = grad if grad.is_contiguous() else grad.contiguous()
        if not self._step_open:
            self._give_hyper([i for i in range(len(self._flat))])
            self._offloaded.begin_step()
            self._step_open = True
        self._offloaded.step_group(i, grad.data_ptr(), dtype_name(grad.dtype), p.data_ptr(),
                                   p.numel())
        self._queued.append((i, p, grad))  # alive until the step ends
        self._given.add(i)
        return None

    def _hyper_of(self, group, grad_scale=1.0):
        beta1, beta2 = group["betas"]
        return (float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                float(group["weight_decay"]), bool(group.get("bias_correction", True)),
                self._adamw, float(grad_scale))

    def _give_hyper(self, indices, grad_scale=1.0):
        want = set(indices)
        for group in self.param_groups:
            hyper = self._hyper_of(group, grad_scale)
            for p in group["params"]:
                i = self._index.get(id(p))
                if i in want and self._hyper_given[i] != hyper:
                    self._offloaded.set_hyper(i, *hyper)
                    self._hyper_given[i] = hyper

    def zero_grad(self, set_to_none=True):
        if self._offloaded is not None and self._overlap:
            set_to_none = True  # the hooks need None (see _on_grad)
        super().zero_grad(set_to_none=set_to_none)

    @staticmethod
    def _check_param(p):
        if p.dtype != torch.float32:
            raise ValueError(f"zinf: parameters must be float32, got {p.dtype}")
        address_of(p, "parameter")

    def io_settings(self):
        """state='nvme': the I/O engine's name and settings (engine, block_size, queue_depth,
        threads), as the ``aio`` argument set them."""
        if self._offloaded is None:
            raise ValueError("zinf: io_settings() is for state='nvme'")
        return self._offloaded.io()

    def reload_parameters(self):
        """state='nvme': takes every parameter's current values as its master weights and
        zeroes its moments (as at construction)."""
        if self._offloaded is None:
            raise ValueError("zinf: reload_parameters is for state='nvme'")
        with torch.no_grad():
            for i, p in enumerate(self._flat):
                self._offloaded.set_params(i, p.data_ptr(), p.numel())

    def _grad_of(self, p):
        if p.grad.is_sparse:
            raise ValueError("zinf: sparse gradients are not supported")
        if p.grad.numel() != p.numel():
            raise ValueError(f"zinf: a parameter of {p.numel()} elements has a gradient of "
                             f"{p.grad.numel()} (released by offload_parameters? step with "
                             "offload.step(optimizer))")
        return p.grad if p.grad.is_contiguous() else p.grad.contiguous()

    def _overflowed(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    return True
        return False

    @torch.no_grad()
    def step(self, closure=None, *, loss_scale=None):
        """One update of every parameter that has a gradient.

        ``loss_scale``: the factor the loss was multiplied by before backward (fp16/bf16
        training's loss scaling). The gradients are then unscaled inside the kernel
        (``grad_scale = 1 / loss_scale``, exact for powers of two) and, if any gradient holds
        an inf or a NaN, the step is skipped: no parameter, moment or step count changes, and
        ``last_step_skipped`` is True (lower the scale and go on, as GradScaler does).
        ``torch.nn.utils.clip_grad_norm_`` before ``step()`` works as with torch's optimizers
        (except with ``overlap=True``, which reads the gradients during backward).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = 1.0
        self.last_step_skipped = False
        if loss_scale is not None:
            if not loss_scale > 0 or loss_scale == float("inf"):
                raise ValueError(f"zinf: loss_scale must be finite and > 0, got {loss_scale}")
            if self._offloaded is not None and self._overlap:
                raise ValueError("zinf: loss_scale with overlap=True: the updates began during "
                                 "backward, before the gradients could be checked")
            grad_scale = 1.0 / loss_scale
            if self._overflowed():
                self.last_step_skipped = True
                return loss
        if self._offloaded is not None:
            if self._overlap:
                self._end_overlapped_step()
            else:
                self._step_offloaded(grad_scale)
            return loss
        self._step_cpu(self._cpu_work(grad_scale), grad_scale)
        return loss

    def _cpu_work(self, grad_scale):
        """(group, param, grad) of every parameter with a gradient, after every check a step
        makes (parameters, gradients, each group's hyper-parameters): a step refused here
        changes nothing, no parameter, moment or step count."""
        work = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            self._check_hyper(group, grad_scale)
            for p in params:
                self._check_param(p)
                grad = self._grad_of(p)
                address_of(grad, "gradient")
                dtype_name(grad.dtype)
                work.append((group, p, grad))
        return work

    @staticmethod
    def _check_hyper(group, grad_scale=1.0):
        beta1, beta2 = group["betas"]
        _native.check_adam(float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                           float(group["weight_decay"]), float(grad_scale))

    def _moment_dtype(self, p):
        """The dtype new moments of `p` are made in (float32 here)."""
        return torch.float32

    def _wheres(self, step_name):
        """{id(param): "zinf: AdamW.step: parameter 3"}: how an error names each parameter
        (torch's index, as in state_dict())."""
        prefix = f"zinf: {type(self).__name__}.{step_name}: parameter"
        flat = [q for g in self.param_groups for q in g["params"]]
        return {id(q): f"{prefix} {i}" for i, q in enumerate(flat)}

    def _check_states(self, work, states=None, step_name="step"):
        """ValueError before any update for a parameter whose moments the kernel cannot take
        (check_update_tensors: size, dtype, layout, device, overlap), so that a refused step
        changes nothing. Moments not made yet are made by the step in the parameter's shape;
        moments shared by several parameters (DeepSpeed's subgroups) must fit every one."""
        wheres = self._wheres(step_name)
        made: Dict[int, int] = {}  # id(state) -> numel of the moments the step will make
        for k, (_, p, grad) in enumerate(work):
            state = self.state[p] if states is None else states[k]
            where = wheres[id(p)]
            if len(state) == 0 and id(state) not in made:
                check_update_tensors(where, p, grad)
                made[id(state)] = p.numel()
            elif len(state) == 0:
                if made[id(state)] != p.numel():
                    raise ValueError(f"{where}: exp_avg has {made[id(state)]} elements, params "
                                     f"has {p.numel()} (the moments it shares are made for an "
                                     "earlier parameter)")
                check_update_tensors(where, p, grad)
            else:
                check_update_tensors(where, p, grad, state.get("exp_avg"),
                                     state.get("exp_avg_sq"))

    def _step_cpu(self, work, grad_scale, states=None, step_name="step"):
        """Updates what _cpu_work checked, after checking every parameter's moments
        (_check_states). A parameter's step count moves only with its update, after the kernel
        took it. `states` (one per work item; default the parameter's own) is where the
        moments and the count live (DeepSpeed's subgroups)."""
        self._check_states(work, states, step_name)
        wheres = self._wheres(step_name)
        for k, (group, p, grad) in enumerate(work):
            state = self.state[p] if states is None else states[k]
            if len(state) == 0:
                state["step"] = 0
                dtype = self._moment_dtype(p)
                state["exp_avg"] = pinned_zeros(p.shape, dtype)
                state["exp_avg_sq"] = pinned_zeros(p.shape, dtype)
            step = int(state["step"]) + 1
            adam_update(self._kernel, self._adamw, step, group, p, grad, state["exp_avg"],
                        state["exp_avg_sq"], grad_scale, wheres[id(p)])
            state["step"] = step

    def _step_offloaded(self, grad_scale=1.0):
        # Everything is checked before the step opens: a refusal must not leave half a step.
        work = []
        for group in self.param_groups:
            hyper = self._hyper_of(group, grad_scale)
            for p in group["params"]:
                if p.grad is None:
                    continue
                i = self._index.get(id(p))
                if i is None:
                    raise ValueError("zinf: a parameter added after construction; state='nvme' "
                                     "fixes its parameters when it is built")
                self._check_param(p)
                grad = self._grad_of(p)
                dtype_name(grad.dtype)
                work.append((i, p, grad, hyper))
        if not work:
            return
        self._give_hyper([i for i, _, _, _ in work], grad_scale)
        self._offloaded.begin_step()
        try:
            for i, p, grad, _ in work:
                self._offloaded.step_group(i, grad.data_ptr(), dtype_name(grad.dtype),
                                           p.data_ptr(), p.numel())
        finally:
            self.last_step_stats = self._offloaded.end_step()

    def _end_overlapped_step(self):
        if not self._step_open:
            return
        try:
            self.last_step_stats = self._offloaded.end_step()
        finally:
            self._step_open = False
            self._queued.clear()
            self._given.clear()

    def state_dict(self):
        """torch's format: ``param_groups`` and per parameter ``step``, ``exp_avg`` and
        ``exp_avg_sq``. With state='nvme' the moments are read from the swap files (each a
        new float32 tensor) and ``step`` is the optimizer's step count for every parameter;
        the master weights are not in it (they equal the parameters after a step, as the
        model's own state_dict holds them)."""
        if self._offloaded is None:
            return super().state_dict()
        if self._step_open:
            raise ValueError("zinf: state_dict() inside an overlapped step (call step() first)")
        sd = super().state_dict()  # param_groups with torch's parameter indices; state is {}
        steps = int(self._offloaded.step_count())
        state = {}
        for i, p in enumerate(self._flat):  # torch numbers the parameters in this order
            m = torch.empty(p.shape, dtype=torch.float32)
            v = torch.empty(p.shape, dtype=torch.float32)
            self._offloaded.read_state(i, 0, m.data_ptr(), v.data_ptr(), p.numel())
            state[i] = {"step": steps, "exp_avg": m, "exp_avg_sq": v}
        sd["state"] = state
        return sd

    def _check_state_dict(self, state_dict):
        """ValueError, before anything changes, for state the kernel cannot take: moments that
        are not floating point, of another size than their parameter, not finite, a negative
        exp_avg_sq, a step count that is not a whole number >= 0 (torch's own load_state_dict
        takes all of these, and the next step would compute from them)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise ValueError("zinf: a state_dict has 'state' and 'param_groups'")
        for i, g in enumerate(state_dict["param_groups"]):
            check_group_keys(g, self._adamw, f"load_state_dict: param_group {i}'s ")
        numels = [p.numel() for g in self.param_groups for p in g["params"]]
        indices = [k for g in state_dict["param_groups"] for k in g["params"]]
        by_index = dict(zip(indices, numels))
        for k, st in state_dict["state"].items():
            where = f"zinf: load_state_dict: parameter {k}"
            for name in ("exp_avg", "exp_avg_sq"):
                t = st.get(name) if isinstance(st, dict) else None
                if not isinstance(t, torch.Tensor):
                    raise ValueError(f"{where} has no {name} tensor")
                if not t.is_floating_point():
                    raise ValueError(f"{where}'s {name} is {t.dtype}, not floating point")
                if k in by_index and t.numel() != by_index[k]:
                    raise ValueError(f"{where}'s {name} has {t.numel()} elements, the parameter "
                                     f"{by_index[k]}")
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(f"{where}'s {name} holds a NaN or an infinity")
                if name == "exp_avg_sq" and bool((t < 0).any()):
                    raise ValueError(f"{where}'s exp_avg_sq holds a negative value (it is a "
                                     "mean of squares)")
            step = st.get("step")
            value = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or value != int(value) or value < 0:
                raise ValueError(f"{where}'s step is {step!r}, not a whole number >= 0")

    def load_state_dict(self, state_dict):
        """Restores what state_dict() gives (this optimizer's, another tier's, or
        torch.optim.Adam(W)'s). With state='nvme' the master weights are taken from the
        parameters as they are now (load the model's state_dict first), the moments and the
        step count from `state_dict`; a parameter without state gets zero moments. Every
        parameter with state must have the same step count (this tier counts steps per
        optimizer), and a parameter without state is refused when that count is above 0
        (torch would start it from step 0). With state='cpu' moments in any layout (expanded,
        transposed, channels-last) are taken as contiguous copies in the parameter's shape.
        Everything is checked before anything changes (ValueError)."""
        self._check_state_dict(state_dict)
        if self._offloaded is None:
            super().load_state_dict(state_dict)
            self._contiguous_moments()
            return None
        if self._step_open:
            raise ValueError("zinf: load_state_dict() inside an overlapped step")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(mine["params"])
                for g, mine in zip(groups, self.param_groups)):
            raise ValueError("zinf: the state_dict's param_groups differ from this optimizer's "
                             "(number of groups or of parameters in a group)")
        by_index = {k: p for g, mine in zip(groups, self.param_groups)
                    for k, p in zip(g["params"], mine["params"])}
        work, steps = [], set()
        for k, st in state_dict["state"].items():
            p = by_index.get(k)
            if p is None:
                raise ValueError(f"zinf: the state_dict has state for parameter {k}, which "
                                 "no group lists")
            moments = []
            for name in ("exp_avg", "exp_avg_sq"):
                t = st[name]
                if t.numel() != p.numel():
                    raise ValueError(f"zinf: parameter {k}'s {name} has {t.numel()} elements, "
                                     f"the parameter {p.numel()}")
                moments.append(t.detach().to("cpu", torch.float32).contiguous())
            step = st["step"]
            steps.add(int(step.item()) if isinstance(step, torch.Tensor) else int(step))
            work.append((self._index[id(p)], p, *moments))
        if len(steps) > 1:
            raise ValueError(f"zinf: state='nvme' counts steps per optimizer, the state_dict's "
                             f"parameters have different step counts {sorted(steps)}")
        # A parameter without state starts from step 0 in torch (its own bias correction);
        # here it would take the others' count and be corrected as if it had their history.
        without = [k for g in groups for k in g["params"] if k not in state_dict["state"]]
        if without and steps and max(steps) > 0:
            raise ValueError(f"zinf: state='nvme' counts steps per optimizer: parameter "
                             f"{without[0]} has no state in the state_dict (torch starts it "
                             f"from step 0) and the others are at step {max(steps)}; load it "
                             "into state='cpu', or give every parameter state")
        for p in self._flat:
            self._check_param(p)
        with torch.no_grad():
            given = {i for i, _, _, _ in work}
            for i, p, m, v in work:
                self._offloaded.set_state(i, p.data_ptr(), m.data_ptr(), v.data_ptr(),
                                          p.numel())
            for i, p in enumerate(self._flat):
                if i not in given:
                    self._offloaded.set_params(i, p.data_ptr(), p.numel())
        self._offloaded.set_step_count(steps.pop() if steps else 0)
        for g, mine in zip(groups, self.param_groups):
            for key, value in g.items():
                if key != "params":
                    mine[key] = value
        self._hyper_given = [None] * len(self._flat)

    def _contiguous_moments(self):
        """Replaces every loaded moment the kernel cannot read in memory order (one made with
        expand, stride 0, or in another layout: torch.load gives a channels-last model's
        moments back channels-last) by a contiguous copy in the parameter's shape, element
        for element as torch.optim.Adam(W) would read it."""
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    state = self.state.get(p)
                    if not state:
                        continue
                    for name in ("exp_avg", "exp_avg_sq"):
                        t = state.get(name)
                        if isinstance(t, torch.Tensor) and t.numel() == p.numel() and (
                                not t.is_contiguous() or t.shape != p.shape):
                            # Not from the pinned pool: a full pool must not fail a load
                            # that torch's half already applied.
                            state[name] = t.reshape(p.shape).contiguous()

    def save(self, directory):
        """state='nvme': writes a checkpoint of the masters, moments, step count and
        hyper-parameters under `directory` (atomic; the previous one stays loadable)."""
        if self._offloaded is None:
            raise ValueError("zinf: save(dir) is for state='nvme'; use state_dict() for 'cpu'")
        self._offloaded.save(fs_path(directory, "directory"))

    def save_async(self, directory):
        """state='nvme': starts the checkpoint save() writes and returns while a thread
        writes it; steps may run meanwhile, and the checkpoint holds the state at this call,
        bitwise (a step copies a record the save still needs before updating it). A save
        still in flight is waited for first, and its error raised here. Errors of this save
        are raised by wait_save() (OSError naming file, offset and length)."""
        if self._offloaded is None:
            raise ValueError("zinf: save_async(dir) is for state='nvme'; use state_dict() "
                             "for 'cpu'")
        self._offloaded.save_async(fs_path(directory, "directory"))

    def wait_save(self):
        """Waits for the save_async() in flight, if any, and raises its error once."""
        if self._offloaded is not None:
            self._offloaded.wait_save()

    def save_in_flight(self):
        """True while a save_async() is still writing or committing."""
        return self._offloaded is not None and self._offloaded.save_in_flight()

    def last_save_snapshot(self):
        """How the last save_async() took its snapshot: "reflink" (cloned from the swap
        files on XFS or btrfs; steps copy nothing for it), "streamed" (steps copy each record
        the save has not written yet before updating it), or "none" before the first."""
        if self._offloaded is None:
            return "none"
        return self._offloaded.last_save_snapshot()

    def load(self, directory):
        """state='nvme': restores what save() wrote and copies the masters into the
        parameters."""
        if self._offloaded is None:
            raise ValueError("zinf: load(dir) is for state='nvme'; use load_state_dict()")
        directory = fs_path(directory, "directory")
        # The records hold element counts only: a checkpoint of parameters shaped otherwise
        # with the same counts (a transposed weight) would load into these. Checked against
        # the shapes saved with it, before anything changes; a checkpoint without them (saved
        # by an earlier build, or from C++) loads as before.
        saved = self._offloaded.read_checkpoint_file(directory, _SHAPES_FILE)
        if saved is not None:
            _check_shapes(saved, self._flat, directory)
        self._offloaded.load(directory)
        with torch.no_grad():
            for i, p in enumerate(self._flat):
                self._offloaded.read_state(i, p.data_ptr(), 0, 0, p.numel())
        self._hyper_given = [None] * len(self._flat)


class Adam(_CpuAdamBase):
    """torch.optim.Adam's arguments (L2 weight decay added to the gradient), zinf's kernel."""

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, threads: int = 0,
                 state: str = "cpu", nvme_path: NvmePaths = None,
                 sub_group_size: Optional[int] = None, pipeline_depth: int = 4,
                 pinned_budget: Optional[int] = None, checksums: bool = True,
                 overlap: bool = False, state_precision: str = "fp32",
                 aio: AioSettings = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, False, threads,
                         state=state, nvme_path=nvme_path,
                         sub_group_size=sub_group_size, pipeline_depth=pipeline_depth,
                         pinned_budget=pinned_budget, checksums=checksums, overlap=overlap,
                         state_precision=state_precision, aio=aio)


class AdamW(_CpuAdamBase):
    """torch.optim.AdamW's arguments (decoupled weight decay), zinf's kernel."""

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, threads: int = 0,
                 state: str = "cpu", nvme_path: NvmePaths = None,
                 sub_group_size: Optional[int] = None, pipeline_depth: int = 4,
                 pinned_budget: Optional[int] = None, checksums: bool = True,
                 overlap: bool = False, state_precision: str = "fp32",
                 aio: AioSettings = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, True, threads,
                         state=state, nvme_path=nvme_path,
                         sub_group_size=sub_group_size, pipeline_depth=pipeline_depth,
                         pinned_budget=pinned_budget, checksums=checksums, overlap=overlap,
                         state_precision=state_precision, aio=aio)
