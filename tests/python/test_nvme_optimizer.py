# SPDX-License-Identifier: Apache-2.0
# zinf.torch.AdamW/Adam with state="nvme": the masters and moments in swap files, the update
# copied into the parameters. Bitwise what state="cpu" gives, per-group settings and a changed
# learning rate included; save/load resumes bitwise; errors name what failed.
import gc

import pytest
import torch

import zinf
from zinf.torch import Adam, AdamW


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(37, 300), torch.nn.ReLU(),
                               torch.nn.Linear(300, 5))


def groups(m):
    return [{"params": m[0].parameters(), "weight_decay": 0.0},
            {"params": m[2].parameters(), "lr": 3e-3}]


def train(model, opt, steps, seed=42, schedule=False):
    torch.manual_seed(seed)
    for s in range(steps):
        if schedule:
            for g in opt.param_groups:
                g["lr"] = g["lr"] * 0.9
        x = torch.randn(16, 37)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("cls", [AdamW, Adam])
def test_nvme_state_is_bitwise_the_cpu_state(tmp_path, cls):
    a, b = make_model(), make_model()
    # Small sub-groups: each parameter spans several records.
    nvme = cls(groups(a), lr=1e-2, weight_decay=0.05, state="nvme", nvme_path=tmp_path,
               sub_group_size=4096)
    cpu = cls(groups(b), lr=1e-2, weight_decay=0.05)
    train(a, nvme, 5, schedule=True)
    train(b, cpu, 5, schedule=True)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    st = nvme.last_step_stats
    assert st["step"] == 5
    assert st["bytes_read"] > 0 and st["bytes_written"] > 0


def test_save_and_load_resume_bitwise(tmp_path):
    for d in ("r", "a", "b"):
        (tmp_path / d).mkdir()
    ref = make_model()
    opt_ref = AdamW(ref.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "r",
                    sub_group_size=4096)
    train(ref, opt_ref, 6)

    a = make_model()
    opt_a = AdamW(a.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "a",
                  sub_group_size=4096)
    train(a, opt_a, 3)
    opt_a.save(tmp_path / "ckpt")
    del opt_a  # one owner per checkpoint directory: the saver's lock goes with it
    gc.collect()
    b = make_model(seed=99)  # other weights: load must bring the saved ones
    opt_b = AdamW(b.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "b",
                  sub_group_size=4096)
    opt_b.load(tmp_path / "ckpt")
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    # The same data stream as the reference's steps 4..6.
    torch.manual_seed(42)
    for _ in range(3):
        torch.randn(16, 37)
    for _ in range(3):
        x = torch.randn(16, 37)
        loss = b(x).pow(2).mean()
        opt_b.zero_grad()
        loss.backward()
        opt_b.step()
    for pr, pb in zip(ref.parameters(), b.parameters()):
        assert torch.equal(pr, pb)


def test_errors_name_what_failed(tmp_path):
    m = make_model()
    with pytest.raises(ValueError, match="needs nvme_path"):
        AdamW(m.parameters(), state="nvme")
    with pytest.raises(ValueError, match="state must be 'cpu' or 'nvme'"):
        AdamW(m.parameters(), state="disk")
    missing = tmp_path / "does" / "not" / "exist"
    with pytest.raises(zinf.IoError) as info:
        AdamW(m.parameters(), state="nvme", nvme_path=missing)
    assert str(missing) in str(info.value)
    with pytest.raises(ValueError, match="is for state='nvme'"):
        AdamW(m.parameters()).save(tmp_path)


def test_overlap_starts_updates_during_backward_and_gives_the_same_weights(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "p").mkdir()
    a, b = make_model(), make_model()
    over = AdamW(groups(a), lr=1e-2, weight_decay=0.05, state="nvme", nvme_path=tmp_path / "o",
                 sub_group_size=4096, overlap=True)
    plain = AdamW(groups(b), lr=1e-2, weight_decay=0.05, state="nvme", nvme_path=tmp_path / "p",
                  sub_group_size=4096)
    torch.manual_seed(42)
    xs = [torch.randn(16, 37) for _ in range(4)]
    for x in xs:
        for model, opt in ((a, over), (b, plain)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            if opt is over:
                # Every parameter's update was queued by backward itself.
                assert len(over._queued) == len(list(a.parameters()))
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert over.last_step_stats["step"] == 4


def test_overlap_refuses_accumulated_gradients(tmp_path):
    m = make_model()
    opt = AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, overlap=True)
    x = torch.randn(4, 37)
    m(x).sum().backward()
    opt.step()
    m.zero_grad(set_to_none=False)  # zeros, not None: the hook cannot know the final gradient
    with pytest.raises(RuntimeError, match="one backward per step"):
        m(x).sum().backward()
    with pytest.raises(ValueError, match="overlap=True is for state='nvme'"):
        AdamW(m.parameters(), overlap=True)


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_clipping_before_step_works_and_the_tiers_agree(tmp_path, state):
    a, b = make_model(), make_model()
    kw = dict(state="nvme", nvme_path=tmp_path, sub_group_size=4096) if state == "nvme" else {}
    opt = AdamW(a.parameters(), lr=1e-2, **kw)
    ref = torch.optim.AdamW(b.parameters(), lr=1e-2)
    torch.manual_seed(3)
    for _ in range(4):
        x = torch.randn(16, 37)
        for model, o in ((a, opt), (b, ref)):
            o.zero_grad()
            (model(x).pow(2).mean() * 50).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            assert norm > 0.5  # the clip did something
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_loss_scale_unscales_exactly_and_an_overflow_skips_the_step(tmp_path, state):
    a, b = make_model(), make_model()

    def kw(sub):
        if state == "cpu":
            return {}
        (tmp_path / sub).mkdir()
        return dict(state="nvme", nvme_path=tmp_path / sub, sub_group_size=4096)

    scaled = AdamW(a.parameters(), lr=1e-2, **kw("a"))
    plain = AdamW(b.parameters(), lr=1e-2, **kw("b"))
    torch.manual_seed(5)
    for step in range(4):
        x = torch.randn(16, 37)
        scaled.zero_grad()
        (a(x).pow(2).mean() * 1024).backward()  # a power of two: unscaling is exact
        if step == 2:
            before = [p.detach().clone() for p in a.parameters()]
            next(a.parameters()).grad[0, 0] = float("inf")  # an fp16 overflow
            scaled.step(loss_scale=1024)
            assert scaled.last_step_skipped
            for p, q in zip(a.parameters(), before):
                assert torch.equal(p, q)
            continue  # the plain run skips this batch too
        scaled.step(loss_scale=1024)
        assert not scaled.last_step_skipped
        plain.zero_grad()
        b(x).pow(2).mean().backward()
        plain.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(ValueError, match="loss_scale must be finite and > 0"):
        scaled.step(loss_scale=0)
