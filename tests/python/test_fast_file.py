# SPDX-License-Identifier: Apache-2.0
# zinf.torch.FastFileWriter / FastFileReader: torch.save through the O_DIRECT writer gives the
# very bytes torch.save writes to any other file object (io.BytesIO; a save to a path names its
# zip records after the file, so those bytes differ by name only), and torch.load through the reader gives back
# every tensor bitwise; what torch.save calls on the file object (write and flush only) is
# what the writer supports, and a seek elsewhere is refused with clear text; errors are
# OSError with errno and filename. And AdamW(state="nvme").save_async: the checkpoint holds
# the state at the call while steps go on.
import errno
import gc
import io
import os
import subprocess
import sys

import pytest
import torch

import zinf
from zinf.torch import AdamW, FastFileReader, FastFileWriter


def state_dict():
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Linear(37, 300), torch.nn.ReLU(), torch.nn.Linear(300, 5))
    sd = m.state_dict()
    sd["odd"] = torch.arange(4099, dtype=torch.int16)  # a tail that is no whole block
    sd["bf16"] = torch.randn(333).to(torch.bfloat16)
    return sd


def same_tensors(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        # Bitwise, NaN payloads included: compare the bytes.
        assert a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8)), k


@pytest.mark.parametrize("buffer_bytes", [4096, 8192 * 3, 8 << 20])
def test_torch_save_writes_the_bytes_of_a_plain_save_and_loads_back(tmp_path, buffer_bytes):
    sd = state_dict()
    plain = io.BytesIO()
    fast = tmp_path / "fast.pt"
    torch.save(sd, plain)
    with FastFileWriter(fast, buffer_bytes=buffer_bytes) as f:
        torch.save(sd, f)
        assert f.tell() == len(plain.getvalue())
    assert fast.read_bytes() == plain.getvalue()
    with FastFileReader(fast, buffer_bytes=buffer_bytes) as f:
        back = torch.load(f)
    same_tensors(back, sd)
    same_tensors(torch.load(fast), sd)  # an ordinary file for anyone else


def test_what_torch_save_calls_is_supported_and_a_seek_elsewhere_is_refused(tmp_path):
    calls = []

    class Traced(FastFileWriter):
        def __getattribute__(self, name):
            if name in ("write", "flush", "seek", "tell", "truncate", "fileno", "read"):
                calls.append(name)
            return super().__getattribute__(name)

    path = tmp_path / "t.pt"
    with Traced(path) as f:
        torch.save(state_dict(), f)
        assert set(calls) <= {"write", "flush"}, calls
        assert "write" in calls
        assert f.seek(0, io.SEEK_CUR) == f.tell()  # where it is: fine
        with pytest.raises(io.UnsupportedOperation,
                           match=r"FastFileWriter writes .*t\.pt front to back; seek\(0, 0\)"):
            f.seek(0)
    same_tensors(torch.load(path), state_dict())


def test_the_reader_seeks_and_reads_like_a_file(tmp_path):
    data = bytes(range(256)) * 100 + b"tail"
    path = tmp_path / "d.bin"
    with FastFileWriter(path, buffer_bytes=4096) as f:
        f.write(data[:10])
        f.write(memoryview(data)[10:])
    with FastFileReader(path, buffer_bytes=4096) as f:
        assert f.read(5) == data[:5]
        assert f.seek(-4, io.SEEK_END) == len(data) - 4
        assert f.read() == b"tail"
        assert f.read(1) == b""
        f.seek(5000)
        assert f.read(9000) == data[5000:14000]


def test_errors_are_oserror_with_errno_and_filename(tmp_path):
    missing = tmp_path / "no-such-dir" / "x.pt"
    with pytest.raises(OSError) as e:
        FastFileWriter(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    with pytest.raises(OSError) as e:
        FastFileReader(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    # A directory where the file should be: EISDIR, named.
    with pytest.raises(OSError) as e:
        FastFileWriter(tmp_path)
    assert e.value.errno == errno.EISDIR
    assert e.value.filename == str(tmp_path)
    f = FastFileWriter(tmp_path / "c.pt")
    f.close()
    with pytest.raises(ValueError, match="closed file"):
        f.write(b"x")


# Run by the test below in a child with a 40 MiB tmpfs at argv[1]: an 8 MiB save fits, a 48 MiB
# one fails with a catchable OSError (ENOSPC, the file, a range inside the save) and the
# process goes on.
_SMALL_DRIVE_CHILD = """
import errno, sys, torch
from zinf.torch import FastFileWriter
path = sys.argv[1] + "/ck.pt"
small = {"w": torch.arange(2 << 20, dtype=torch.float32)}
with FastFileWriter(path) as f:
    torch.save(small, f)
assert torch.equal(torch.load(path)["w"], small["w"])
big = {"w": torch.ones(12 << 20)}
try:
    with FastFileWriter(path) as f:
        torch.save(big, f)
    sys.exit("the 48 MiB save did not fail")
except OSError as e:
    assert e.errno == errno.ENOSPC, e
    assert e.filename == path, e
    assert 0 < e.length and e.offset + e.length <= (48 << 20) + (1 << 20), e
    print("raised:", e)
print("alive")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_save_that_fits_a_nearly_full_drive_succeeds_and_one_that_does_not_raises(tmp_path):
    # The writer's 64 MiB allocation ahead once failed an 8 MiB save with 40 MiB free, and
    # under torch 1.13 a failure raised from write() aborted the interpreter (torch's zip
    # writer finishes the file in its destructor, which throws): the error now comes from
    # flush(), which torch.save calls after its last write.
    mnt = tmp_path / "small"
    mnt.mkdir()
    # A mount namespace of the child's own: nothing is left mounted if the test dies.
    script = tmp_path / "child.py"
    script.write_text(_SMALL_DRIVE_CHILD)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o size=40m tmpfs "$1" || exit 77; '
                        'exec "$2" "$3" "$1"', "sh", str(mnt), sys.executable, str(script)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 77:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "raised: [Errno 28]" in r.stdout and r.stdout.rstrip().endswith("alive"), r.stdout


def test_a_path_with_a_nul_byte_is_refused_naming_the_argument_not_cut(tmp_path):
    cut = tmp_path / "ck"
    with pytest.raises(ValueError, match=r"path '.*ck\\x00zz' has an embedded NUL byte"):
        FastFileWriter(str(cut) + "\0zz")
    assert not cut.exists()
    cut.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"path '.*ck\\x00' has an embedded NUL byte"):
        FastFileReader(os.fsencode(cut) + b"\0")
    with pytest.raises(TypeError, match="path must be a path"):
        FastFileWriter(3)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(37, 300), torch.nn.ReLU(), torch.nn.Linear(300, 5))


def train(model, opt, steps, seed):
    torch.manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(16, 37)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_save_async_holds_the_state_at_the_call_while_steps_go_on(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    a = make_model()
    opt_a = AdamW(a.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "a",
                  sub_group_size=32768)
    train(a, opt_a, 3, seed=1)
    at_save = [p.detach().clone() for p in a.parameters()]
    assert opt_a.last_save_snapshot() == "none"
    opt_a.save_async(tmp_path / "ckpt")
    # Cloned where tmp_path is on XFS or btrfs (the swap files are there too), else streamed.
    assert opt_a.last_save_snapshot() in ("reflink", "streamed")
    train(a, opt_a, 3, seed=2)  # while the save may still be writing
    opt_a.wait_save()
    assert not opt_a.save_in_flight()
    del opt_a  # one owner per checkpoint directory
    gc.collect()
    b = make_model(seed=99)
    opt_b = AdamW(b.parameters(), lr=1e-2, state="nvme", nvme_path=tmp_path / "b",
                  sub_group_size=32768)
    opt_b.load(tmp_path / "ckpt")
    for pa, pb in zip(at_save, b.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(ValueError, match="save_async inside|empty"):
        opt_b.save_async("")
    # state="cpu" has no save_async: never a snapshot.
    assert AdamW(make_model().parameters(), lr=1e-2).last_save_snapshot() == "none"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    import threading
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = []

    def attempt():
        try:
            FastFileReader(str(fifo))
            result.append(None)
        except OSError as e:
            result.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "FastFileReader blocked on a FIFO"
    assert result and result[0] is not None and "FIFO" in str(result[0])
