# SPDX-License-Identifier: Apache-2.0
# zinf.torch.offload_activations: a small transformer's gradients are bitwise those of the run
# without offload (pinned memory and NVMe, with and without torch.utils.checkpoint), the
# tensors held by the store while forward runs are the ones moved out of memory, a tensor
# saved twice goes once, small tensors and parameters stay, and errors are Python's.
import pytest
import torch
import torch.utils.checkpoint

import zinf
import zinf.torch as zt


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.norm(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.mlp(self.norm(x))


class Net(torch.nn.Module):
    def __init__(self, d=64, blocks=3, checkpointed=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = torch.nn.Linear(d, 1)
        self.checkpointed = checkpointed

    def forward(self, x):
        for b in self.blocks:
            # use_reentrant=True, the default of torch 1.13 to 2.13, named: torch 2 warns
            # without it (and meant to make it an error from 2.9).
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=True) \
                if self.checkpointed else b(x)
        return self.head(x).square().mean()


def grads_of(net, x, ctx=None):
    net.zero_grad(set_to_none=True)
    if ctx is None:
        loss = net(x)
    else:
        with ctx:
            loss = net(x)
    loss.backward()
    return loss.detach().clone(), [p.grad.clone() for p in net.parameters()]


def make(checkpointed=False):
    torch.manual_seed(7)
    net = Net(checkpointed=checkpointed)
    x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    return net, x


@pytest.mark.parametrize("tier", ["cpu", "nvme"])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_gradients_are_bitwise_those_without_offload(tmp_path, tier, checkpointed):
    net, x = make(checkpointed)
    want_loss, want = grads_of(net, x)
    opts = {"tier": tier, "pinned_budget_bytes": 8 << 20}
    if tier == "nvme":
        opts.update(nvme_path=str(tmp_path), capacity_bytes=256 << 20)
    store = zt.ActivationStore(**opts)
    for _ in range(2):  # the store serves iteration after iteration
        loss, got = grads_of(net, x, zt.offload_activations(store, min_bytes=16 << 10))
        assert torch.equal(loss, want_loss)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    st = store.stats()
    assert st["saved"] > 0
    assert st["loaded"] == st["saved"]
    assert st["held_tensors"] == 0
    if tier == "nvme":
        assert st["hits"] + st["on_demand"] == st["loaded"]


def test_the_store_holds_what_left_memory_during_forward():
    net, x = make()
    store = zt.ActivationStore("cpu", pinned_budget_bytes=64 << 20)
    sizes = []

    with zt.offload_activations(store, min_bytes=16 << 10):
        loss = net(x)
    held = store.stats()
    # Every tensor the store holds is one autograd would otherwise keep in memory until
    # backward; none of them is a parameter (those stay: they are alive anyway).
    assert held["held_tensors"] > 0
    assert held["held_bytes"] == held["bytes_saved"]
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    print(f"\nactivations moved out of memory during forward: {held['held_bytes']} bytes in "
          f"{held['held_tensors']} tensors (parameters: {params} bytes)")
    loss.backward()
    after = store.stats()
    assert after["held_tensors"] == 0
    assert after["held_bytes"] == 0
    del sizes


def test_a_tensor_saved_twice_goes_once_and_small_ones_stay():
    store = zt.ActivationStore("cpu", pinned_budget_bytes=16 << 20)
    x = torch.randn(512, 512, requires_grad=True)
    small = torch.randn(4, requires_grad=True)
    with zt.offload_activations(store, min_bytes=64 << 10):
        y = x * 2
        # mul saves its other operand: y is saved by both products.
        z = (y * y).sum() + (small * small).sum()
    st = store.stats()
    assert st["saved"] == 1  # y once; x is a leaf that requires grad, small is below the bar
    z.backward()
    assert torch.equal(x.grad, 8 * x.detach())
    assert st["bytes_saved"] == 512 * 512 * 4
    assert store.stats()["loaded"] == 1


def test_a_full_cpu_budget_keeps_the_rest_in_memory():
    net, x = make()
    want_loss, want = grads_of(net, x)
    store = zt.ActivationStore("cpu", pinned_budget_bytes=1 << 20)  # room for a few tensors
    loss, got = grads_of(net, x, zt.offload_activations(store, min_bytes=16 << 10))
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert 0 < store.stats()["saved"]
    assert store.stats()["pinned_bytes_peak"] <= 1 << 20


def test_bad_options_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="tier 'disk'"):
        zt.ActivationStore("disk")
    with pytest.raises(ValueError, match="needs nvme_path"):
        zt.ActivationStore("nvme")
    with pytest.raises(zinf.IoError) as e:
        zt.ActivationStore("nvme", nvme_path=str(tmp_path / "missing"))
    assert "missing" in str(e.value)
    with pytest.raises(ValueError, match="not both"):
        with zt.offload_activations(zt.ActivationStore("cpu"), tier="cpu"):
            pass


def test_a_path_with_a_nul_byte_is_refused_naming_the_argument_not_cut(tmp_path):
    cut = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"nvme_path '.*ck\\x00zz' has an embedded NUL byte"):
        zt.ActivationStore("nvme", nvme_path=str(cut) + "\0zz")
    with pytest.raises(ValueError, match=r"nvme_path\[0\] '.*ck\\x00' has an embedded NUL"):
        zt.ActivationStore("nvme", nvme_path=[str(cut) + "\0"])
    assert not cut.exists()
