# SPDX-License-Identifier: Apache-2.0
# A user's aio settings (a ds_config's "aio" block, as a dict or a ds_config file) reach the
# I/O engine of every store the Python package builds: the optimizer's nvme tier, the
# parameter store, the activation store and the sharded optimizer; a bad value is refused with
# the config reader's own message before anything is built.
import json

import pytest
import torch

from zinf import _native
from zinf.pinned import io_options
from zinf.torch import AdamW, offload_activations, offload_parameters


def test_a_dict_and_a_ds_config_file_give_the_same_settings(tmp_path):
    from_dict = io_options({"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 3})
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps({"aio": {"block_size": 262144, "queue_depth": 32,
                                       "thread_count": 3}}))
    from_file = io_options(cfg)
    for o in (from_dict, from_file):
        assert (o.block_size, o.queue_depth, o.threads) == (262144, 32, 3)
    d = io_options(None)
    assert (d.block_size, d.queue_depth) == (_native.IoOptions().block_size,
                                             _native.IoOptions().queue_depth)


def test_bad_settings_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="aio argument: aio.block_size: must be a multiple of "
                                         "4096"):
        io_options({"block_size": 1000})
    with pytest.raises(ValueError, match="aio.queue_dpeth.*did you mean"):
        io_options({"queue_dpeth": 4})
    with pytest.raises(ValueError, match="aio.queue_depth: at most 4096"):
        io_options({"queue_depth": 5000})
    with pytest.raises(OSError):
        io_options(tmp_path / "missing.json")
    with pytest.raises(TypeError):
        io_options(42)
    with pytest.raises(ValueError):
        AdamW([torch.nn.Parameter(torch.zeros(4))], state="nvme", nvme_path=str(tmp_path),
              aio={"block_size": 1000})
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


def test_the_optimizer_state_engine_takes_the_settings(tmp_path):
    p = torch.nn.Parameter(torch.randn(100_000))
    opt = AdamW([p], state="nvme", nvme_path=str(tmp_path),
                aio={"block_size": 131072, "queue_depth": 24})
    io = opt.io_settings()
    assert (io["block_size"], io["queue_depth"]) == (131072, 24)
    p.grad = torch.randn_like(p)
    opt.step()  # and it works with them


def test_the_parameter_store_engine_takes_the_settings(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"aio": {"block_size": 65536, "queue_depth": 12}}))
    (tmp_path / "swap").mkdir()
    off = offload_parameters(m, unit=[m[0], m[1]], nvme_path=str(tmp_path / "swap"), aio=cfg)
    io = off.io_settings()
    assert (io["block_size"], io["queue_depth"]) == (65536, 12)
    out = m(torch.randn(2, 64))
    out.sum().backward()
    assert m[0].weight.grad is not None


def test_the_activation_store_takes_the_settings(tmp_path):
    x = torch.randn(256, 1024, requires_grad=True)
    with offload_activations(tier="nvme", nvme_path=str(tmp_path), capacity_bytes=64 << 20,
                             aio={"block_size": 65536, "queue_depth": 4}, min_bytes=0):
        y = (x * 2).sin().sum()
    y.backward()
    assert torch.allclose(x.grad, 2 * (2 * x.detach()).cos())
    with pytest.raises(ValueError, match="aio.block_size"):
        with offload_activations(tier="nvme", nvme_path=str(tmp_path), aio={"block_size": 7}):
            pass
