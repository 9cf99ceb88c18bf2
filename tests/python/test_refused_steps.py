# SPDX-License-Identifier: Apache-2.0
# A step that is refused changes nothing: no parameter, no moment, no step count, in either
# state tier and through the DeepSpeed drop-in (issue: a refused lr=inf step once moved the step
# count, and an NVMe step whose state failed its checksum once copied the update made from the
# changed bytes into the parameters).
import copy
import os

import pytest
import torch

import zinf
from zinf.compat.deepspeed import DeepSpeedCPUAdam
from zinf.torch import AdamW


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 8))


def backward(m, seed=1):
    torch.manual_seed(seed)
    m(torch.randn(4, 64)).pow(2).mean().backward()


def snapshot(m, opt):
    params = [p.detach().clone() for p in m.parameters()]
    state = [{k: (v.clone() if isinstance(v, torch.Tensor) else v)
              for k, v in opt.state[p].items()} if p in opt.state else None
             for p in m.parameters()]
    return params, state


def assert_unchanged(m, opt, before):
    params, state = before
    for p, q, st in zip(m.parameters(), params, state):
        assert torch.equal(p.detach(), q)
        if st is None:
            assert p not in opt.state or len(opt.state[p]) == 0
            continue
        now = opt.state[p]
        assert int(now["step"]) == int(st["step"])
        assert torch.equal(now["exp_avg"], st["exp_avg"])
        assert torch.equal(now["exp_avg_sq"], st["exp_avg_sq"])


def make(kind, m, **kw):
    if kind == "AdamW":
        return AdamW(m.parameters(), **kw)
    return DeepSpeedCPUAdam(m.parameters(), **kw)


@pytest.mark.parametrize("kind", ["AdamW", "DeepSpeedCPUAdam"])
@pytest.mark.parametrize("bad", [{"lr": float("inf")}, {"eps": 0.0}, {"lr": float("nan")},
                                 {"weight_decay": float("inf")}])
def test_a_refused_step_moves_no_count_and_no_value(kind, bad):
    m = model()
    opt = make(kind, m, lr=1e-3)
    backward(m)
    opt.step()  # one good step: state exists
    before = snapshot(m, opt)
    for g in opt.param_groups:
        g.update(bad)
    for _ in range(3):
        with pytest.raises(ValueError, match="cpu adam"):
            opt.step()
        assert_unchanged(m, opt, before)
    for g in opt.param_groups:
        g.update({"lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0})
    opt.step()
    assert all(int(s["step"]) == 2 for s in opt.state.values())


@pytest.mark.parametrize("kind", ["AdamW", "DeepSpeedCPUAdam"])
def test_a_bad_second_group_refuses_before_the_first_is_updated(kind):
    m = model()
    groups = [{"params": m[0].parameters()}, {"params": m[1].parameters(), "lr": float("inf")}]
    opt = AdamW(groups, lr=1e-3) if kind == "AdamW" else DeepSpeedCPUAdam(groups, lr=1e-3)
    backward(m)
    before = snapshot(m, opt)
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert_unchanged(m, opt, before)
    assert all(len(opt.state[p]) == 0 for p in m.parameters())  # not even zero moments


def _swap_files(directory):
    """Paths that reach zinf's open swap files under `directory` (they have no name: through
    /proc/self/fd)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)) and "deleted" in target:
            out.append(f"/proc/self/fd/{fd}")
    return out


def test_an_nvme_step_from_changed_bytes_reaches_no_parameter(tmp_path):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3 << 20))  # 3 sub-groups of 1 Mi elements
    opt = AdamW([p], lr=1e-3, state="nvme", nvme_path=str(tmp_path))
    p.grad = torch.randn_like(p)
    opt.step()
    before = p.detach().clone()
    files = _swap_files(tmp_path)
    assert files, "no swap file found"
    with open(files[0], "r+b") as f:  # the first record's first master weight
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0x40]))
    p.grad = torch.randn_like(p)
    with pytest.raises(zinf.IoError) as info:
        opt.step()
    assert info.value.kind == "corrupt"
    assert torch.equal(p.detach(), before), "a parameter took an update made from changed bytes"


@pytest.mark.parametrize("state", ["cpu", "nvme"])
@pytest.mark.parametrize("bad, match", [
    (lambda st: st.update(exp_avg_sq=st["exp_avg_sq"].to(torch.int64)), "not floating point"),
    (lambda st: st.update(exp_avg_sq=-st["exp_avg_sq"] - 1), "negative"),
    (lambda st: st.update(exp_avg=st["exp_avg"] * float("nan")), "NaN"),
    (lambda st: st.update(step=1.5), "not a whole number"),
    (lambda st: st.update(step=-1), "not a whole number"),
    (lambda st: st.update(exp_avg=st["exp_avg"].flatten()[:3]), "has 3 elements"),
])
def test_load_state_dict_refuses_state_the_kernel_cannot_take(tmp_path, state, bad, match):
    m = model()
    kw = dict(state="nvme", nvme_path=str(tmp_path)) if state == "nvme" else {}
    opt = AdamW(m.parameters(), lr=1e-3, **kw)
    backward(m)
    opt.step()
    # Copies: torch's state_dict() hands out the live state of the cpu tier.
    good = copy.deepcopy(opt.state_dict())
    before = copy.deepcopy(opt.state_dict())
    sd = copy.deepcopy(opt.state_dict())
    bad(sd["state"][0])
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    for k in before["state"]:
        assert torch.equal(before["state"][k]["exp_avg"], after["state"][k]["exp_avg"])
        assert int(before["state"][k]["step"]) == int(after["state"][k]["step"])
    opt.load_state_dict(good)  # a good one still loads


def test_an_offload_used_after_remove_says_so():
    from zinf.torch import offload_parameters
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    off = offload_parameters(m, unit=[m[0], m[1]], device="cpu")
    opt = AdamW(m.parameters())
    m(torch.randn(2, 8)).sum().backward()
    off.step(opt)
    off.remove()
    off.remove()  # a second remove does nothing
    with pytest.raises(ValueError, match=r"step\(\) after remove\(\)"):
        off.step(opt)
    opt.step()  # the optimizer itself still works on the model's parameters


@pytest.mark.parametrize("bad", [1, 64, 32767, 1.5, True])
def test_sub_group_size_has_the_ds_config_minimum_on_every_door(tmp_path, bad):
    import zinf.distributed as zd
    p = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(ValueError, match="sub_group_size must be an int of at least 32768"):
        AdamW([p], state="nvme", nvme_path=str(tmp_path), sub_group_size=bad)
    with pytest.raises(ValueError, match="sub_group_size must be an int of at least 32768"):
        zd.ShardedAdamW([p], state="nvme", nvme_path=str(tmp_path), sub_group_size=bad,
                        process_group=object())
    assert list(tmp_path.iterdir()) == []


def test_a_budget_too_small_is_named_as_the_python_argument(tmp_path):
    p = torch.nn.Parameter(torch.zeros(1 << 20))
    with pytest.raises(ValueError) as info:
        AdamW([p], state="nvme", nvme_path=str(tmp_path), pinned_budget=4096)
    text = str(info.value)
    assert text.startswith("zinf: pinned_budget=4096 cannot hold"), text
    assert "the smallest budget that works is" in text
    assert text.endswith("(pinned_budget=None takes the pipeline's own need)")
    assert list(tmp_path.iterdir()) == []
