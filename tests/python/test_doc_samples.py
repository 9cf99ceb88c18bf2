# SPDX-License-Identifier: Apache-2.0
# Every ```python sample in docs/*.md and README.md runs as written on the torch under test
# (1.13 and 2.13): each is a fragment, so a prelude here defines the names it leaves to the
# reader (model, loader, loss, a handle), and its drive paths (/nvme, /nvme0, /mnt/nvme) point
# into the test's directory. A sample without a prelude fails, so a new one is run too.
import pathlib
import re
import socket
import textwrap

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

COMMON = """
import os, types
import torch
import zinf, zinf.torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)
    def forward(self, x):
        return x + self.fc(self.norm(x))

def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), Block(), Block(), torch.nn.Linear(8, 2))

model = build_model()
batch = torch.randn(3, 4)
"""

# Keyed by a line that only that sample holds.
PRELUDES = {
    "h.sync_pread(buf, \"/nvme/state.bin\", file_offset=1 << 30)": """
from zinf.compat.deepspeed import aio_handle
h = aio_handle()
buf = zinf.torch.pinned_zeros((1 << 20,), torch.float32)
with open("/nvme/state.bin", "wb") as f:
    f.write(bytes(4096))     # far shorter than the read at 1 GiB: the sample's error
""",
    "model(batch).loss.backward(); opt.step(); opt.zero_grad()": """
class WithLoss(torch.nn.Module):   # a model whose output has .loss, as the sample reads it
    def __init__(self):
        super().__init__()
        self.net = build_model()
    def forward(self, x):
        return types.SimpleNamespace(loss=self.net(x).pow(2).mean())
model = WithLoss()
loader = [torch.randn(3, 4) for _ in range(100)]   # step 100 starts a save_async
""",
    "{\"params\": norms_and_biases, \"weight_decay\": 0.0}], lr=3e-4)": """
decay_params = [p for p in model.parameters() if p.dim() == 2]
norms_and_biases = [p for p in model.parameters() if p.dim() != 2]
loss = model(batch).pow(2).mean()
""",
    "dist.init_process_group(\"gloo\", timeout=datetime.timedelta(minutes=5))": """
loss = model(batch).pow(2).mean()
""",
    "off = zinf.torch.offload_parameters(model, unit=Block,": """
data = [(torch.randn(3, 4), torch.randn(3, 2)) for _ in range(3)]
loss_fn = torch.nn.functional.mse_loss
""",
    "store = zt.ActivationStore(\"nvme\", nvme_path=\"/nvme0/act\"": """
net = build_model()
model = lambda x: net(x).pow(2).mean()   # the sample's model returns its loss
""",
    "with zinf.torch.FastFileWriter(\"/nvme/model.pt\") as f:": "",
    "from zinf.compat.deepspeed import AsyncIOBuilder, DeepSpeedCPUAdam": "",
    "dist.init_process_group(\"gloo\")": """
def my_shard_of_the_data():
    return [torch.randn(3, 4) for _ in range(2)]
""",
}


def samples():
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 1
            found.append(pytest.param(m.group(1), id=f"{doc.name}:{line}"))
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sample", samples())
def test_sample_runs(sample, tmp_path, monkeypatch):
    keys = [k for k in PRELUDES if k in sample]
    assert len(keys) == 1, "a new sample in the docs: give it a prelude in PRELUDES"
    drive = tmp_path / "nvme"
    for d in ("opt", "params", "act", "zinf"):
        (drive / d).mkdir(parents=True)
    code = COMMON + textwrap.dedent(PRELUDES[keys[0]]) + sample
    for path in ("/mnt/nvme", "/nvme0", "/nvme"):
        code = code.replace(f'"{path}', f'"{drive}')
    # The distributed samples: one gloo process (torchrun's environment).
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    try:
        exec(compile(code, "sample", "exec"), {"__name__": "sample"})
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
