# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed's async I/O handle and CPU Adam, on zinf.

``AsyncIOBuilder().load().aio_handle(...)`` and ``DeepSpeedCPUAdam(...)`` take DeepSpeed's
arguments and keep its method names and return values, so code written for DeepSpeed runs on
zinf by changing its imports. What differs is on purpose: every failure raises
``zinf.IoError`` (an ``OSError``) naming the file, the offset and the length — a read past the
end of a file, a short transfer, a validation mismatch — where DeepSpeed returns short counts or
aborts the process; and ``free_cpu_locked_tensor`` never frees memory a tensor still uses (the
memory goes back to zinf's pool when the last tensor over it is freed).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Optional, Tuple, Union

import torch

from zinf import _native
from zinf import torch as ztorch

__all__ = ["AsyncIOBuilder", "PinMemoryBuilder", "aio_handle", "pin_handle", "aio_read",
           "aio_write", "deepspeed_memcpy", "DeepSpeedCPUAdam", "CPUAdamBuilder",
           "CPUAdamDeviceError"]


# A file as DeepSpeed's calls take it: a path, or an open descriptor (an int).
FileArg = Union[str, bytes, "os.PathLike[str]", int]


def _target(filename, what="filename"):
    """(path, None) or (None, fd) for what a caller gave as the file: an int (not a bool) is an
    open descriptor, a str, bytes or os.PathLike a path, anything else a TypeError. A path with
    a NUL byte is a ValueError (the OS would silently cut it there)."""
    if isinstance(filename, bool):
        raise TypeError(f"zinf: {what} must be a path or a file descriptor, got a bool")
    if isinstance(filename, int):
        if filename < 0:
            raise ValueError(f"zinf: file descriptor {filename} is not valid")
        return None, filename
    if isinstance(filename, (str, bytes, os.PathLike)):
        return ztorch.fs_path(filename, what), None
    raise TypeError(f"zinf: {what} must be a path (str, bytes, os.PathLike) or a file "
                    f"descriptor (int), got {type(filename).__name__}")


def _storage_of(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # torch < 2


def _may_move(t):
    """True if `t`'s bytes could be reallocated under an operation in flight: its storage is
    resizable (torch.empty's is; zinf's pinned tensors, torch.frombuffer's and numpy's are
    not). torch < 2 cannot tell: anything outside zinf's pinned memory counts as resizable."""
    storage = _storage_of(t)
    if hasattr(storage, "resizable"):
        return bool(storage.resizable())
    return not (_locked.holds(t) or ztorch.is_zinf_pinned(t))


def _aligned_like(t):
    """An uninitialised tensor shaped like `t` at a 4096-byte aligned address (so the
    operation can still use O_DIRECT), in plain memory: an in-flight operation's own bytes
    must not count against zinf's pinned budget."""
    nbytes = t.numel() * t.element_size()
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    start = -raw.data_ptr() % 4096
    return raw[start:start + nbytes].view(t.dtype).view(t.shape)


def _copy_back_unless_moved(buffer, host, filename, offset):
    """What an asynchronous read into a resizable CPU tensor does once its bytes are in:
    copies them into `buffer`, unless it was resized (or re-pointed) meanwhile, which raises
    from wait() naming the file and offset (the bytes would not fit what the tensor is now)."""
    address, shape = buffer.data_ptr(), tuple(buffer.shape)

    def done():
        if buffer.data_ptr() != address or tuple(buffer.shape) != shape:
            raise ValueError(f"zinf: the buffer of the read of {filename!r} at offset {offset} "
                             f"was resized while the read was in flight (shape {list(shape)} "
                             f"-> {list(buffer.shape)}); its bytes were not copied into it")
        buffer.copy_(host)
    return done


class _LockedTensors:
    """The process-wide registry of tensors handed out by ``new_cpu_locked_tensor``, shared by
    every ``aio_handle`` and ``pin_handle`` as DeepSpeed's pinned-tensor manager is. It holds
    each tensor until it is freed; the memory (zinf's pinned pool) goes back when the last
    tensor over it is dropped, never while a caller still uses it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_address = {}  # data_ptr -> (tensor, nbytes)

    def new(self, num_elem, example):
        if not isinstance(example, torch.Tensor):
            raise TypeError("zinf: example_tensor must be a torch.Tensor, got "
                            f"{type(example).__name__}")
        n = ztorch.int_arg(num_elem, "num_elem", 0, ztorch.MAX_ELEMENTS)
        t = ztorch.pinned_zeros((n,), example.dtype)
        if t.numel() > 0:
            with self._lock:
                self._by_address[t.data_ptr()] = (t, t.numel() * t.element_size())
        return t

    def free(self, address):
        with self._lock:
            return self._by_address.pop(int(address), None) is not None

    def holds(self, tensor):
        """True if all of `tensor`'s bytes lie in one registered tensor (views included)."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return False
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        with self._lock:
            return any(base <= start and end <= base + n
                       for base, (_, n) in self._by_address.items())


_locked = _LockedTensors()


def _is_pinned(tensor):
    if _locked.holds(tensor):
        return True
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return False
    if ztorch.is_zinf_pinned(tensor):
        return True
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:  # torch without CUDA may refuse the question
        return False


class pin_handle:  # noqa: N801  (DeepSpeed's name)
    """DeepSpeed's ``pin_handle`` (``PinMemoryBuilder().load().pin_handle()``): page-locked CPU
    tensors from the registry every ``aio_handle`` shares."""

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A zeroed 1-D tensor of `num_elem` elements of example_tensor's dtype in zinf's
        pinned pool (4096-byte aligned)."""
        return _locked.new(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, locked_tensor):
        """True if `locked_tensor` came from new_cpu_locked_tensor and was not freed yet (a
        second free returns False). The registry lets go of it; the memory returns to the pool
        when the caller's last reference goes, never under a tensor still in use."""
        return _locked.free(locked_tensor.data_ptr())

    def free_cpu_locked_tensor_by_ptr(self, address):
        return _locked.free(address)

    def is_pinned(self, buffer):
        """True if `buffer` lies inside a registered tensor, in zinf's pinned pool, or torch
        reports it pinned."""
        return _is_pinned(buffer)


class aio_handle:  # noqa: N801  (DeepSpeed's name)
    """DeepSpeed's ``aio_handle``: asynchronous reads and writes of whole tensors.

    ``block_size`` (any positive value, as DeepSpeed) splits requests into pieces of that size
    rounded up to 4096 bytes (zinf's I/O stays page-aligned; ``get_block_size()`` returns what
    was given); ``queue_depth`` pieces in flight (at most 4096 are used); ``single_submit`` and
    ``overlap_events`` are accepted and reported by their getters (zinf always batches and
    overlaps); ``intra_op_parallelism`` (DeepSpeed's older ``num_threads``) sets the threads
    backend's workers where io_uring is unavailable.

    Every I/O method takes as its file either a path (str, bytes, os.PathLike: opened, and
    created for writes) or an open file descriptor (int, also as ``fd=``), which is used as it
    is: never closed, its flags unchanged; with O_DIRECT the offset and length must be
    multiples of the file system's alignment, and a misaligned buffer goes through an aligned
    bounce buffer. Anything else is a TypeError: no call form creates a file the caller did not
    name. A buffer in GPU memory goes through a pinned host bounce buffer.

    Returns: ``read``/``write`` 0 as DeepSpeed's, the parallel synchronous calls 1 (the
    operations completed), asynchronous calls 0, ``wait()`` the number of asynchronous
    operations it completed (with one thread: those submitted since the last ``wait()``). A
    failed asynchronous operation raises from ``wait()`` after every other one has ended, so
    no buffer is still being read or written when the exception reaches the caller; the handle
    stays usable.

    One handle may be shared by threads: each asynchronous operation keeps its tensors alive
    until it is complete, and ``wait()`` returns once every operation submitted before it is
    complete, whichever thread's ``wait()`` completed it. An asynchronous operation on a tensor
    whose storage torch may reallocate (``resize_``) reads or writes through aligned memory of
    its own (one copy), so a resize in flight frees nothing under the I/O.
    """

    def __init__(self, block_size: int = 1048576, queue_depth: int = 128,
                 single_submit: bool = False, overlap_events: bool = False,
                 intra_op_parallelism: int = 1, num_threads: Optional[int] = None) -> None:
        if num_threads is not None:
            intra_op_parallelism = num_threads
        i32 = (1 << 31) - 1  # the native handle's ints
        self._h = _native.AioHandle(ztorch.int_arg(block_size, "block_size", 1, i32),
                                    ztorch.int_arg(queue_depth, "queue_depth", 1, i32),
                                    bool(single_submit), bool(overlap_events),
                                    ztorch.int_arg(intra_op_parallelism, "intra_op_parallelism",
                                                   1, i32))

    # Getters, as DeepSpeed names them.
    def get_block_size(self):
        return self._h.get_block_size()

    def get_queue_depth(self):
        return self._h.get_queue_depth()

    def get_single_submit(self):
        return self._h.get_single_submit()

    def get_overlap_events(self):
        return self._h.get_overlap_events()

    def get_intra_op_parallelism(self):
        return self._h.get_intra_op_parallelism()

    def get_thread_count(self):  # DeepSpeed before intra_op_parallelism
        return self._h.get_intra_op_parallelism()

    def get_alignment(self):
        """Bytes that the offsets and lengths of O_DIRECT I/O should be multiples of (4096)."""
        return self._h.get_alignment()

    def _op(self, write, buffer, filename, validate, async_op, file_offset):
        path, fd = _target(filename)
        if not isinstance(buffer, torch.Tensor):
            raise ValueError(f"zinf: buffer must be a torch.Tensor, got {type(buffer).__name__}")
        offset = ztorch.int_arg(file_offset, "file_offset", 0, (1 << 63) - 1)  # an off_t
        host = buffer
        if buffer.device.type != "cpu":
            if not buffer.is_contiguous():
                raise ValueError("zinf: buffer must be contiguous")
            host = ztorch.pinned_empty(buffer.shape, buffer.dtype)
        elif async_op and _may_move(buffer):
            # A resize_ while the operation is in flight would free these bytes under the I/O
            # (torch reallocates the storage in place, references or not): the I/O goes
            # through memory of the operation's own.
            ztorch.address_of(buffer, "buffer")
            host = _aligned_like(buffer)
        if write and host is not buffer:
            host.copy_(buffer)
        address, nbytes = ztorch.address_of(host, "buffer")
        on_done = None
        if not write and host is not buffer:
            if async_op and buffer.device.type == "cpu":
                on_done = _copy_back_unless_moved(buffer, host, filename, offset)
            else:
                on_done = functools.partial(buffer.copy_, host)
        # Alive until the operation is complete, whichever thread's wait() completes it.
        keep = (buffer, host, _storage_of(host)) if async_op else None
        if fd is None:
            fn = self._h.pwrite if write else self._h.pread
            r = fn(address, nbytes, path, bool(validate), bool(async_op), offset, keep, on_done)
        else:
            fn = self._h.pwrite_fd if write else self._h.pread_fd
            r = fn(address, nbytes, fd, bool(validate), bool(async_op), offset, keep, on_done)
        if not async_op and on_done is not None:
            on_done()
        return r

    # DeepSpeed's positional order and keyword names; `async` is a Python keyword, so it comes
    # as **{"async": ...} (DeepSpeed's binding name) or as async_op.
    @staticmethod
    def _async_flag(async_op, kwargs, method):
        if "async" in kwargs:
            async_op = kwargs.pop("async")
        if kwargs:
            raise TypeError(f"{method}() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        return bool(async_op)

    @staticmethod
    def _file(filename, fd, method):
        if fd is not None:
            if filename is not None:
                raise TypeError(f"{method}() takes filename or fd, not both")
            if isinstance(fd, bool) or not isinstance(fd, int):
                raise TypeError(f"{method}(): fd must be an int, got {type(fd).__name__}")
            return fd
        if filename is None:
            raise TypeError(f"{method}() missing the file: filename (a path) or fd")
        return filename

    def pread(self, buffer, filename=None, validate=False, async_op=False, file_offset=0,
              fd=None, **kwargs):
        """Reads buffer.nbytes from the file at `file_offset` into `buffer`."""
        a = self._async_flag(async_op, kwargs, "pread")
        return self._op(False, buffer, self._file(filename, fd, "pread"), validate, a,
                        file_offset)

    def pwrite(self, buffer, filename=None, validate=False, async_op=False, file_offset=0,
               fd=None, **kwargs):
        """Writes `buffer` to the file at `file_offset` (a path is created if missing)."""
        a = self._async_flag(async_op, kwargs, "pwrite")
        return self._op(True, buffer, self._file(filename, fd, "pwrite"), validate, a,
                        file_offset)

    def read(self, buffer, filename=None, validate=False, file_offset=0, fd=None):
        """Synchronous read; returns 0 as DeepSpeed's."""
        self._op(False, buffer, self._file(filename, fd, "read"), validate, False, file_offset)
        return 0

    def write(self, buffer, filename=None, validate=False, file_offset=0, fd=None):
        """Synchronous write; returns 0 as DeepSpeed's."""
        self._op(True, buffer, self._file(filename, fd, "write"), validate, False, file_offset)
        return 0

    def sync_pread(self, buffer, filename=None, file_offset=0, fd=None):
        return self._op(False, buffer, self._file(filename, fd, "sync_pread"), False, False,
                        file_offset)

    def sync_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        return self._op(True, buffer, self._file(filename, fd, "sync_pwrite"), False, False,
                        file_offset)

    def async_pread(self, buffer, filename=None, file_offset=0, fd=None):
        return self._op(False, buffer, self._file(filename, fd, "async_pread"), False, True,
                        file_offset)

    def async_pwrite(self, buffer, filename=None, file_offset=0, fd=None):
        return self._op(True, buffer, self._file(filename, fd, "async_pwrite"), False, True,
                        file_offset)

    def wait(self):
        """Completes the asynchronous operations submitted so far (every thread's: it
        returns once those this thread submitted are complete, even where another thread's
        wait() completed them); returns how many this call completed. Their failures raise
        from the wait() that completed them."""
        return self._h.wait()

    def new_cpu_locked_tensor(self, num_elem, example_tensor=None, example_tenosr=None):
        """A zeroed 1-D tensor of `num_elem` elements of the example's dtype in zinf's pinned
        pool (4096-byte aligned, so O_DIRECT applies), in the registry every handle shares.
        ``example_tenosr`` is DeepSpeed's keyword (sic)."""
        example = example_tensor if example_tensor is not None else example_tenosr
        if example is None:
            raise TypeError("new_cpu_locked_tensor() missing the example tensor")
        return _locked.new(num_elem, example)

    def free_cpu_locked_tensor(self, tensor):
        """As pin_handle.free_cpu_locked_tensor."""
        return _locked.free(tensor.data_ptr())

    def is_pinned(self, buffer):
        """As pin_handle.is_pinned."""
        return _is_pinned(buffer)


def _read_write(write, buffer, filename, block_size, queue_depth, single_submit, overlap_events,
                validate):
    h = aio_handle(block_size, queue_depth, single_submit, overlap_events)
    h._op(write, buffer, filename, validate, False, 0)
    return 0


def aio_read(buffer: torch.Tensor, filename: FileArg, block_size: int, queue_depth: int,
             single_submit: bool, overlap_events: bool, validate: bool) -> int:
    """DeepSpeed's module-level read of a whole tensor from `filename`; returns 0."""
    return _read_write(False, buffer, filename, block_size, queue_depth, single_submit,
                       overlap_events, validate)


def aio_write(buffer: torch.Tensor, filename: FileArg, block_size: int, queue_depth: int,
              single_submit: bool, overlap_events: bool, validate: bool) -> int:
    """DeepSpeed's module-level write of a whole tensor to `filename`; returns 0."""
    return _read_write(True, buffer, filename, block_size, queue_depth, single_submit,
                       overlap_events, validate)


def deepspeed_memcpy(dest: torch.Tensor, src: torch.Tensor) -> int:
    """Copies `src` into `dest` (same number of bytes); returns 0 as DeepSpeed's."""
    if dest.numel() * dest.element_size() != src.numel() * src.element_size():
        raise ValueError("zinf: deepspeed_memcpy needs dest and src of the same byte size")
    dest.view(-1).view(torch.uint8).copy_(src.reshape(-1).view(torch.uint8))
    return 0


class _AioOp:
    """What ``AsyncIOBuilder().load()`` returns: DeepSpeed's async_io module."""

    aio_handle = aio_handle
    aio_read = staticmethod(aio_read)
    aio_write = staticmethod(aio_write)
    deepspeed_memcpy = staticmethod(deepspeed_memcpy)


class _Builder:
    """DeepSpeed's op builders: is_compatible() and load() giving the op's module; zinf's ops
    are built with the package (no JIT build)."""

    NAME = ""
    _op: Any = None

    def is_compatible(self, verbose=False):
        return True

    def load(self, verbose=True):
        return self._op


class _PinOp:
    pin_handle = pin_handle


class AsyncIOBuilder(_Builder):
    """DeepSpeed's op builder for async I/O."""

    NAME = "async_io"
    _op = _AioOp()


class PinMemoryBuilder(_Builder):
    """DeepSpeed's op builder for page-locked tensors."""

    NAME = "pin_memory"
    _op = _PinOp()


class CPUAdamDeviceError(ValueError, AssertionError):
    """A parameter or gradient not in CPU memory: a ValueError as zinf's other refusals, an
    AssertionError as DeepSpeed's CPU Adam raises."""


class DeepSpeedCPUAdam(ztorch._CpuAdamBase):
    """DeepSpeed's CPU Adam: its constructor arguments and methods, zinf's kernel (run-time
    SIMD choice).

    Parameters float32, bfloat16 or float16 (CPU, contiguous), updated with fp32 arithmetic:
    a bf16/fp16 parameter is widened, updated and rounded back (nearest even) in the kernel's
    pass, as DeepSpeed does. Moments float32 (``fp32_optimizer_states=True``, the default) or
    in the parameter's dtype (``False``: bf16 moments through the kernel's bf16 codec; fp16
    moments through fp32 copies). ``adamw_mode`` True: decoupled weight decay (AdamW), else L2
    (Adam). ``amsgrad=True`` raises. ``threads``: the kernel's threads, by default
    ``torch.get_num_threads()`` (OMP_NUM_THREADS), as DeepSpeed's OpenMP loop.

    ``step_subgroup(i)`` updates every parameter with a gradient against the moments and the
    step count kept under ``state[i]`` (ZeRO-3's subgroups), ``rollback_subgroup(i)`` undoes
    the last one (DeepSpeed's RuntimeErrors when there is nothing to undo). What differs on
    purpose: a step whose hyper-parameters the kernel refuses (``lr=inf``, ``eps=0``) raises a
    ValueError before any parameter, moment or step count changes (DeepSpeed updates with
    them); a parameter outside CPU memory raises ``CPUAdamDeviceError`` (an AssertionError).
    """

    optimizer_id = 0

    def __init__(self, model_params: ztorch.Params, lr: float = 1e-3,
                 bias_correction: bool = True, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False,
                 adamw_mode: bool = True, fp32_optimizer_states: bool = True, *,
                 threads: Optional[int] = None) -> None:
        if threads is None:
            threads = torch.get_num_threads()
        super().__init__(model_params, lr, betas, eps, weight_decay, amsgrad, adamw_mode,
                         int(threads))
        for group in self.param_groups:
            group["bias_correction"] = bias_correction
            group.setdefault("amsgrad", False)
        self.adam_w_mode = adamw_mode
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self.opt_id = DeepSpeedCPUAdam.optimizer_id
        DeepSpeedCPUAdam.optimizer_id += 1

    def _moment_dtype(self, p):
        return torch.float32 if self.fp32_optimizer_states else p.dtype

    @staticmethod
    def _check_param(p):
        if p.device.type != "cpu":
            raise CPUAdamDeviceError(
                f"CPUAdam param is on {p.device} and must be 'cpu', make sure you enabled "
                "'offload_optimizer': 'cpu' in your ZeRO config.")
        if p.grad is not None and p.grad.device.type != "cpu":
            raise CPUAdamDeviceError(f"zinf: the gradient is on {p.grad.device}, must be 'cpu'")
        ztorch.dtype_name(p.dtype)
        ztorch.address_of(p, "parameter")

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        if fp16_param_groups is not None:
            raise ValueError("zinf: fp16_param_groups is not supported; copy the fp32 "
                             "parameters out after step()")
        return super().step(closure)

    @torch.no_grad()
    def step_subgroup(self, subgroup_id, closure=None):
        """Updates the parameters with a gradient against ``state[subgroup_id]``'s moments
        and step count (made on first use, shaped like the parameter)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = self._cpu_work(1.0)
        state = self.state[subgroup_id]
        # Every parameter is checked against the subgroup's moments before any is updated.
        self._step_cpu(work, 1.0, [state] * len(work), f"step_subgroup({subgroup_id})")
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, sub_group_id, closure=None):
        """Undoes the last step_subgroup(sub_group_id): the moments and the parameters as they
        were before it (up to fp32 rounding), the step count one lower. Needs the same
        gradients as that step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if sub_group_id not in self.state or len(self.state[sub_group_id]) == 0:
            raise RuntimeError(f"Cannot rollback optimizer state for sub_group_id {sub_group_id} "
                               "as it has not been initialized.")
        state = self.state[sub_group_id]
        if int(state.get("step", 0)) <= 0:
            raise RuntimeError(f"Cannot rollback sub_group_id {sub_group_id}: "
                               f"step count is {state.get('step', 0)}")
        work = self._cpu_work(1.0)
        # Everything is checked before the first parameter is rolled back: a refused rollback
        # changes nothing.
        wheres = self._wheres(f"rollback_subgroup({sub_group_id})")
        for group, p, grad in work:
            ztorch.check_update_tensors(wheres[id(p)], p, grad, state["exp_avg"],
                                        state["exp_avg_sq"])
            ztorch.check_rollback(self.adam_w_mode, group)
        for group, p, grad in work:
            ztorch.adam_rollback(self.adam_w_mode, int(state["step"]), group, p, grad,
                                 state["exp_avg"], state["exp_avg_sq"], wheres[id(p)])
            state["step"] = int(state["step"]) - 1
        return loss


class _CpuAdamOp:
    """What ``CPUAdamBuilder().load()`` returns: DeepSpeed's cpu_adam module, functions over
    optimizers numbered by the caller. adam_update/adam_rollback return 0; a refusal raises
    (DeepSpeed prints and returns -1)."""

    def __init__(self):
        self._optimizers = {}  # id -> (kernel, adamw, lr, betas, eps, weight_decay)
        self._lock = threading.Lock()

    def create_adam(self, optimizer_id, alpha=1e-3, betta1=0.9, betta2=0.999, eps=1e-8,
                    weight_decay=0, adamw_mode=True, should_log=False):
        _native.check_adam(float(alpha), float(betta1), float(betta2), float(eps),
                           float(weight_decay))
        kernel = _native.CpuAdam(torch.get_num_threads())
        with self._lock:
            self._optimizers[int(optimizer_id)] = (kernel, bool(adamw_mode))
        return 0

    def destroy_adam(self, optimizer_id):
        with self._lock:
            self._optimizers.pop(int(optimizer_id), None)
        return 0

    def _get(self, optimizer_id):
        with self._lock:
            found = self._optimizers.get(int(optimizer_id))
        if found is None:
            raise ValueError(f"zinf: no CPU Adam optimizer {optimizer_id} (create_adam first)")
        return found

    @staticmethod
    def _group(lr, beta1, beta2, eps, weight_decay, bias_correction):
        _native.check_adam(float(lr), float(beta1), float(beta2), float(eps),
                           float(weight_decay))
        return {"lr": float(lr), "betas": (float(beta1), float(beta2)), "eps": float(eps),
                "weight_decay": float(weight_decay), "bias_correction": bool(bias_correction)}

    def _checked(self, optimizer_id, lr, beta1, beta2, eps, weight_decay, bias_correction,
                 tensors):
        """(kernel, adamw, group) after every check of an update or rollback's arguments."""
        kernel, adamw = self._get(optimizer_id)
        group = self._group(lr, beta1, beta2, eps, weight_decay, bias_correction)
        for name, t in zip(("params", "grads", "exp_avg", "exp_avg_sq"), tensors):
            ztorch.tensor_arg(t, name)  # a dense torch.Tensor
            if t.device.type != "cpu":
                raise CPUAdamDeviceError(f"zinf: {name} is on {t.device}, must be 'cpu'")
        # Sizes, dtypes, layouts and overlaps: the door of adam_update / adam_rollback.
        return kernel, adamw, group

    def adam_update(self, optimizer_id, step, lr, beta1, beta2, epsilon, weight_decay,
                    bias_correction, params, grads, exp_avg, exp_avg_sq):
        tensors = (params, grads, exp_avg, exp_avg_sq)
        kernel, adamw, group = self._checked(optimizer_id, lr, beta1, beta2, epsilon,
                                             weight_decay, bias_correction, tensors)
        ztorch.adam_update(kernel, adamw, step, group, *tensors)
        return 0

    def adam_rollback(self, optimizer_id, step, lr, beta1, beta2, epsilon, weight_decay,
                      bias_correction, params, grads, exp_avg, exp_avg_sq):
        tensors = (params, grads, exp_avg, exp_avg_sq)
        _, adamw, group = self._checked(optimizer_id, lr, beta1, beta2, epsilon, weight_decay,
                                        bias_correction, tensors)
        ztorch.adam_rollback(adamw, ztorch.int_arg(step, "step"), group, *tensors)
        return 0


class CPUAdamBuilder(_Builder):
    """DeepSpeed's op builder for CPU Adam."""

    NAME = "cpu_adam"
    _op = _CpuAdamOp()
