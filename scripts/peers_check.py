# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed's own ops in the peers environment (scripts/peers.sh runs this with its python).

With DS_ACCELERATOR=cpu: AsyncIOBuilder().load() and CPUAdamBuilder().load() build the ops
just in time (ninja, DeepSpeed's own flags) and both run: one aio write and read back of a
buffer compared byte for byte, and one DeepSpeedCPUAdam step compared with torch.optim.AdamW
on the same parameters and gradient. It prints which accelerator's op_builder each class came
from, and exits non-zero on the first thing that does not hold.
Usage: python scripts/peers_check.py SCRATCH_DIR   (a folder on a file system with O_DIRECT)
"""

import os
import sys
import time

if os.environ.get("DS_ACCELERATOR") != "cpu":
    sys.exit("peers_check: set DS_ACCELERATOR=cpu (DeepSpeed reads it at import)")

import torch  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder  # noqa: E402


def check(what, ok):
    print(f"peers_check: {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        sys.exit(1)


def load(builder_class):
    print(f"peers_check: {builder_class.__name__} from {builder_class.__module__}", flush=True)
    start = time.monotonic()
    module = builder_class().load()
    print(f"peers_check: {builder_class.__name__}().load() took {time.monotonic() - start:.1f} s"
          f" (a build the first time, cached under ~/.cache/torch_extensions after)", flush=True)
    return module


def aio_round_trip(scratch):
    aio = load(AsyncIOBuilder)
    # block size, queue depth, single submit, overlap events, intra-op parallelism
    handle = aio.aio_handle(1 << 20, 8, False, False, 1)
    nbytes = 4 << 20
    # O_DIRECT needs an aligned buffer: the handle's page-locked allocator gives one.
    out = handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
    back = handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
    out.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(7)))
    back.zero_()
    path = os.path.join(scratch, "peers_check_aio.bin")
    try:
        check(f"aio sync_pwrite of {nbytes} bytes to {path}",
              handle.sync_pwrite(out, path) >= 0 and os.path.getsize(path) == nbytes)
        check("aio sync_pread of the same bytes", handle.sync_pread(back, path) >= 0)
        check("every byte read back is the byte written", bytes(back.numpy()) == bytes(out.numpy()))
    finally:
        if os.path.exists(path):
            os.remove(path)
        handle.free_cpu_locked_tensor(out)
        handle.free_cpu_locked_tensor(back)


def cpu_adam_step():
    load(CPUAdamBuilder)
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    gen = torch.Generator().manual_seed(11)
    init = torch.randn(1 << 16, generator=gen)
    grad = torch.randn(1 << 16, generator=gen)
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ds_p = torch.nn.Parameter(init.clone())
    ref_p = torch.nn.Parameter(init.clone())
    ds_p.grad = grad.clone()
    ref_p.grad = grad.clone()
    DeepSpeedCPUAdam([ds_p], adamw_mode=True, **hp).step()
    torch.optim.AdamW([ref_p], **hp).step()
    diff = (ds_p.detach() - ref_p.detach()).abs().max().item()
    moved = (ds_p.detach() - init).abs().max().item()
    # One step moves each weight by about lr; the two differ only in rounding (DeepSpeed's
    # SIMD kernel against torch's): far below a step.
    check(f"DeepSpeedCPUAdam step moved the weights (max {moved:.3g})", moved > 1e-4)
    check(f"DeepSpeedCPUAdam step == torch AdamW step (max |diff| {diff:.3g} <= 1e-6)",
          diff <= 1e-6)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: peers_check.py SCRATCH_DIR (an existing folder)")
    print(f"peers_check: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
          f"accelerator {get_accelerator().device_name()}", flush=True)
    check("DeepSpeed's accelerator is the CPU's", get_accelerator().device_name() == "cpu")
    aio_round_trip(sys.argv[1])
    cpu_adam_step()
    print("peers_check: DeepSpeed's aio and CPU Adam ops build and run here")


if __name__ == "__main__":
    main()
