# SPDX-License-Identifier: Apache-2.0
# examples/torch/train_gpt.py: a few steps of the character-level GPT with its blocks'
# parameters and the Adam state on NVMe give bitwise the loss curve of zinf's in-memory tier
# (no parameter offload, state="cpu"), and torch.optim.AdamW's within the tolerance
# docs/python.md states (the fused kernel rounds differently).
import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch" / "train_gpt.py"
SMALL = ["--steps", "5", "--blocks", "3", "--dim", "64", "--heads", "4", "--context", "32",
         "--batch", "8"]
TORCH_RTOL = 1e-5  # docs/python.md, "Training example"


def run(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--dir", str(tmp_path), "--json",
                           str(out), *SMALL, *extra], capture_output=True, text=True,
                          env=dict(os.environ), timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(out.read_text()), proc.stdout


def test_nvme_run_matches_the_in_memory_tier_bitwise_and_torch_within_tolerance(tmp_path):
    nvme, stdout = run(tmp_path, "nvme", "--params", "nvme", "--state", "nvme")
    memory, _ = run(tmp_path, "memory", "--params", "memory", "--state", "cpu")
    torch_ref, _ = run(tmp_path, "torch", "--params", "memory", "--optimizer", "torch")
    assert len(nvme["losses"]) == 5
    assert nvme["losses"] == memory["losses"]  # bitwise: floats from the same bits
    for a, b in zip(nvme["losses"], torch_ref["losses"]):
        assert a == pytest.approx(b, rel=TORCH_RTOL, abs=0)
    assert nvme["losses"][-1] < nvme["losses"][0]  # it learns
    # The blocks' parameters were read ahead from the second step on, and moved over NVMe.
    s = nvme["param_stats"]
    assert s["hits"] >= s["acquires"] - 3 * 3  # at most the first step's fetches on demand
    assert all(b > 0 for b in nvme["nvme_bytes"])
    lines = [ln for ln in stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == 5 and all("loss" in ln and "ms" in ln and "GB/s" in ln for ln in lines)


def test_param_cpu_tier_matches_too(tmp_path):
    cpu, _ = run(tmp_path, "cpu", "--params", "cpu", "--state", "cpu")
    memory, _ = run(tmp_path, "memory", "--params", "memory", "--state", "cpu")
    assert cpu["losses"] == memory["losses"]


def test_cuda_without_the_torch_optimizer_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--dir", str(tmp_path), "--device",
                           "cuda", "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--device cuda" in proc.stderr
