# SPDX-License-Identifier: Apache-2.0
# python3 -m zinf.bench: each mode runs at a small size and prints one JSON document with its
# same-run reference (the figures themselves are measured in docs/python.md, not here).
import json
import os
import subprocess
import sys

import pytest


def run(*args):
    out = subprocess.run([sys.executable, "-m", "zinf.bench", *args], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_adam_compares_with_torch_in_the_same_run():
    doc = run("adam", "--numel", "1M", "--rounds", "1", "--steps", "1", "--threads", "1")
    assert doc["bench"] == "python-adam"
    assert doc["numel"] == 1_000_000
    assert doc["median_speedup"] > 0
    assert len(doc["rounds"]) == 1


@pytest.mark.skipif(not os.environ.get("ZINF_BIN"), reason="ZINF_BIN (the zinf CLI) not set")
def test_step_compares_with_the_cli_in_the_same_run(tmp_path):
    doc = run("step", "--dir", str(tmp_path), "--numel", "4M", "--rounds", "1", "--steps", "2")
    assert doc["bench"] == "python-step"
    assert doc["rounds"][0]["cli_s"] > 0 and doc["rounds"][0]["python_s"] > 0


def test_save_compares_fast_file_writer_with_a_durable_plain_save(tmp_path):
    doc = run("save", "--dir", str(tmp_path), "--size", "8M", "--tensors", "4", "--rounds", "1")
    assert doc["bench"] == "python-save"
    assert doc["bytes"] == 8_000_000
    row = doc["rounds"][0]
    assert row["plain_fsync_s"] > 0 and row["fast_s"] > 0
    assert doc["median_speedup"] == row["speedup"]


def test_activations_compares_offload_with_the_plain_iteration(tmp_path):
    doc = run("activations", "--dir", str(tmp_path), "--width", "64", "--layers", "2",
              "--tokens", "64", "--iters", "1", "--rounds", "1", "--min-bytes", "4096")
    assert doc["bench"] == "python-activations"
    row = doc["rounds"][0]
    assert row["plain_s"] > 0 and row["offload_s"] > 0
    assert doc["median_ratio"] == row["ratio"]
    # Each 64 x 256 hidden activation (64 KiB) is over the threshold: the store held some at
    # the end of forward, and every tensor it took came back in backward.
    assert 0 < row["held_bytes"] < doc["saved_bytes_per_iteration"]
    assert doc["store"]["saved"] == doc["store"]["loaded"] > 0
    assert doc["store"]["held_bytes"] == 0

