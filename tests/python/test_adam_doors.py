# SPDX-License-Identifier: Apache-2.0
# The tensors of every CPU Adam door are checked once, natively (the adam layer's
# check_update_tensors), before anything is written (issue #52 items 2, 3, 4, 10, 13): the
# DeepSpeed op functions (CPUAdamBuilder().load().adam_update / adam_rollback),
# DeepSpeedCPUAdam (step, step_subgroup, rollback_subgroup) and zinf.torch's Adam/AdamW.
# Each refusal names the argument and leaves every tensor as it was; moments loaded in another
# layout (expanded, transposed, channels-last) train as torch.optim.AdamW trains them.
import pytest
import torch

from zinf.compat.deepspeed import CPUAdamBuilder, DeepSpeedCPUAdam
from zinf.torch import AdamW, pinned_zeros

BIG = 1 << 20


@pytest.fixture
def op():
    op = CPUAdamBuilder().load()
    assert op.create_adam(52, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, False) == 0
    yield op
    op.destroy_adam(52)


def update(op, p, g, m, v, step=1):
    return op.adam_update(52, step, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g, m, v)


def clones(*tensors):
    return [t.clone() for t in tensors]


def assert_same(tensors, before):
    for t, b in zip(tensors, before):
        assert torch.equal(t, b)


# Item 2: a 16-element exp_avg for 1M parameters once overwrote a pinned tensor allocated
# after it; a 16-element gradient updated the parameters from foreign memory.
def test_the_op_refuses_a_short_moment_or_gradient_and_writes_nothing(op):
    p, g = torch.randn(BIG), torch.randn(BIG)
    m, v = pinned_zeros(BIG), pinned_zeros(BIG)
    short = pinned_zeros(16)
    after = pinned_zeros(BIG)  # what the kernel wrote into past the short moment
    after.fill_(3.0)
    before = clones(p, g, m, v, short, after)
    with pytest.raises(ValueError,
                       match="^zinf: adam_update: exp_avg has 16 elements, params has 1048576$"):
        update(op, p, g, short, v)
    with pytest.raises(ValueError,
                       match="^zinf: adam_update: grads has 16 elements, params has 1048576$"):
        update(op, p, short, m, v)
    with pytest.raises(ValueError, match="^zinf: adam_rollback: exp_avg_sq has 16 elements"):
        op.adam_rollback(52, 1, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g, m, short)
    assert_same((p, g, m, v, short, after), before)


# Item 2: fp32 exp_avg with bf16 exp_avg_sq was read as fp32 (twice its bytes); int64
# moments were truncated.
def test_the_op_refuses_moments_of_two_dtypes_or_of_an_integer_dtype(op):
    p, g = torch.randn(4096), torch.randn(4096)
    m = torch.zeros(4096)
    v16 = torch.zeros(8192, dtype=torch.bfloat16)[:4096]
    before = clones(p, m, v16)
    with pytest.raises(ValueError, match="^zinf: adam_update: exp_avg is fp32 and exp_avg_sq "
                                         "bf16: the moments must have one dtype$"):
        update(op, p, g, m, v16)
    m64, v64 = torch.ones(4096, dtype=torch.int64), torch.ones(4096, dtype=torch.int64)
    with pytest.raises(ValueError, match="^zinf: adam_update: exp_avg is torch.int64, must be "
                                         "float32, bfloat16 or float16$"):
        update(op, p, g, m64, v64)
    assert_same((p, m, v16), before)
    assert bool((m64 == 1).all()) and bool((v64 == 1).all())
    with pytest.raises(ValueError, match="^zinf: exp_avg must be a torch.Tensor, got NoneType$"):
        update(op, p, g, None, v64)


# Items 3 and 4 at the op: the kernel reads memory in order, so an expanded or transposed
# tensor is refused (an in-place update cannot go through a copy).
def test_the_op_refuses_expanded_and_transposed_tensors(op):
    p, g = torch.randn(32, 64), torch.randn(32, 64)
    v = torch.zeros(32, 64)
    expanded = torch.zeros(1, 64).expand(32, 64)
    with pytest.raises(ValueError, match=r"^zinf: adam_update: exp_avg is not contiguous "
                                         r"\(sizes \[32, 64\], strides \[0, 1\]\)"):
        update(op, p, g, expanded, v)
    transposed = torch.zeros(64, 32).t()
    with pytest.raises(ValueError, match=r"exp_avg_sq is not contiguous \(sizes \[32, 64\], "
                                         r"strides \[1, 32\]\)"):
        update(op, p, g, torch.zeros(32, 64), transposed)
    overlapping = torch.zeros(2 * 32 * 64)
    with pytest.raises(ValueError, match="^zinf: adam_update: exp_avg and exp_avg_sq overlap$"):
        update(op, p, g, overlapping[:2048].view(32, 64), overlapping[1024:3072].view(32, 64))


# Item 13: step_subgroup over parameters of 16 and 1M elements updated the first, then said
# "m and v overlap".
def test_step_subgroup_checks_every_parameter_before_updating_any():
    a = torch.nn.Parameter(torch.randn(16))
    b = torch.nn.Parameter(torch.randn(BIG))
    opt = DeepSpeedCPUAdam([a, b], lr=1e-2)
    a.grad, b.grad = torch.randn(16), torch.randn(BIG)
    before = clones(a.detach(), b.detach())
    with pytest.raises(ValueError, match=r"^zinf: DeepSpeedCPUAdam.step_subgroup\(0\): "
                                         "parameter 1: exp_avg has 16 elements, params has "
                                         "1048576 \\(the moments it shares are made for an "
                                         "earlier parameter\\)$"):
        opt.step_subgroup(0)
    assert_same((a.detach(), b.detach()), before)
    assert len(opt.state[0]) == 0
    # Moments already made for the first size: the same refusal, from the native check.
    b.grad = None
    opt.step_subgroup(0)
    b.grad = torch.randn(BIG)
    state = {k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in
             opt.state[0].items()}
    before = clones(a.detach(), b.detach())
    with pytest.raises(ValueError, match=r"step_subgroup\(0\): parameter 1: exp_avg has 16 "
                                         "elements, params has 1048576$"):
        opt.step_subgroup(0)
    assert_same((a.detach(), b.detach()), before)
    assert opt.state[0]["step"] == state["step"] == 1
    assert torch.equal(opt.state[0]["exp_avg"], state["exp_avg"])


# Item 13 in zinf.torch: moments set by hand for one parameter are checked before the other
# parameters are updated.
def test_a_zinf_step_with_a_bad_moment_updates_no_parameter():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    opt = AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    last = list(model.parameters())[-1]
    opt.state[last]["exp_avg"] = torch.zeros(2)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="^zinf: AdamW.step: parameter 3: exp_avg has 2 "
                                         "elements, params has 4$"):
        opt.step()
    assert_same([p.detach() for p in model.parameters()], before)
    assert all(int(opt.state[p]["step"]) == 1 for p in model.parameters())


# Item 13: AdamW([p, p]) was refused on NVMe only after updating p.
@pytest.mark.parametrize("tier", ["cpu", "nvme"])
def test_a_parameter_listed_twice_is_refused_at_construction(tier, tmp_path):
    p = torch.nn.Parameter(torch.randn(64))
    kw = {"state": tier, "nvme_path": str(tmp_path)} if tier == "nvme" else {}
    with pytest.raises(ValueError, match="^zinf: optimizer contains a parameter group with "
                                         "duplicate parameters: parameter 1 is parameter 0"):
        AdamW([p, p], **kw)
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter "
                                         "group"):
        AdamW([{"params": [p]}, {"params": [p]}], **kw)
    opt = AdamW([p], **kw)
    with pytest.raises(ValueError, match="duplicate parameters"):
        opt.add_param_group({"params": (q for q in [p.new_zeros(1).requires_grad_()] * 2)})
    assert len(opt.param_groups) == 1


def torch_and_zinf(make_moment, shape=(8, 16), zinf_cls=AdamW, torch_sees=None):
    """Parameters of `shape` trained 3 steps by torch.optim.AdamW and by zinf_cls, zinf's
    loaded from a state_dict whose moments make_moment(m) gives in another layout, torch's
    from torch_sees(m) (default m itself, contiguous)."""
    torch.manual_seed(11)
    x = torch.randn(shape)
    m, v = torch.randn(shape) * 0.1, torch.rand(shape) * 0.01
    ref = torch.nn.Parameter(x.clone())
    mine = torch.nn.Parameter(x.clone())
    t = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
    z = zinf_cls([mine], lr=1e-2, weight_decay=0.01)
    sees = torch_sees or (lambda t: t.clone())

    def state_dict(moment):
        return {"state": {0: {"step": torch.tensor(2.0), "exp_avg": moment(m),
                              "exp_avg_sq": moment(v)}},
                "param_groups": [dict(t.param_groups[0], params=[0])]}

    t.load_state_dict(state_dict(sees))
    z.load_state_dict(state_dict(make_moment))
    for _ in range(3):
        g = torch.randn(shape)
        ref.grad, mine.grad = g.clone(), g.clone()
        t.step()
        z.step()
    return ref, mine, t, z


# Item 4: transposed and channels-last moments were read in memory order (0.040 off).
@pytest.mark.parametrize("zinf_cls", [AdamW, DeepSpeedCPUAdam])
def test_moments_in_another_layout_train_as_torch_does(zinf_cls):
    ref, mine, t, z = torch_and_zinf(lambda m: m.t().contiguous().t(), zinf_cls=zinf_cls)
    torch.testing.assert_close(mine.detach(), ref.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(z.state[mine]["exp_avg"], t.state[ref]["exp_avg"])
    assert z.state[mine]["exp_avg"].is_contiguous()
    ref, mine, _, _ = torch_and_zinf(
        lambda m: m.contiguous(memory_format=torch.channels_last), shape=(2, 3, 4, 5))
    torch.testing.assert_close(mine.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


# Item 3: a moment made with expand (stride 0, one element of storage) aborted the process
# or hung. torch's own AdamW refuses to step one ("more than one element of the written-to
# tensor refers to a single memory location"); zinf trains from the values it shows, as
# torch does from the same values stored contiguously.
@pytest.mark.parametrize("zinf_cls", [AdamW, DeepSpeedCPUAdam])
def test_an_expanded_moment_is_loaded_as_the_values_it_shows(zinf_cls):
    def expanded(m):
        return m[:1, :1].clone().expand(m.shape)

    ref, mine, _, z = torch_and_zinf(expanded, zinf_cls=zinf_cls,
                                     torch_sees=lambda m: expanded(m).contiguous())
    assert z.state[mine]["exp_avg"].is_contiguous()
    torch.testing.assert_close(mine.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


# Item 10: beta1 = 0 and lr * weight_decay = 1 are valid for the update; their rollback wrote
# NaN and returned success.
def test_a_rollback_that_cannot_be_inverted_is_refused_before_any_write(op):
    p = torch.nn.Parameter(torch.randn(256))
    opt = DeepSpeedCPUAdam([p], lr=1e-2, betas=(0.0, 0.999))
    p.grad = torch.randn(256)
    opt.step_subgroup(0)
    state = {k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in
             opt.state[0].items()}
    before = p.detach().clone()
    with pytest.raises(ValueError, match=r"^cpu adam rollback: beta1 must not be 0 for a "
                                         r"rollback \(the old exp_avg is \(exp_avg - \(1 - "
                                         r"beta1\) \* grad\) / beta1\), got 0$"):
        opt.rollback_subgroup(0)
    assert torch.equal(p.detach(), before)
    assert opt.state[0]["step"] == state["step"] == 1
    assert torch.equal(opt.state[0]["exp_avg"], state["exp_avg"])
    q, g = torch.randn(256), torch.randn(256)
    m, v = torch.rand(256), torch.rand(256)
    before = clones(q, m, v)
    with pytest.raises(ValueError, match=r"^cpu adam rollback: weight_decay times lr must not "
                                         r"be 1 for a rollback .*got lr=0.5 weight_decay=2$"):
        op.adam_rollback(52, 1, 0.5, 0.9, 0.999, 1e-8, 2.0, True, q, g, m, v)
    assert_same((q, m, v), before)
    # The update itself takes both.
    assert update(op, q, g, m, v) == 0


# Item 12: a parameter with no state in a torch state_dict trained with the optimizer's step
# count on NVMe (0.0087 off torch after 3 steps). The cpu tier counts per parameter as torch
# does; NVMe counts per optimizer and refuses what it cannot count right.
@pytest.mark.parametrize("tier", ["cpu", "nvme"])
def test_a_parameter_without_state_starts_from_step_0_or_is_refused(tier, tmp_path):
    torch.manual_seed(12)
    a0, b0 = torch.randn(64), torch.randn(64)
    ra, rb = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
    t = torch.optim.AdamW([ra, rb], lr=1e-2)
    for _ in range(2):
        ra.grad = torch.randn(64)
        t.step()
    sd = t.state_dict()
    sd["state"] = {k: {n: x.clone() for n, x in st.items()} for k, st in sd["state"].items()}
    assert 1 not in sd["state"]
    za, zb = torch.nn.Parameter(ra.detach().clone()), torch.nn.Parameter(b0.clone())
    kw = {"state": tier, "nvme_path": str(tmp_path)} if tier == "nvme" else {}
    z = AdamW([za, zb], lr=1e-2, **kw)
    if tier == "nvme":
        with pytest.raises(ValueError, match="^zinf: state='nvme' counts steps per optimizer: "
                                             "parameter 1 has no state in the state_dict"):
            z.load_state_dict(sd)
        assert z._offloaded.step_count() == 0
        return
    z.load_state_dict(sd)
    for _ in range(3):
        g1, g2 = torch.randn(64), torch.randn(64)
        ra.grad, rb.grad, za.grad, zb.grad = g1.clone(), g2.clone(), g1.clone(), g2.clone()
        t.step()
        z.step()
    torch.testing.assert_close(zb.detach(), rb.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(za.detach(), ra.detach(), rtol=1e-6, atol=1e-7)
