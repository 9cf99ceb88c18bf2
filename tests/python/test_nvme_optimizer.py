# SPDX-License-Identifier: Apache-2.0
# zinf.torch.AdamW/Adam with state="nvme": the masters and moments in swap files, the update
# copied into the parameters. Bitwise what state="cpu" gives, per-group settings and a changed
# learning rate included; save/load resumes bitwise; errors name what failed.
import gc
import os

import pytest
import torch

import zinf
from zinf.torch import Adam, AdamW


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(37, 3000), torch.nn.ReLU(),
                               torch.nn.Linear(3000, 5))


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
               sub_group_size=32768)
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
                    sub_group_size=32768)
    train(ref, opt_ref, 6)

    a = make_model()
    opt_a = AdamW(a.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "a",
                  sub_group_size=32768)
    train(a, opt_a, 3)
    opt_a.save(tmp_path / "ckpt")
    del opt_a  # one owner per checkpoint directory: the saver's lock goes with it
    gc.collect()
    b = make_model(seed=99)  # other weights: load must bring the saved ones
    opt_b = AdamW(b.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "b",
                  sub_group_size=32768)
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
                 sub_group_size=32768, overlap=True)
    plain = AdamW(groups(b), lr=1e-2, weight_decay=0.05, state="nvme", nvme_path=tmp_path / "p",
                  sub_group_size=32768)
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


POST_ACCUMULATE = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")  # torch >= 2.1


def test_overlap_refuses_a_second_backward_in_one_step(tmp_path):
    # Its gradients would have to be added to updates already queued by the first: refused on
    # every torch, with the step's first gradients still applied by step().
    m = make_model()
    opt = AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, overlap=True)
    x = torch.randn(4, 37)
    m(x).sum().backward()
    with pytest.raises(RuntimeError, match="one backward per step"):
        m(x).sum().backward()
    opt.step()
    assert opt.last_step_stats["step"] == 1
    with pytest.raises(ValueError, match="overlap=True is for state='nvme'"):
        AdamW(m.parameters(), overlap=True)


def test_overlap_with_zeroed_gradients(tmp_path):
    # model.zero_grad(set_to_none=False) leaves zeros. torch >= 2.1 hands the hook the
    # accumulated gradient (0 + g), so the step is that of gradients set to None, bitwise;
    # torch < 2.1 hands only the incoming one, so a gradient already there is refused.
    a, b = make_model(), make_model()
    (tmp_path / "o").mkdir()
    (tmp_path / "p").mkdir()
    over = AdamW(a.parameters(), state="nvme", nvme_path=tmp_path / "o", overlap=True)
    plain = AdamW(b.parameters(), state="nvme", nvme_path=tmp_path / "p")
    x = torch.randn(4, 37)
    for model, opt in ((a, over), (b, plain)):
        model(x).sum().backward()
        opt.step()
        model.zero_grad(set_to_none=False)
    if not POST_ACCUMULATE:
        with pytest.raises(RuntimeError, match="one backward per step"):
            a(x).pow(2).sum().backward()
        return
    for model, opt in ((a, over), (b, plain)):
        model(x).pow(2).sum().backward()
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_clipping_before_step_works_and_the_tiers_agree(tmp_path, state):
    a, b = make_model(), make_model()
    kw = dict(state="nvme", nvme_path=tmp_path, sub_group_size=32768) if state == "nvme" else {}
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
        return dict(state="nvme", nvme_path=tmp_path / sub, sub_group_size=32768)

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


def _continue(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(16, 37, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("target", ["nvme", "cpu"])
@pytest.mark.parametrize("source", ["nvme", "cpu"])
def test_state_dict_round_trip_resumes_bitwise(tmp_path, source, target):
    # A state_dict taken after 3 steps (through torch.save) and loaded into a fresh optimizer
    # of either tier, over a copy of the model, steps on bitwise as the original does.
    import copy
    import io
    (tmp_path / "s").mkdir()
    (tmp_path / "t").mkdir()

    def tier(t, d):
        return dict(state=t, nvme_path=tmp_path / d, sub_group_size=32768) if t == "nvme" else {}

    a = make_model()
    opt_a = AdamW(groups(a), lr=1e-2, weight_decay=0.05, **tier(source, "s"))
    train(a, opt_a, 3)
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)
    assert sorted(sd["state"]) == list(range(4))
    assert all(int(s["step"]) == 3 for s in sd["state"].values())
    assert sd["param_groups"][1]["lr"] == 3e-3
    b = copy.deepcopy(a)
    opt_b = AdamW(groups(b), lr=5.0, weight_decay=0.0, **tier(target, "t"))
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["lr"] == 1e-2 and opt_b.param_groups[1]["lr"] == 3e-3
    if target == "nvme":
        again = opt_b.state_dict()["state"]
        for k, s in sd["state"].items():
            assert torch.equal(again[k]["exp_avg"], s["exp_avg"])
            assert torch.equal(again[k]["exp_avg_sq"], s["exp_avg_sq"])
    _continue(a, opt_a, 3, seed=5)
    _continue(b, opt_b, 3, seed=5)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_model()
    opt = AdamW(groups(a), lr=1e-2, state="nvme", nvme_path=tmp_path / "a")
    train(a, opt, 2)
    sd = opt.state_dict()
    before = opt.state_dict()["state"]
    one_group = AdamW(a.parameters(), lr=1e-2).state_dict()
    with pytest.raises(ValueError, match="param_groups differ"):
        opt.load_state_dict(one_group)
    sd["state"][3]["step"] = 7
    with pytest.raises(ValueError, match="different step counts"):
        opt.load_state_dict(sd)
    sd["state"][3]["step"] = 2
    sd["state"][0]["exp_avg"] = torch.zeros(5)
    with pytest.raises(ValueError, match="exp_avg has 5 elements"):
        opt.load_state_dict(sd)
    after = opt.state_dict()["state"]
    for k in before:
        assert torch.equal(before[k]["exp_avg"], after[k]["exp_avg"])
    assert opt._offloaded.step_count() == 2


def test_torch_adamw_state_dict_loads_into_the_nvme_tier(tmp_path):
    # torch keeps `step` as a tensor; the moments are torch's own. Continuing from them tracks
    # torch.optim.AdamW within the kernel's rounding (rtol 2e-5, as test_cpu_adam).
    import copy
    a = make_model()
    opt_a = torch.optim.AdamW(groups(a), lr=1e-2, weight_decay=0.05)
    train(a, opt_a, 3)
    b = copy.deepcopy(a)
    opt_b = AdamW(groups(b), lr=1e-2, weight_decay=0.05, state="nvme", nvme_path=tmp_path)
    opt_b.load_state_dict(opt_a.state_dict())
    assert opt_b._offloaded.step_count() == 3
    _continue(a, opt_a, 2, seed=9)
    _continue(b, opt_b, 2, seed=9)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pb, pa, rtol=2e-5, atol=2e-6)


def losses(opt_factory, steps=40):
    """The training losses of make_model() under the optimizer opt_factory(params) builds."""
    model = make_model()
    opt = opt_factory(model.parameters())
    torch.manual_seed(42)
    out = []
    for _ in range(steps):
        x = torch.randn(16, 37)
        loss = model(x).pow(2).mean()
        out.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out, opt


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_compact_state_follows_fp32_and_checkpoints_name_their_precision(tmp_path, precision):
    for d in ("f", "c", "x"):
        (tmp_path / d).mkdir()
    ref, ref_opt = losses(lambda p: AdamW(p, lr=1e-2, state="nvme", nvme_path=tmp_path / "f",
                                        sub_group_size=32768))
    got, opt = losses(lambda p: AdamW(p, lr=1e-2, state="nvme", nvme_path=tmp_path / "c",
                                      sub_group_size=32768, state_precision=precision))
    # The tolerance of the demo's test (docs/engine.md): within 5% of fp32's loss at each step
    # or 1% of the initial loss.
    for t, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= max(0.05 * b, 0.01 * ref[0]), (t, a, b)
    # Smaller records: fewer bytes read per step than fp32's.
    assert opt.last_step_stats["bytes_read"] < ref_opt.last_step_stats["bytes_read"]
    # The moments come back decoded to float32 in torch's names.
    sd = opt.state_dict()
    assert sd["state"][0]["exp_avg"].dtype == torch.float32
    opt.save(tmp_path / "ckpt")
    del opt
    gc.collect()
    m = make_model()
    fp32 = AdamW(m.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "x",
                 sub_group_size=32768)
    with pytest.raises(ValueError,
                       match=f"does not match: state_precision {precision}, here fp32"):
        fp32.load(tmp_path / "ckpt")


def test_state_precision_errors_list_the_accepted_values(tmp_path):
    m = make_model()
    with pytest.raises(ValueError, match="state_precision must be 'fp32', 'bf16' or 'int8', "
                                         "got 'fp16'"):
        AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, state_precision="fp16")
    with pytest.raises(ValueError, match="state_precision='int8' is for state='nvme'"):
        AdamW(m.parameters(), state_precision="int8")


def test_a_path_with_a_nul_byte_is_refused_naming_the_argument_not_cut(tmp_path):
    # The native side takes a C string: "ck\0zz" once wrote into "ck".
    m = make_model()
    cut = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"nvme_path '.*ck\\x00zz' has an embedded NUL byte"):
        AdamW(m.parameters(), state="nvme", nvme_path=str(cut) + "\0zz")
    with pytest.raises(ValueError, match=r"nvme_path\[1\] '.*ck\\x00' has an embedded NUL"):
        AdamW(m.parameters(), state="nvme", nvme_path=[tmp_path / "a", str(cut) + "\0"])
    (tmp_path / "swap").mkdir()
    opt = AdamW(m.parameters(), state="nvme", nvme_path=tmp_path / "swap")
    for call in (opt.save, opt.save_async, opt.load):
        with pytest.raises(ValueError, match=r"directory '.*ck\\x00zz' has an embedded NUL"):
            call(str(cut) + "\0zz")
        with pytest.raises(ValueError, match=r"directory '.*ck\\x00' has an embedded NUL"):
            call(os.fsencode(cut) + b"\0")
    assert not opt.save_in_flight()
    assert not cut.exists()
    assert not (tmp_path / "a").exists()


def test_integers_out_of_range_are_refused_naming_the_argument(tmp_path):
    # pybind11 refused these with a dump of the native signature (sub_group_size=2^62 under
    # the name of the pinned budget it overflowed): a ValueError naming the argument now.
    from zinf.compat.deepspeed import CPUAdamBuilder, DeepSpeedCPUAdam
    m = make_model()
    with pytest.raises(ValueError, match="zinf: threads must be >= 0, got -1"):
        AdamW(m.parameters(), threads=-1)
    with pytest.raises(ValueError, match="zinf: threads must be >= 0, got -1"):
        DeepSpeedCPUAdam(m.parameters(), threads=-1)
    with pytest.raises(ValueError, match=r"sub_group_size must be an int of at least 32768 and "
                                         r"at most 2\^50 elements .* got 4611686018427387904"):
        AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, sub_group_size=2 ** 62)
    with pytest.raises(ValueError, match=r"pipeline_depth must be in \[1, 4294967295\]"):
        AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, pipeline_depth=2 ** 40)
    assert os.listdir(tmp_path) == []
    ops = CPUAdamBuilder().load()
    ops.create_adam(901)
    p = torch.zeros(64)
    g, mo, v = torch.ones(64), torch.zeros(64), torch.zeros(64)
    with pytest.raises(ValueError, match=r"zinf: step must be >= 0, got 1180591620717411303424"):
        ops.adam_update(901, 2 ** 70, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, mo, v)
    with pytest.raises(TypeError, match="step must be an integer"):
        ops.adam_update(901, 1.5, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, mo, v)
    assert not p.any() and not mo.any() and not v.any()
    ops.destroy_adam(901)


def test_load_refuses_masters_of_another_shape_with_the_same_element_count(tmp_path):
    # The records hold element counts only: a checkpoint of a (4, 6) weight loaded into a
    # (6, 4) one, silently transposing nothing and mixing every value. The shapes are saved
    # with each version and checked before anything changes.
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4, 6))
    (tmp_path / "sa").mkdir()
    (tmp_path / "sb").mkdir()
    opt = AdamW([a], state="nvme", nvme_path=tmp_path / "sa")
    opt.save(tmp_path / "ck")
    del opt  # one optimizer per checkpoint directory (its lock)
    gc.collect()
    b = torch.nn.Parameter(torch.randn(6, 4))
    before = b.detach().clone()
    other = AdamW([b], state="nvme", nvme_path=tmp_path / "sb")
    with pytest.raises(ValueError, match=r"parameter 0 is shaped \[6, 4\], the checkpoint's "
                                         r"master \[4, 6\] \(the same 24 elements"):
        other.load(tmp_path / "ck")
    assert torch.equal(b.detach(), before)
    del other
    gc.collect()
    # A parameter of the saved shape loads the saved masters.
    c = torch.nn.Parameter(torch.zeros(4, 6))
    (tmp_path / "sc").mkdir()
    third = AdamW([c], state="nvme", nvme_path=tmp_path / "sc")
    third.load(tmp_path / "ck")
    assert torch.equal(c.detach(), a.detach())
