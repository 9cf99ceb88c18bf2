# SPDX-License-Identifier: Apache-2.0
"""zinf for PyTorch: pinned tensors from zinf's budgeted pool and CPU Adam/AdamW optimizers.

Everything here works on CPU tensors with torch 1.13 and later; zinf's native module never
links libtorch, tensors are handed over as (address, bytes, dtype).
"""

import math

import torch

from zinf import _native

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_name(dtype):
    """zinf's name for a torch dtype ("fp32", "bf16", "fp16"); ValueError for any other."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"zinf: dtype must be float32, bfloat16 or float16, got {dtype}") from None


def address_of(tensor, what="tensor"):
    """(address, bytes) of a contiguous CPU tensor's data; ValueError otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"zinf: {what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"zinf: {what} must be in CPU memory, got device {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"zinf: {what} must be contiguous")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def _pinned(shape, dtype, zero):
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = _native.pinned_alloc(numel * itemsize, zero)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    # frombuffer keeps a reference to `buf`: the memory goes back to the pool with the tensor.
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)


def pinned_empty(shape, dtype=torch.float32):
    """An uninitialised CPU tensor in zinf's pinned pool (4096-byte aligned, huge pages,
    registered with the GPU where one is visible), freed when the tensor is. Raises
    zinf.IoError (kind "resource") when the pool's budget is used up."""
    return _pinned(shape, dtype, False)


def pinned_zeros(shape, dtype=torch.float32):
    """As pinned_empty, zero-filled."""
    return _pinned(shape, dtype, True)


def is_zinf_pinned(tensor):
    """True if the tensor's memory lies in zinf's pinned pool."""
    return tensor.device.type == "cpu" and _native.pinned_contains(tensor.data_ptr())


class _CpuAdamBase(torch.optim.Optimizer):
    """Adam/AdamW with torch's arguments and param_groups, updated by zinf's CPU Adam kernel.

    Parameters must be float32 CPU tensors; gradients may be float32, bfloat16 or float16.
    State per parameter: ``step`` and float32 ``exp_avg`` / ``exp_avg_sq`` (pinned), as
    torch.optim.Adam names them. The update is the kernel's fp32 arithmetic: equal to
    torch.optim.Adam(W) up to fp32 rounding, not bitwise (the kernel fuses the operations).
    """

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, adamw, threads):
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
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=True)
        super().__init__(params, defaults)
        self._adamw = adamw
        self._kernel = _native.CpuAdam(threads)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32:
                    raise ValueError(f"zinf: parameters must be float32, got {p.dtype}")
                if p.grad.is_sparse:
                    raise ValueError("zinf: sparse gradients are not supported")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = pinned_zeros(p.shape, torch.float32)
                    state["exp_avg_sq"] = pinned_zeros(p.shape, torch.float32)
                state["step"] += 1
                grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                p_addr, _ = address_of(p, "parameter")
                g_addr, _ = address_of(grad, "gradient")
                self._kernel.step(
                    p_addr, g_addr, dtype_name(grad.dtype),
                    state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(), p.numel(),
                    group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                    state["step"], group.get("bias_correction", True), self._adamw)
        return loss


class Adam(_CpuAdamBase):
    """torch.optim.Adam's arguments (L2 weight decay added to the gradient), zinf's kernel."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, threads=0):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, False, threads)


class AdamW(_CpuAdamBase):
    """torch.optim.AdamW's arguments (decoupled weight decay), zinf's kernel."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, threads=0):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, True, threads)
