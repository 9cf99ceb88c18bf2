# SPDX-License-Identifier: Apache-2.0
# What torch 2 changed, against zinf's package (run on torch 2.13; each case that cannot apply
# to torch 1.13 skips saying why): torch.load's weights_only=True (the default since 2.6)
# loads every state_dict and file the package writes; zinf.torch.Adam/AdamW state_dicts carry
# torch 2's param_group keys and go to torch.optim.AdamW and back, values zinf cannot honour
# refused before anything changes; overlap=True uses the post-accumulate-grad hook and hands
# each gradient over as backward produces it; offload_parameters under torch.compile, in
# either order, trains as eager does.
import copy
import io

import pytest
import torch

from zinf.compat.deepspeed import DeepSpeedCPUAdam
from zinf.torch import Adam, AdamW, FastFileReader, FastFileWriter, offload_parameters

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
POST_ACCUMULATE = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")  # torch >= 2.1
# torch 1.13's weights_only unpickler refuses a pickled float (opcode BINFLOAT), so no
# optimizer's state_dict loads that way there, torch's own included.
needs_weights_only_floats = pytest.mark.skipif(
    not TORCH2, reason="torch 1.13's weights_only unpickler refuses floats (BINFLOAT)")
# torch's group keys that zinf's state_dict must carry for torch.optim.AdamW to take it as is.
TORCH_KEYS = set(torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).param_groups[0]) \
    - {"params"}


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(9, 17), torch.nn.Tanh(), torch.nn.Linear(17, 4))


def set_grads(model, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def train(model, opt, steps, first=0):
    for s in range(first, first + steps):
        set_grads(model, s)
        opt.step()


def round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def assert_same(a, b):
    """Every tensor bitwise and every other value equal, through dicts, lists and tuples."""
    assert type(a) is type(b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


# ---- weights_only=True -------------------------------------------------------------------

@needs_weights_only_floats
@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_optimizer_state_dicts_load_with_weights_only(tmp_path, cls, state):
    m = make_model()
    kw = dict(state="nvme", nvme_path=tmp_path) if state == "nvme" else {}
    opt = cls(m.parameters(), lr=1e-2, **kw)
    train(m, opt, 2)
    sd = opt.state_dict()
    assert_same(round_trip(sd), sd)


@needs_weights_only_floats
@pytest.mark.parametrize("fp32_states", [True, False])
def test_deepspeed_cpu_adam_state_dict_loads_with_weights_only(fp32_states):
    m = make_model().to(torch.bfloat16)
    opt = DeepSpeedCPUAdam(m.parameters(), lr=1e-2, fp32_optimizer_states=fp32_states)
    train(m, opt, 2)
    sd = opt.state_dict()
    assert_same(round_trip(sd), sd)
    # ZeRO-3's subgroups: one flat parameter per subgroup, its state under an int key (moments
    # shared by parameters of other sizes are refused: test_adam_doors.py).
    flat = torch.nn.Parameter(torch.randn(153, dtype=torch.bfloat16))
    flat.grad = torch.randn_like(flat)
    sub = DeepSpeedCPUAdam([flat], lr=1e-2, fp32_optimizer_states=fp32_states)
    sub.step_subgroup(7)
    assert 7 in sub.state
    sd = sub.state_dict()
    assert_same(round_trip(sd), sd)


def test_fast_file_writer_output_loads_with_weights_only(tmp_path):
    m = make_model()
    sd = {"model": m.state_dict(), "step": 3, "names": ["a", "b"]}
    path = tmp_path / "ckpt.pt"
    with FastFileWriter(path) as f:
        torch.save(sd, f)
    with FastFileReader(path) as f:
        assert_same(torch.load(f, weights_only=True), sd)
    assert_same(torch.load(path, weights_only=True), sd)


def test_offloaded_models_state_dict_loads_with_weights_only(tmp_path):
    # (A unit mixing dtypes: test_param_offload.py.)
    ref = torch.nn.Sequential(make_model(1), make_model(2))
    m = copy.deepcopy(ref)
    off = offload_parameters(m, unit=torch.nn.Linear, nvme_path=tmp_path)
    with off.materialized(write_back=False):
        assert_same(round_trip(m.state_dict()), ref.state_dict())


# ---- state_dicts to torch.optim.AdamW and back ---------------------------------------------

def test_zinf_state_dict_carries_torchs_group_keys_with_what_it_implements():
    for cls, decoupled in ((Adam, False), (AdamW, True)):
        group = cls(make_model().parameters()).state_dict()["param_groups"][0]
        assert TORCH_KEYS <= set(group)
        want = dict(amsgrad=False, maximize=False, foreach=None, capturable=False,
                    differentiable=False, fused=None, decoupled_weight_decay=decoupled)
        assert {k: group[k] for k in want} == want


# zinf's kernel fuses the update, so it rounds differently from torch's: the 6 steps below
# agree to this (measured on torch 2.13: at most 1.8e-6 relative, 1.5e-8 absolute, per element).
RTOL, ATOL = 1e-5, 1e-7


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_zinf_adamw_to_torch_adamw_and_back(tmp_path, state):
    kw = dict(state="nvme", nvme_path=tmp_path) if state == "nvme" else {}
    groups = lambda m: [{"params": m[0].parameters(), "weight_decay": 0.0},  # noqa: E731
                        {"params": m[2].parameters(), "lr": 3e-3}]
    ref = make_model()
    ref_opt = torch.optim.AdamW(groups(ref), lr=1e-2)
    train(ref, ref_opt, 6)

    # zinf for 2 steps, torch for 2 from zinf's state_dict, zinf again for 2 from torch's.
    m = make_model()
    z = AdamW(groups(m), lr=1e-2, **kw)
    train(m, z, 2)
    sd = z.state_dict()
    t = torch.optim.AdamW(groups(m), lr=1e-2)
    t.load_state_dict(sd)
    assert [set(g) for g in t.param_groups] == [set(g) for g in z.param_groups]  # none added
    for k, st in sd["state"].items():
        mine = t.state_dict()["state"][k]
        assert torch.equal(mine["exp_avg"], st["exp_avg"])
        assert torch.equal(mine["exp_avg_sq"], st["exp_avg_sq"])
        assert float(mine["step"]) == st["step"] == 2
    train(m, t, 2, first=2)
    back = t.state_dict()
    if TORCH2:
        assert {"foreach", "fused", "capturable", "differentiable", "maximize"} \
            <= set(back["param_groups"][0])
    (tmp_path / "z2").mkdir()
    kw2 = dict(state="nvme", nvme_path=tmp_path / "z2") if state == "nvme" else {}
    z2 = AdamW(groups(m), lr=1e-2, **kw2)
    z2.load_state_dict(back)
    train(m, z2, 2, first=4)
    for pa, pb in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(pa, pb, rtol=RTOL, atol=ATOL)
    assert [g["lr"] for g in z2.param_groups] == [1e-2, 3e-3]


@pytest.mark.parametrize("key,value,match", [
    ("maximize", True, "maximize=True is not supported .zinf's kernel minimizes"),
    ("capturable", True, "capturable=True is not supported"),
    ("differentiable", True, "differentiable=True is not supported"),
    ("amsgrad", True, "amsgrad=True is not supported"),
    ("decoupled_weight_decay", False, "decoupled_weight_decay=False is Adam's update and this "
                                      "optimizer runs AdamW's: use zinf.torch.Adam"),
])
@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_group_keys_zinf_cannot_honour_are_refused_and_change_nothing(tmp_path, key, value,
                                                                        match, state):
    kw = dict(state="nvme", nvme_path=tmp_path) if state == "nvme" else {}
    m = make_model()
    z = AdamW(m.parameters(), lr=1e-2, **kw)
    train(m, z, 1)
    sd = z.state_dict()
    sd["param_groups"][0][key] = value
    before = z.state_dict()
    params = [p.clone() for p in m.parameters()]
    with pytest.raises(ValueError, match=f"load_state_dict: param_group 0's {match}"):
        z.load_state_dict(sd)
    assert_same(z.state_dict(), before)
    train(m, z, 1, first=1)  # still usable, and steps as before
    assert all(not torch.equal(a, b) for a, b in zip(params, m.parameters()))
    # The same values given to the constructor (a group dict): refused at the door.
    with pytest.raises(ValueError, match=f"a param_group's {match}"):
        AdamW([{"params": make_model().parameters(), key: value}])


def test_torch_group_keys_zinf_honours_are_taken(tmp_path):
    # foreach and fused say how torch runs its own update: any value loads (zinf's kernel is
    # fused whatever they say), and stays in the groups, so the next state_dict gives it back.
    m = make_model()
    t = torch.optim.AdamW(m.parameters(), lr=1e-2)
    train(m, t, 1)
    sd = t.state_dict()
    sd["param_groups"][0].update(foreach=True, fused=False)
    z = AdamW(make_model().parameters())
    z.load_state_dict(sd)
    assert z.param_groups[0]["foreach"] is True and z.param_groups[0]["fused"] is False
    train(m, z, 1, first=1)
    adam = Adam(make_model().parameters())
    with pytest.raises(ValueError, match="decoupled_weight_decay=True is AdamW's update and "
                                         "this optimizer runs Adam's: use zinf.torch.AdamW"):
        adam.load_state_dict(z.state_dict())


# ---- overlap=True: the post-accumulate-grad hook ---------------------------------------------

@pytest.mark.skipif(not POST_ACCUMULATE,
                    reason="torch < 2.1 has no register_post_accumulate_grad_hook")
def test_overlap_hands_each_gradient_over_as_backward_produces_it(tmp_path, monkeypatch):
    registered = {"post_accumulate": 0, "register_hook": 0}
    for name, key in (("register_post_accumulate_grad_hook", "post_accumulate"),
                      ("register_hook", "register_hook")):
        original = getattr(torch.Tensor, name)

        def counting(self, hook, original=original, key=key):
            registered[key] += 1
            return original(self, hook)
        monkeypatch.setattr(torch.Tensor, name, counting)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 7),
                            torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt = AdamW(m.parameters(), state="nvme", nvme_path=tmp_path, overlap=True)
    monkeypatch.undo()
    assert registered == {"post_accumulate": 6, "register_hook": 0}

    names = {id(p): n for n, p in m.named_parameters()}
    events = []
    hand_over = opt._on_grad  # the hooks call it by name: record each call, then pass it on

    def recording(p, grad):
        events.append(("grad", names[id(p)][0], grad is p.grad))
        return hand_over(p, grad)
    opt._on_grad = recording
    for i in (0, 2, 4):
        m[i].register_full_backward_pre_hook(lambda mod, g, i=i: events.append(("layer", str(i))))
    m(torch.randn(4, 5, requires_grad=True)).sum().backward()
    assert len(opt._queued) == 6  # queued during backward, before step()
    events.append(("returned", ""))
    # Each layer's weight and bias go over once backward reaches that layer, before it reaches
    # the layer before it, each the accumulated .grad itself.
    assert [(e[0], e[1]) for e in events] == [
        ("layer", "4"), ("grad", "4"), ("grad", "4"), ("layer", "2"), ("grad", "2"),
        ("grad", "2"), ("layer", "0"), ("grad", "0"), ("grad", "0"), ("returned", "")]
    assert all(e[2] for e in events if e[0] == "grad")
    opt.step()
    assert opt.last_step_stats["step"] == 1


# ---- offload_parameters under torch.compile --------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 2 * d)
        self.proj = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


def make_net(seed=5):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), Block(16), Block(16), Block(16),
                               torch.nn.Linear(16, 2))


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch < 2.0 has no torch.compile")
@pytest.mark.parametrize("order", ["offload_then_compile", "compile_then_offload"])
def test_offload_parameters_under_torch_compile_trains_as_eager(tmp_path, order):
    # backend="aot_eager": dynamo and AOTAutograd, as inductor, without its C++ compile
    # (minutes on this machine's 2 cores; inductor was checked by hand: same losses).
    import torch._dynamo
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    xs = [torch.randn(5, 6, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    ref = make_net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    m = make_net()
    if order == "offload_then_compile":
        off = offload_parameters(m, unit=Block, nvme_path=tmp_path)
        run = torch.compile(m, backend="aot_eager")
    else:
        run = torch.compile(m, backend="aot_eager")
        off = offload_parameters(run, unit=Block, nvme_path=tmp_path)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for x in xs:
        want = ref(x).pow(2).mean()
        got = run(x).pow(2).mean()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        assert off.resident_units() == []  # each unit released after its forward
        want.backward()
        got.backward()
        ref_opt.step()
        off.step(opt)
        ref_opt.zero_grad()
        opt.zero_grad()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # something compiled
    assert off.resident_peak_forward == 1
    with off.materialized(write_back=False):
        for pa, pb in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
