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

import torch

from zinf import _native
from zinf import torch as ztorch

__all__ = ["AsyncIOBuilder", "aio_handle", "DeepSpeedCPUAdam"]


class aio_handle:  # noqa: N801  (DeepSpeed's name)
    """DeepSpeed's ``aio_handle``: asynchronous reads and writes of whole CPU tensors.

    ``block_size`` bytes per request piece (a multiple of 4096), ``queue_depth`` pieces in
    flight; ``single_submit`` and ``overlap_events`` are accepted and reported by their getters
    (zinf always batches and overlaps); ``intra_op_parallelism`` (DeepSpeed's older
    ``num_threads``) sets the threads backend's workers where io_uring is unavailable.

    Returns: synchronous calls 1 (the operations completed), asynchronous calls 0, ``wait()``
    the number of asynchronous operations completed since the last ``wait()``. A failed
    asynchronous operation raises from ``wait()`` after every other one has ended, so no
    buffer is still being read or written when the exception reaches the caller.
    """

    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False,
                 overlap_events=False, intra_op_parallelism=1, num_threads=None):
        if num_threads is not None:
            intra_op_parallelism = num_threads
        self._h = _native.AioHandle(int(block_size), int(queue_depth), bool(single_submit),
                                    bool(overlap_events), int(intra_op_parallelism))
        self._inflight = []  # buffers of async operations, alive until wait()

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

    def _op(self, write, buffer, filename, validate, async_op, file_offset):
        address, nbytes = ztorch.address_of(buffer, "buffer")
        fn = self._h.pwrite if write else self._h.pread
        r = fn(address, nbytes, str(filename), bool(validate), bool(async_op), int(file_offset))
        if async_op:
            self._inflight.append(buffer)
        return r

    def pread(self, buffer, filename, validate=False, async_op=False, file_offset=0):
        """Reads buffer.nbytes from `filename` at `file_offset` into `buffer`."""
        return self._op(False, buffer, filename, validate, async_op, file_offset)

    def pwrite(self, buffer, filename, validate=False, async_op=False, file_offset=0):
        """Writes `buffer` to `filename` at `file_offset` (the file is created if missing)."""
        return self._op(True, buffer, filename, validate, async_op, file_offset)

    def read(self, buffer, filename, validate=False):
        return self.pread(buffer, filename, validate, False)

    def write(self, buffer, filename, validate=False):
        return self.pwrite(buffer, filename, validate, False)

    def sync_pread(self, buffer, filename, file_offset=0):
        return self.pread(buffer, filename, False, False, file_offset)

    def sync_pwrite(self, buffer, filename, file_offset=0):
        return self.pwrite(buffer, filename, False, False, file_offset)

    def async_pread(self, buffer, filename, file_offset=0):
        return self.pread(buffer, filename, False, True, file_offset)

    def async_pwrite(self, buffer, filename, file_offset=0):
        return self.pwrite(buffer, filename, False, True, file_offset)

    def wait(self):
        try:
            return self._h.wait()
        finally:
            self._inflight.clear()

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        """A zeroed 1-D tensor of `num_elem` elements of example_tensor's dtype in zinf's pinned
        pool (4096-byte aligned, so O_DIRECT applies)."""
        return ztorch.pinned_zeros((int(num_elem),), example_tensor.dtype)

    def free_cpu_locked_tensor(self, tensor):
        """Returns True. The memory goes back to the pool when the last reference to the tensor
        (and its views) is dropped, never while one still uses it."""
        return ztorch.is_zinf_pinned(tensor)

    def is_pinned(self, tensor):
        """True if `tensor` lies in zinf's pinned pool, or torch reports it pinned."""
        if ztorch.is_zinf_pinned(tensor):
            return True
        try:
            return bool(tensor.is_pinned())
        except RuntimeError:  # torch without CUDA may refuse the question
            return False


class _AioOp:
    """What ``AsyncIOBuilder().load()`` returns: the module with ``aio_handle``."""

    aio_handle = aio_handle


class AsyncIOBuilder:
    """DeepSpeed's op builder for async I/O; zinf's needs no JIT build."""

    NAME = "async_io"

    def is_compatible(self, verbose=False):
        return True

    def load(self, verbose=True):
        return _AioOp()


class DeepSpeedCPUAdam(ztorch._CpuAdamBase):
    """DeepSpeed's CPU Adam: its constructor arguments, zinf's kernel (run-time SIMD choice).

    ``adamw_mode`` True: decoupled weight decay (AdamW), else L2 (Adam). ``amsgrad=True``
    raises. Optimizer states are float32 (``fp32_optimizer_states=False`` raises: zinf keeps
    fp32 moments).
    """

    optimizer_id = 0

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
                 fp32_optimizer_states=True):
        if not fp32_optimizer_states:
            raise ValueError("zinf: fp32_optimizer_states=False is not supported (fp32 moments)")
        super().__init__(model_params, lr, betas, eps, weight_decay, amsgrad, adamw_mode, 0)
        for group in self.param_groups:
            group["bias_correction"] = bias_correction
        self.adam_w_mode = adamw_mode
        self.opt_id = DeepSpeedCPUAdam.optimizer_id
        DeepSpeedCPUAdam.optimizer_id += 1

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None):
        if fp16_param_groups is not None:
            raise ValueError("zinf: fp16_param_groups is not supported; copy the fp32 "
                             "parameters out after step()")
        return super().step(closure)
