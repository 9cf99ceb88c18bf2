# SPDX-License-Identifier: Apache-2.0
# zinf.compat.deepspeed's CPU Adam as DeepSpeed documents it: float32, bfloat16 and float16
# parameters with fp32 moments (fp32 arithmetic, the parameter rounded back), moments in the
# parameter's dtype with fp32_optimizer_states=False, step_subgroup / rollback_subgroup with
# a step count per subgroup and DeepSpeed's errors, the op-level CPUAdamBuilder functions, the
# thread count from torch, and an AssertionError for a parameter outside CPU memory.
import pytest
import torch

from zinf.compat.deepspeed import CPUAdamBuilder, CPUAdamDeviceError, DeepSpeedCPUAdam


def reference_adamw(x, grads, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.0):
    """fp32 AdamW in torch operations, as the parameter dtype's rounding sees it."""
    p = x.to(torch.float32).clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.to(torch.float32)
        p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        p = p.to(x.dtype).to(torch.float32)  # the parameter holds its own dtype between steps
    return p, m, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_parameter_dtype_with_fp32_moments(dtype):
    torch.manual_seed(0)
    x = torch.randn(5000).to(dtype)
    grads = [torch.randn(5000).to(dtype) for _ in range(6)]
    p = torch.nn.Parameter(x.clone())
    opt = DeepSpeedCPUAdam([p], lr=1e-2)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    assert p.dtype == dtype
    st = opt.state[p]
    assert st["exp_avg"].dtype == torch.float32 and int(st["step"]) == 6
    ref, m, v = reference_adamw(x, grads, lr=1e-2)
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert torch.allclose(p.detach().float(), ref, atol=tol, rtol=0)
    assert torch.allclose(st["exp_avg"], m, atol=1e-6)
    assert torch.allclose(st["exp_avg_sq"], v, atol=1e-6)


def test_a_bf16_parameter_is_the_fp32_update_rounded_to_nearest_even():
    torch.manual_seed(1)
    x = torch.randn(4096).to(torch.bfloat16)
    g = torch.randn(4096).to(torch.bfloat16)
    p = torch.nn.Parameter(x.clone())
    opt = DeepSpeedCPUAdam([p], lr=1e-2)
    p.grad = g.clone()
    opt.step()
    q = torch.nn.Parameter(x.clone().float())
    ref = DeepSpeedCPUAdam([q], lr=1e-2)
    q.grad = g.float()  # the same values: bf16 widens exactly
    ref.step()
    assert torch.equal(p.detach(), q.detach().to(torch.bfloat16))  # torch's .to() rounds RNE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moments_in_the_parameter_dtype_track_fp32_moments(dtype):
    torch.manual_seed(2)
    base = torch.randn(3000).to(dtype)
    a = torch.nn.Parameter(base.clone())
    b = torch.nn.Parameter(base.clone())
    oa = DeepSpeedCPUAdam([a], fp32_optimizer_states=True)
    ob = DeepSpeedCPUAdam([b], fp32_optimizer_states=False)
    for _ in range(10):
        g = torch.randn(3000).to(dtype)
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    assert ob.state[b]["exp_avg"].dtype == dtype
    assert ob.state[b]["exp_avg_sq"].dtype == dtype
    assert oa.state[a]["exp_avg"].dtype == torch.float32
    assert torch.allclose(ob.state[b]["exp_avg"].float(), oa.state[a]["exp_avg"], atol=2e-2)
    assert (a.detach().float() - b.detach().float()).abs().max() < 5e-2


def test_fp32_parameters_keep_fp32_moments_whatever_the_flag():
    p = torch.nn.Parameter(torch.randn(100))
    opt = DeepSpeedCPUAdam([p], fp32_optimizer_states=False)
    p.grad = torch.randn(100)
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.float32


def test_subgroups_count_their_own_steps_and_roll_back():
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(256))
    opt = DeepSpeedCPUAdam([p], lr=1e-2)
    p.grad = torch.randn(256)
    start = p.detach().clone()
    opt.step_subgroup(0)
    after_one = (p.detach().clone(), opt.state[0]["exp_avg"].clone(),
                 opt.state[0]["exp_avg_sq"].clone())
    opt.step_subgroup(1)
    opt.step_subgroup(0)
    assert int(opt.state[0]["step"]) == 2 and int(opt.state[1]["step"]) == 1
    assert p not in opt.state or len(opt.state[p]) == 0  # a subgroup's state is its own
    opt.rollback_subgroup(0)
    assert int(opt.state[0]["step"]) == 1 and int(opt.state[1]["step"]) == 1
    assert torch.allclose(opt.state[0]["exp_avg"], after_one[1], atol=1e-6)
    assert torch.allclose(opt.state[0]["exp_avg_sq"], after_one[2], atol=1e-7)
    opt.rollback_subgroup(1)
    opt.rollback_subgroup(0)
    assert torch.allclose(p.detach(), start, atol=1e-5)
    assert torch.allclose(opt.state[0]["exp_avg"], torch.zeros(256), atol=1e-6)
    with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 0: step count is 0"):
        opt.rollback_subgroup(0)
    with pytest.raises(RuntimeError,
                       match="Cannot rollback optimizer state for sub_group_id 7 as it has not "
                             "been initialized"):
        opt.rollback_subgroup(7)


@pytest.mark.parametrize("adamw_mode", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_rollback_undoes_an_update_in_either_mode(adamw_mode, wd):
    torch.manual_seed(4)
    p = torch.nn.Parameter(torch.randn(1000))
    opt = DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=wd, adamw_mode=adamw_mode)
    for _ in range(3):
        p.grad = torch.randn(1000)
        opt.step_subgroup(0)
    before = (p.detach().clone(), opt.state[0]["exp_avg"].clone(),
              opt.state[0]["exp_avg_sq"].clone())
    p.grad = torch.randn(1000)
    opt.step_subgroup(0)
    opt.rollback_subgroup(0)
    assert int(opt.state[0]["step"]) == 3
    assert torch.allclose(p.detach(), before[0], atol=1e-5)
    assert torch.allclose(opt.state[0]["exp_avg"], before[1], atol=1e-6)
    assert torch.allclose(opt.state[0]["exp_avg_sq"], before[2], atol=1e-6)


def test_the_op_level_builder_matches_the_optimizer():
    torch.manual_seed(5)
    op = CPUAdamBuilder().load()
    assert op.create_adam(41, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, False) == 0
    x = torch.randn(777)
    p = x.clone()
    m, v = torch.zeros(777), torch.zeros(777)
    q = torch.nn.Parameter(x.clone())
    opt = DeepSpeedCPUAdam([q], lr=1e-2, weight_decay=0.01)
    for step in range(1, 4):
        g = torch.randn(777)
        assert op.adam_update(41, step, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g, m, v) == 0
        q.grad = g.clone()
        opt.step()
    assert torch.equal(p, q.detach())
    assert torch.equal(m, opt.state[q]["exp_avg"])
    assert op.adam_rollback(41, 3, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g, m, v) == 0
    assert op.destroy_adam(41) == 0
    with pytest.raises(ValueError, match="no CPU Adam optimizer 41"):
        op.adam_update(41, 1, 1e-2, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)


def test_threads_follow_torch_unless_given(monkeypatch):
    p = torch.nn.Parameter(torch.randn(10))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert DeepSpeedCPUAdam([p])._threads == 1
    assert DeepSpeedCPUAdam([p], threads=2)._threads == 2


def test_a_parameter_outside_cpu_memory_is_an_assertion_error():
    p = torch.nn.Parameter(torch.randn(10, device="meta"))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(10, device="meta")
    with pytest.raises(AssertionError, match="must be 'cpu'"):
        opt.step()
    with pytest.raises(CPUAdamDeviceError):
        opt.step_subgroup(0)
    assert issubclass(CPUAdamDeviceError, ValueError)
