# SPDX-License-Identifier: Apache-2.0
"""Tensors over zinf's memory and settings every store takes: pinned tensors from zinf's
budgeted pool, a tensor's (address, bytes), zinf's dtype names, and the I/O settings of a
ds_config's ``aio`` block. zinf.torch re-exports them; the offload modules (parameters,
activations) import them from here, so that nothing imports zinf.torch in a cycle."""

from __future__ import annotations

import json
import math
import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from zinf import _native

# What an aio= argument takes: None, a ds_config's "aio" block, or a ds_config file.
AioSettings = Union[None, Dict[str, Any], str, bytes, "os.PathLike[str]"]
# What an nvme_path= argument takes: None, a directory, or a list of them (striped over).
NvmePaths = Optional[Union[str, "os.PathLike[str]", List[str]]]

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# The widest integer a native call takes (uint64), and zinf's bound on elements (2^50, as the
# engine's layers and sub-groups).
U64_MAX = (1 << 64) - 1
MAX_ELEMENTS = 1 << 50


def int_arg(value: Any, what: str, low: int = 0, high: int = U64_MAX) -> int:
    """`value` as an int in [low, high] for a native call: the one check of the integers
    the Python doors pass on, so a bad one is refused naming the argument instead of by
    pybind11's dump of the signature, or truncated (int(1.5)). An int, a numpy integer or a
    one-element integer tensor (operator.index) is taken; a bool, float or str is a
    TypeError, a value out of range a ValueError giving the range."""
    if isinstance(value, bool):
        raise TypeError(f"zinf: {what} must be an integer, got a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"zinf: {what} must be an integer, got {type(value).__name__} "
                        f"{value!r}") from None
    if not low <= v <= high:
        limit = f">= {low}" if high == U64_MAX else f"in [{low}, {high}]"
        raise ValueError(f"zinf: {what} must be {limit}, got {v}")
    return v


def fs_path(value: Any, what: str) -> str:
    """`value` (str, bytes or os.PathLike) as the str path every native call takes: the one
    check of every Python door that takes a path. TypeError for anything else, ValueError
    naming `what` for an empty path or one with a NUL byte, which the native side would
    otherwise cut there (save("ck\\0zz") writing into "ck")."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"zinf: {what} must be a path (str, bytes or os.PathLike), got "
                        f"{type(value).__name__}")
    path = os.fsdecode(os.fspath(value))
    if "\0" in path:
        raise ValueError(f"zinf: {what} {path!r} has an embedded NUL byte")
    if not path:
        raise ValueError(f"zinf: {what} is empty")
    return path


def fs_paths(value: Any, what: str) -> List[str]:
    """An nvme_path= argument (one directory, or a list or other iterable of them) as a list
    of str paths, each checked by fs_path."""
    if not isinstance(value, (str, bytes, os.PathLike)) and hasattr(value, "__iter__"):
        return [fs_path(v, f"{what}[{i}]") for i, v in enumerate(value)]
    return [fs_path(value, what)]


def dtype_name(dtype: torch.dtype) -> str:
    """zinf's name for a torch dtype ("fp32", "bf16", "fp16"); ValueError for any other."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"zinf: dtype must be float32, bfloat16 or float16, got {dtype}") from None


def address_of(tensor: torch.Tensor, what: str = "tensor") -> Tuple[int, int]:
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
    shape = tuple(int_arg(s, "shape", 0, MAX_ELEMENTS) for s in shape)
    numel = math.prod(shape)
    if numel > MAX_ELEMENTS:
        raise ValueError(f"zinf: shape {list(shape)} has {numel} elements, more than 2^50")
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = _native.pinned_alloc(numel * itemsize, zero)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    # frombuffer keeps a reference to `buf`: the memory goes back to the pool with the tensor.
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)


def pinned_empty(shape: Union[int, Sequence[int]],
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor in zinf's pinned pool (4096-byte aligned, huge pages,
    registered with the GPU where one is visible), freed when the tensor is. Raises
    zinf.IoError (kind "resource") when the pool's budget is used up."""
    return _pinned(shape, dtype, False)


def pinned_zeros(shape: Union[int, Sequence[int]],
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """As pinned_empty, zero-filled."""
    return _pinned(shape, dtype, True)


def is_zinf_pinned(tensor: torch.Tensor) -> bool:
    """True if the tensor's memory lies in zinf's pinned pool."""
    return tensor.device.type == "cpu" and _native.pinned_contains(tensor.data_ptr())


def io_options(aio: AioSettings) -> "_native.IoOptions":
    """The I/O settings a store's engine takes, from ``aio``: None (the library's defaults),
    a dict (a ds_config's ``"aio"`` block: ``block_size``, ``queue_depth``,
    ``intra_op_parallelism``, ...), or the path of a ds_config JSON file (its ``aio`` block
    and ``zinf.backend``). Read by the engine's own config reader: a bad value is a
    ValueError naming the key, as in a ds_config."""
    if aio is None:
        return _native.IoOptions()
    if isinstance(aio, dict):
        return _native.io_options(json.dumps({"aio": aio}), "aio argument")
    if isinstance(aio, (str, bytes, os.PathLike)):
        return _native.io_options(path=fs_path(aio, "aio"))
    raise TypeError("zinf: aio must be None, a dict (a ds_config's aio block) or the path of "
                    f"a ds_config file, got {type(aio).__name__}")
