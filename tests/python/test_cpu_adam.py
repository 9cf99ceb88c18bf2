# SPDX-License-Identifier: Apache-2.0
# zinf.torch.Adam / AdamW and zinf.compat.deepspeed.DeepSpeedCPUAdam against torch.optim's
# Adam/AdamW on the same model and gradients (fp32 rounding apart), per-group settings, and
# the refusals.
import pytest
import torch

from zinf import _native
from zinf.compat.deepspeed import DeepSpeedCPUAdam
from zinf.torch import Adam, AdamW, tensor_arg


def model_and_copy(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(37, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    c = torch.nn.Sequential(torch.nn.Linear(37, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    c.load_state_dict(m.state_dict())
    return m, c


def train(model, opt, steps=6):
    torch.manual_seed(42)
    for _ in range(steps):
        x = torch.randn(16, 37)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("zinf_cls,torch_cls,wd", [(AdamW, torch.optim.AdamW, 0.05),
                                                    (Adam, torch.optim.Adam, 0.01),
                                                    (Adam, torch.optim.Adam, 0.0)])
def test_matches_torch_optim(zinf_cls, torch_cls, wd):
    a, b = model_and_copy()
    train(a, zinf_cls(a.parameters(), lr=1e-2, weight_decay=wd))
    train(b, torch_cls(b.parameters(), lr=1e-2, weight_decay=wd))
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=2e-5, atol=2e-6)


def test_param_groups_keep_their_own_lr_and_weight_decay():
    a, b = model_and_copy()
    groups = lambda m: [{"params": m[0].parameters(), "weight_decay": 0.0},  # noqa: E731
                        {"params": m[2].parameters(), "lr": 3e-3}]
    train(a, AdamW(groups(a), lr=1e-2, weight_decay=0.1))
    train(b, torch.optim.AdamW(groups(b), lr=1e-2, weight_decay=0.1))
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernel_widens_half_gradients_exactly(dtype):
    kernel = _native.CpuAdam(1)
    torch.manual_seed(7)
    g = torch.randn(4099).to(dtype)
    results = []
    for grads in (g, g.to(torch.float32)):
        p, m, v = torch.ones(4099), torch.zeros(4099), torch.zeros(4099)
        for step in (1, 2):
            kernel.step(tensor_arg(p, "p"), tensor_arg(grads, "g"), tensor_arg(m, "m"),
                        tensor_arg(v, "v"), 1e-2, 0.9, 0.999, 1e-8, 0.01, step, True, True)
        results.append((p, m, v))
    for x, y in zip(*results):
        assert torch.equal(x, y)


def test_deepspeed_cpu_adam_is_zinf_adamw_bitwise():
    a, b = model_and_copy()
    train(a, DeepSpeedCPUAdam(a.parameters(), lr=1e-2, weight_decay=0.02))
    train(b, AdamW(b.parameters(), lr=1e-2, weight_decay=0.02))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    c, d = model_and_copy()
    train(c, DeepSpeedCPUAdam(c.parameters(), lr=1e-2, weight_decay=0.02, adamw_mode=False))
    train(d, Adam(d.parameters(), lr=1e-2, weight_decay=0.02))
    for pc, pd in zip(c.parameters(), d.parameters()):
        assert torch.equal(pc, pd)


def test_refusals():
    m, _ = model_and_copy()
    with pytest.raises(ValueError, match="amsgrad"):
        DeepSpeedCPUAdam(m.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        AdamW(m.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="learning rate"):
        AdamW(m.parameters(), lr=-1.0)
    half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    opt = AdamW(half.parameters())
    half(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    with pytest.raises(ValueError, match="parameters must be float32"):
        opt.step()


def test_the_prefetch_distance_is_reported_and_a_bad_environment_value_refused(monkeypatch):
    monkeypatch.delenv("ZINF_CPU_ADAM_PREFETCH", raising=False)
    elements, source = _native.CpuAdam(1).prefetch()
    assert source in ("default", "calibrated", "none")
    assert elements in (0, 128, 256, 512, 1024)
    monkeypatch.setenv("ZINF_CPU_ADAM_PREFETCH", "off")
    kernel = _native.CpuAdam(1)
    assert kernel.prefetch() == ((0, "environment") if kernel.isa().startswith("avx")
                                 else (0, "none"))
    monkeypatch.setenv("ZINF_CPU_ADAM_PREFETCH", "far")
    with pytest.raises(ValueError) as e:
        _native.CpuAdam(1)
    assert str(e.value) == ("ZINF_CPU_ADAM_PREFETCH: expected auto, off or a number of elements "
                            "in [1, 65536], got 'far'")
