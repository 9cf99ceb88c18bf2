# SPDX-License-Identifier: Apache-2.0
# zinf.torch.pinned_empty / pinned_zeros: shape, dtype, alignment, zeroing, the budget (its
# error names the budget; memory returns to the pool when the tensor is freed).
import subprocess
import sys
import textwrap

import pytest
import torch

import zinf
from zinf.torch import is_zinf_pinned, pinned_empty, pinned_zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_pinned_zeros_have_their_shape_dtype_and_alignment(dtype):
    t = pinned_zeros((3, 5, 7), dtype)
    assert t.shape == (3, 5, 7) and t.dtype == dtype
    assert t.data_ptr() % 4096 == 0
    assert torch.count_nonzero(t) == 0
    assert is_zinf_pinned(t)
    e = pinned_empty(10)
    assert e.shape == (10,) and e.dtype == torch.float32


def test_zero_elements_give_an_empty_tensor():
    assert pinned_zeros((0, 4)).shape == (0, 4)


def run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_budget_is_enforced_and_memory_returns_with_the_tensor():
    r = run("""
        import gc, zinf, torch
        from zinf.torch import pinned_empty
        zinf.set_pinned_budget(1 << 20)
        a = pinned_empty(600 * 1024, torch.uint8)
        try:
            pinned_empty(600 * 1024, torch.uint8)
            print("no error")
        except zinf.IoError as e:
            print("kind", e.kind)
            print("text", str(e))
        del a
        gc.collect()
        b = pinned_empty(600 * 1024, torch.uint8)
        print("after free ok", b.numel())
    """)
    assert r.returncode == 0, r.stderr
    assert "kind resource" in r.stdout
    assert "budget of 1048576 bytes is in use" in r.stdout
    assert "after free ok 614400" in r.stdout


def test_budget_cannot_change_once_the_pool_exists():
    pinned_zeros(1)
    with pytest.raises(ValueError, match="set it before the first pinned allocation"):
        zinf.set_pinned_budget(1 << 30)
