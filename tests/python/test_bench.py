# SPDX-License-Identifier: Apache-2.0
# python3 -m zinf.bench: each mode runs at a small size and prints one JSON document with its
# same-run reference (the figures themselves are measured in docs/python.md, not here).
import json
import os
import shutil
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


@pytest.mark.parametrize("layout", ["aligned", "staggered"])
def test_adam_layouts_place_every_parameter_and_gradient(layout):
    from zinf.bench import make_params
    ps = make_params(4096, 4, layout)
    for p in ps:
        for t, index in ((p, 0), (p.grad, 3)):
            want = 1088 * index if layout == "staggered" else 0
            assert t.data_ptr() % (2 << 20) == want
    doc = run("adam", "--numel", "1M", "--rounds", "1", "--steps", "1", "--threads", "1",
              "--layout", layout)
    assert doc["layout"] == layout and doc["median_speedup"] > 0


@pytest.mark.skipif(not os.environ.get("ZINF_BIN"), reason="ZINF_BIN (the zinf CLI) not set")
def test_step_compares_with_the_cli_in_the_same_run(tmp_path):
    doc = run("step", "--dir", str(tmp_path), "--numel", "4M", "--rounds", "1", "--steps", "2")
    assert doc["bench"] == "python-step"
    assert doc["rounds"][0]["cli_s"] > 0 and doc["rounds"][0]["python_s"] > 0


@pytest.mark.skipif(not os.environ.get("ZINF_BIN"), reason="ZINF_BIN (the zinf CLI) not set")
def test_aio_compares_the_drop_in_with_the_cli_in_the_same_run(tmp_path):
    doc = run("aio", "--dir", str(tmp_path), "--size", "8Mi", "--rounds", "2")
    assert doc["bench"] == "python-aio"
    assert (doc["size"], doc["block_size"], doc["queue_depth"]) == (8 << 20, 1 << 20, 8)
    for row in doc["rounds"]:
        assert row["cli_write_gbps"] > 0 and row["dropin_read_gbps"] > 0
        assert row["write_ratio"] == pytest.approx(row["dropin_write_gbps"]
                                                   / row["cli_write_gbps"])
    assert list(tmp_path.iterdir()) == []  # the bench's temporary folder removed


def test_save_compares_fast_file_writer_with_a_durable_plain_save(tmp_path):
    doc = run("save", "--dir", str(tmp_path), "--size", "8M", "--tensors", "4", "--rounds", "1")
    assert doc["bench"] == "python-save"
    assert doc["bytes"] == 8_000_000
    row = doc["rounds"][0]
    assert row["plain_fsync_s"] > 0 and row["fast_s"] > 0
    assert doc["median_speedup"] == row["speedup"]
    if row["direct"] and shutil.which("fio"):
        # fio's durable write of the same bytes, the drive's floor, in the same round.
        assert row["fio_s"] > 0
        assert row["fast_over_fio"] == pytest.approx(row["fast_s"] / row["fio_s"])
        assert doc["median_plain_over_fio"] == row["plain_over_fio"]
    else:
        assert "fio_s" not in row


def run_with_path(path_dir, *args):
    """zinf.bench with PATH set to `path_dir` only: (exit status, stdout, last line of stderr)."""
    env = dict(os.environ, PATH=str(path_dir))
    out = subprocess.run([sys.executable, "-m", "zinf.bench", *args], capture_output=True,
                         text=True, timeout=600, env=env)
    lines = out.stderr.strip().splitlines()
    return out.returncode, out.stdout, lines[-1] if lines else ""


def test_save_with_fio_on_but_not_on_path_is_refused(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rc, _, err = run_with_path(empty, "save", "--dir", str(scratch), "--size", "1M",
                               "--tensors", "2", "--rounds", "1", "--fio", "on")
    assert rc == 1
    assert err == "zinf.bench save: --fio on, but fio is not on PATH"
    assert list(scratch.iterdir()) == []


def test_save_names_a_failing_fio_and_leaves_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fio"
    fake.write_text("#!/bin/sh\necho 'fio: injected failure' >&2\nexit 3\n")
    fake.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rc, out, err = run_with_path(bin_dir, "save", "--dir", str(scratch), "--size", "1M",
                                 "--tensors", "2", "--rounds", "1", "--fio", "on")
    if rc == 0:
        # Where the file system refuses O_DIRECT the writer is buffered and fio is not run.
        row = json.loads(out)["rounds"][0]
        assert not row["direct"] and "fio_s" not in row
    else:
        assert rc == 1
        assert err.startswith("zinf.bench save: fio failed writing " + str(scratch))
        assert err.endswith("fio.dat (exit 3): fio: injected failure")
    assert list(scratch.iterdir()) == []  # the bench's temporary folder and fio's file removed


def test_save_without_fio_reports_no_reference(tmp_path):
    doc = run("save", "--dir", str(tmp_path), "--size", "1M", "--tensors", "2", "--rounds", "1",
              "--fio", "off")
    assert "fio_s" not in doc["rounds"][0] and "median_fio_s" not in doc


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



def test_deepspeed_mode_runs_against_deepspeeds_ops_or_says_where_they_are(tmp_path):
    # DeepSpeed lives in the peers environment only (scripts/peers.sh): elsewhere the mode
    # says so in one line instead of a traceback; there it compares in the same run.
    args = [sys.executable, "-m", "zinf.bench", "deepspeed", "--dir", str(tmp_path),
            "--numel", "1M", "--size", "4Mi", "--rounds", "1", "--steps", "1"]
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        assert out.returncode == 1
        assert "zinf.bench deepspeed: DeepSpeed is not importable here" in out.stderr
        assert "scripts/peers.sh" in out.stderr
        assert out.stdout == ""
        return
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["bench"] == "python-deepspeed" and doc["numel"] == 1_000_000
    for k in ("adam", "write", "read"):
        assert doc[f"median_{k}_ratio"] > 0
    assert os.listdir(tmp_path) == []
