# SPDX-License-Identifier: Apache-2.0
# zinf.torch.offload_parameters: a model whose blocks' parameters live on NVMe (or in pinned
# memory) computes bitwise what the same model in memory does, losses, gradients and updated
# parameters over several steps, with torch's AdamW and zinf's (both state tiers); the
# prefetcher reads ahead from the second iteration on and falls back to on-demand reads for
# one iteration when the order changes; only the computing block is in the module; a bad
# directory is named in the error before the model is touched.
import copy
import os

import pytest
import torch

import zinf
from zinf.torch import AdamW, offload_parameters

DEVICES = ["nvme", "cpu"]


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class Net(torch.nn.Module):
    """Blocks between an input projection and a head that stay in memory; `order` picks the
    order the blocks run in (an order change)."""

    def __init__(self, d=24, blocks=5):
        super().__init__()
        self.embed = torch.nn.Linear(7, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = torch.nn.Linear(d, 3)
        self.order = list(range(blocks))

    def forward(self, x):
        h = self.embed(x)
        for i in self.order:
            h = self.blocks[i](h)
        return self.head(h)


def make_pair(seed=0, **kw):
    torch.manual_seed(seed)
    a = Net(**kw)
    return a, copy.deepcopy(a)


def batches(n, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 7, generator=g) for _ in range(n)]


def grads_of(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def assert_same_params(a, b, off):
    with off.materialized(write_back=False):
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(pa, pb), name


def run_pair(a, b, off, opt_a, opt_b, steps=4):
    for x in batches(steps):
        x = x.to(next(a.parameters()).device)
        la = a(x).pow(2).mean()
        lb = b(x).pow(2).mean()
        assert torch.equal(la, lb)
        opt_a.zero_grad()
        opt_b.zero_grad()
        la.backward()
        lb.backward()
        for (name, ga), gb in zip([(n, p.grad) for n, p in a.named_parameters()], grads_of(b)):
            assert (ga is None and gb is None) or torch.equal(ga, gb), name
        opt_a.step()
        off.step(opt_b)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_adamw_bitwise(tmp_path, device):
    a, b = make_pair()
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, device=device,
                             prefetch_depth=2)
    assert off.resident_units() == []
    assert all(p.numel() == 0 for blk in b.blocks for p in blk.parameters())
    run_pair(a, b, off, torch.optim.AdamW(a.parameters(), lr=1e-2),
             torch.optim.AdamW(b.parameters(), lr=1e-2))
    assert_same_params(a, b, off)


def test_striped_over_two_directories(tmp_path):
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    for d in dirs:
        d.mkdir()
    a, b = make_pair(13, d=200)  # blocks of ~1.3 MB: each spans both files
    off = offload_parameters(b, unit=Block, nvme_path=dirs, prefetch_depth=1)
    run_pair(a, b, off, torch.optim.AdamW(a.parameters(), lr=1e-2),
             torch.optim.AdamW(b.parameters(), lr=1e-2), steps=2)
    assert_same_params(a, b, off)


@pytest.mark.parametrize("device", DEVICES)
def test_zinf_adamw_cpu_state_bitwise(tmp_path, device):
    a, b = make_pair(1)
    off = offload_parameters(b, unit=list(b.blocks), nvme_path=tmp_path, device=device)
    run_pair(a, b, off, AdamW(a.parameters(), lr=1e-2), AdamW(b.parameters(), lr=1e-2))
    assert_same_params(a, b, off)


@pytest.mark.parametrize("device", DEVICES)
def test_zinf_adamw_nvme_state_bitwise(tmp_path, device):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "p").mkdir()
    a, b = make_pair(2)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path / "p", device=device)
    opt_a = AdamW(a.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "a")
    with off.materialized():  # the optimizer takes its masters from the parameters
        opt_b = AdamW(b.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "b")
    run_pair(a, b, off, opt_a, opt_b)
    assert_same_params(a, b, off)


def test_prefetch_hits_from_the_second_iteration_and_on_demand_after_an_order_change(
        tmp_path):
    _, b = make_pair(3)
    blocks = len(b.blocks)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, prefetch_depth=2)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-3)
    per_iteration = []
    for it, x in enumerate(batches(6)):
        if it == 3:
            b.order = [0, 2, 1, 4, 3]
        before = off.stats()
        b(x).sum().backward()
        off.step(opt)
        opt.zero_grad()
        after = off.stats()
        per_iteration.append({k: after[k] - before[k] for k in ("acquires", "hits",
                                                                "on_demand", "retraces")})
    # Each iteration fetches every block for forward, backward and the step.
    assert all(i["acquires"] == 3 * blocks for i in per_iteration)
    first, second, third, changed, after_change, last = per_iteration
    assert first["on_demand"] > 0  # tracing: nothing to predict yet
    for i in (second, third, after_change, last):
        assert i["hits"] == i["acquires"] and i["on_demand"] == 0, per_iteration
    assert changed["retraces"] >= 1 and changed["on_demand"] > 0, per_iteration
    s = off.stats()
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0 and s["read_busy_seconds"] > 0


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_at_most_depth_plus_one_units_in_the_module_during_forward(tmp_path, depth):
    _, b = make_pair(4)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, prefetch_depth=depth)
    seen = []
    for u, blk in enumerate(b.blocks):
        # On the block's last layer: runs inside the block's forward, after its own compute.
        blk.proj.register_forward_hook(
            lambda m, i, o, u=u, blk=blk: seen.append(
                (u, off.resident_units(), [p.numel() for p in blk.parameters()])))
    opt = torch.optim.AdamW(b.parameters(), lr=1e-3)
    for x in batches(3):
        seen.clear()
        b(x).sum().backward()
        # Inside each unit's forward, that unit is the only one present.
        assert [u for u, _, _ in seen] == list(range(len(b.blocks)))
        for u, resident, numels in seen:
            assert resident == [u] and len(resident) <= depth + 1
            assert all(n > 0 for n in numels)
        assert off.resident_peak_forward <= depth + 1
        # The read-ahead window (C++ side) stays within its bound: depth + 3 units, each a
        # staging buffer and a copy, at the padded size of the largest unit.
        padded = max((n + 4095) // 4096 * 4096 for n in off._unit_bytes)
        assert 0 < off.stats()["peak_held_bytes"] <= (depth + 3) * 2 * padded
        off.step(opt)
        opt.zero_grad()
        assert off.resident_units() == []


def test_each_fetch_is_one_copy_out_of_the_window_and_no_pageable_copy(tmp_path):
    """The traced fetches run on the engine's LayerStore: each is one copy from the window into
    the unit's tensor on the compute stream (counted in bytes_on_device), each unit read
    reaches the window by one host-to-device copy from pinned staging (bytes_to_device, no
    pageable copy), and no other copy of the bytes is made."""
    _, b = make_pair(5)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, prefetch_depth=1)
    fetched = []

    class Spy:  # the native store, each traced fetch's size recorded on the way
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def fetch_into(self, u, address, n):
            fetched.append(n)
            return self.inner.fetch_into(u, address, n)

    off._store = Spy(off._store)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-3)
    for x in batches(3):
        b(x).sum().backward()
        off.step(opt)
        opt.zero_grad()
    s = off.stats()
    assert s["device"] == "host"
    assert s["fetches"] == len(fetched) == s["acquires"] > 0, s
    assert s["bytes_on_device"] == sum(fetched), s
    assert s["pageable_copies"] == 0, s
    # A unit still in the window when it is fetched again is not copied again.
    assert 0 < s["bytes_to_device"] <= s["bytes_on_device"], s


class InPlaceNet(Net):
    """Net with each block's output modified in place, and a first block fed an input that
    needs no gradient (the padded batch; `embed` is unused and gets no gradient)."""

    def forward(self, x):
        h = torch.nn.functional.pad(x, (0, self.head.in_features - x.shape[1]))
        for i in self.order:
            h = self.blocks[i](h)
            h *= 0.5
        return self.head(h)


def test_unit_outputs_may_be_modified_in_place(tmp_path):
    torch.manual_seed(11)
    a = InPlaceNet()
    b = copy.deepcopy(a)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path)
    run_pair(a, b, off, torch.optim.AdamW(a.parameters(), lr=1e-2),
             torch.optim.AdamW(b.parameters(), lr=1e-2), steps=3)
    assert_same_params(a, b, off)
    assert off.resident_units() == []


def test_eval_forward_releases_and_matches(tmp_path):
    a, b = make_pair(5)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, device="nvme")
    x = batches(1)[0]
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    off.end_iteration()
    assert off.resident_units() == []


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.low = torch.nn.Linear(8, 8).to(torch.bfloat16)
        self.high = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.high(self.low(x).float())


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_share_a_unit(tmp_path, device):
    # One unit holding bf16 and fp32 parameters: each keeps its dtype and bytes.
    torch.manual_seed(12)
    ref = torch.nn.Sequential(Mixed())
    m = copy.deepcopy(ref)
    off = offload_parameters(m, unit=Mixed, nvme_path=tmp_path, device=device)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(m(x), ref(x))
    with off.materialized(write_back=False):
        assert [p.dtype for p in m.parameters()] == [torch.bfloat16] * 2 + [torch.float32] * 2
        for pa, pb in zip(ref.parameters(), m.parameters()):
            assert torch.equal(pa, pb)


def storage_bytes(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).nbytes()


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_dtype_units_state_dict_saves_and_loads(tmp_path, device):
    # materialized() and remove() give each parameter its own storage: torch.save refuses one
    # storage viewed as two dtypes (the unit's record), and would write the whole record with
    # each parameter. Loaded back with weights_only=True (torch's default since 2.6).
    torch.manual_seed(13)
    ref = torch.nn.Sequential(Mixed(), Mixed())
    m = copy.deepcopy(ref)
    (tmp_path / "store").mkdir()
    off = offload_parameters(m, unit=Mixed, nvme_path=tmp_path / "store", device=device)
    with off.materialized(write_back=False):
        torch.save(m.state_dict(), tmp_path / "in.pt")
    off.remove()
    torch.save(m.state_dict(), tmp_path / "after.pt")
    for name in ("in.pt", "after.pt"):
        sd = torch.load(tmp_path / name, weights_only=True)
        assert list(sd) == list(ref.state_dict())
        for (key, want), got in zip(ref.state_dict().items(), sd.values()):
            assert got.dtype == want.dtype and torch.equal(got, want), (name, key)
            assert storage_bytes(got) == got.numel() * got.element_size(), (name, key)


def test_bad_directory_is_named_and_the_model_untouched(tmp_path):
    a, b = make_pair(6)
    missing = tmp_path / "no-such-dir"
    with pytest.raises(zinf.IoError) as e:
        offload_parameters(b, unit=Block, nvme_path=missing)
    assert str(missing) in str(e.value)
    x = batches(1)[0]
    assert torch.equal(a(x), b(x))  # parameters in place, no hooks left behind
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_misuse_raises_value_error(tmp_path):
    _, b = make_pair()
    with pytest.raises(ValueError, match="nvme_path"):
        offload_parameters(b, unit=Block)
    with pytest.raises(ValueError, match="device"):
        offload_parameters(b, unit=Block, nvme_path=tmp_path, device="gpu")
    with pytest.raises(ValueError, match="no unit"):
        offload_parameters(b, unit=torch.nn.Conv2d, nvme_path=tmp_path)
    with pytest.raises(ValueError, match="nest"):
        offload_parameters(b, unit=[b.blocks[0], b.blocks[0].fc], nvme_path=tmp_path)
    with pytest.raises(ValueError, match="not a submodule"):
        offload_parameters(b, unit=[torch.nn.Linear(2, 2)], nvme_path=tmp_path)


def test_zinf_optimizers_refuse_released_parameters(tmp_path):
    (tmp_path / "p").mkdir()
    _, b = make_pair(10)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path / "p")
    with pytest.raises(ValueError, match="materialized"):
        AdamW(b.parameters(), state="nvme", nvme_path=tmp_path)
    opt = AdamW(b.parameters())
    b(batches(1)[0]).sum().backward()
    embed = b.embed.weight.clone()
    with pytest.raises(ValueError, match=r"offload\.step"):
        opt.step()  # not off.step(opt): the blocks' parameters are released
    assert torch.equal(b.embed.weight, embed)  # refused before any update
    off.step(opt)
    assert not torch.equal(b.embed.weight, embed)


def test_remove_brings_the_parameters_back(tmp_path):
    a, b = make_pair(8)
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path)
    off.remove()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device visible to torch (CPU-only torch or no GPU)")
@pytest.mark.parametrize("device", DEVICES)
def test_cuda_execution_bitwise(tmp_path, device):
    a, b = make_pair(9)
    a, b = a.cuda(), b.cuda()
    off = offload_parameters(b, unit=Block, nvme_path=tmp_path, device=device)
    run_pair(a, b, off, torch.optim.AdamW(a.parameters(), lr=1e-2),
             torch.optim.AdamW(b.parameters(), lr=1e-2), steps=3)
    batch = batches(1)[0].cuda()
    with torch.no_grad():
        assert torch.equal(a(batch), b(batch))
    if device == "nvme":  # on torch's stream, from the window: no pageable copy
        s = off.stats()
        assert s["device"] == "cuda" and s["pageable_copies"] == 0, s
        assert 0 < s["bytes_to_device"] <= s["bytes_on_device"], s


def test_a_path_with_a_nul_byte_is_refused_naming_the_argument_not_cut(tmp_path):
    a, b = make_pair(6)
    cut = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"nvme_path '.*ck\\x00zz' has an embedded NUL byte"):
        offload_parameters(b, unit=Block, nvme_path=str(cut) + "\0zz")
    assert not cut.exists()
    x = batches(1)[0]
    assert torch.equal(a(x), b(x))  # the model untouched


def test_a_unit_weight_tied_to_a_module_outside_every_unit_is_refused_naming_both(tmp_path):
    # A unit's parameters are emptied between its uses: a module outside every unit sharing
    # one then failed in forward with torch's shape error. Refused at wrap time, naming both
    # sides of the tie, before the model or the directory is touched.
    torch.manual_seed(3)
    net = Net(d=24, blocks=2)
    net.head = torch.nn.Linear(24, 24)
    net.head.weight = torch.nn.Parameter(torch.randn(24, 24))
    net.blocks[1].extra = torch.nn.Linear(24, 24, bias=False)
    net.blocks[1].extra.weight = net.head.weight  # tied: in unit 1 and outside every unit
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"zinf: 'head.weight' \(in Linear 'head', outside every "
                                         r"unit\) is tied to 'blocks.1.extra.weight' of unit 1"):
        offload_parameters(net, unit=Block, nvme_path=tmp_path)
    assert os.listdir(tmp_path) == []
    for b, p in zip(before, net.parameters()):
        assert torch.equal(b, p)
