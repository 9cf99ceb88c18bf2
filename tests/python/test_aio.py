# SPDX-License-Identifier: Apache-2.0
# zinf.compat.deepspeed.aio_handle in the shape of DeepSpeed's aio tests: block sizes, queue
# depths, offsets, sync and async, read after write, every byte checked; plus what DeepSpeed
# leaves silent: a read past the end, a missing file, a failed async op among good ones.
import errno
import os

import pytest
import torch

import zinf
from zinf.compat.deepspeed import AsyncIOBuilder, aio_handle
from zinf.torch import pinned_zeros

MB = 1 << 20


def random_bytes(n, rng, pinned=True):
    t = pinned_zeros((n,), torch.uint8) if pinned else torch.zeros(n, dtype=torch.uint8)
    t.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=rng))
    return t


@pytest.mark.parametrize("block_size", [4096, 64 * 1024, MB])
@pytest.mark.parametrize("queue_depth", [1, 4, 32])
@pytest.mark.parametrize("pinned", [True, False])
def test_sync_write_then_read_round_trips_every_byte(tmp_path, rng, block_size, queue_depth,
                                                     pinned):
    h = AsyncIOBuilder().load().aio_handle(block_size, queue_depth, False, False, 1)
    data = random_bytes(3 * MB + 4096, rng, pinned)
    path = tmp_path / "f.bin"
    assert h.sync_pwrite(data, str(path)) == 1
    assert os.path.getsize(path) == data.numel()
    out = random_bytes(data.numel(), rng, pinned)
    assert h.sync_pread(out, str(path)) == 1
    assert torch.equal(out, data)


def test_unaligned_sizes_and_offsets_use_buffered_io_and_stay_exact(tmp_path, rng):
    h = aio_handle()
    path = str(tmp_path / "odd.bin")
    whole = random_bytes(100_003, rng, pinned=False)
    assert h.sync_pwrite(whole, path) == 1
    part = torch.zeros(777, dtype=torch.uint8)
    assert h.sync_pread(part, path, file_offset=12_345) == 1
    assert torch.equal(part, whole[12_345:12_345 + 777])


def test_async_operations_complete_at_wait_with_their_count(tmp_path, rng):
    h = aio_handle(block_size=MB, queue_depth=8)
    bufs = [random_bytes(MB + 8192 * i, rng) for i in range(5)]
    paths = [str(tmp_path / f"a{i}.bin") for i in range(5)]
    for b, p in zip(bufs, paths):
        assert h.async_pwrite(b, p) == 0
    assert h.wait() == 5
    assert h.wait() == 0
    outs = [torch.zeros_like(b) for b in bufs]
    for o, p in zip(outs, paths):
        assert h.async_pread(o, p) == 0
    assert h.wait() == 5
    for o, b in zip(outs, bufs):
        assert torch.equal(o, b)


def test_writes_at_offsets_build_one_file(tmp_path, rng):
    h = aio_handle()
    path = str(tmp_path / "parts.bin")
    parts = [random_bytes(64 * 1024, rng) for _ in range(4)]
    for i, p in enumerate(parts):
        assert h.sync_pwrite(p, path, file_offset=i * 64 * 1024) == 1
    whole = torch.zeros(4 * 64 * 1024, dtype=torch.uint8)
    assert h.sync_pread(whole, path) == 1
    assert torch.equal(whole, torch.cat(parts))


def test_validate_compares_with_the_file(tmp_path, rng):
    h = aio_handle()
    path = str(tmp_path / "v.bin")
    data = random_bytes(256 * 1024, rng)
    assert h.pwrite(data, path, True, False) == 1
    out = torch.zeros_like(data)
    assert h.pread(out, path, True, False) == 1
    assert h.read(out, path, True) == 0  # DeepSpeed's read returns 0
    assert torch.equal(out, data)


def test_read_past_the_end_raises_naming_file_offset_and_length(tmp_path, rng):
    h = aio_handle()
    path = str(tmp_path / "short.bin")
    h.sync_pwrite(random_bytes(8192, rng), path)
    big = torch.zeros(16384, dtype=torch.uint8)
    with pytest.raises(zinf.IoError) as info:
        h.sync_pread(big, path)
    e = info.value
    assert isinstance(e, OSError)
    assert e.filename == path
    assert (e.offset, e.length, e.kind) == (0, 16384, "short_transfer")
    assert "8192 bytes" in str(e)


def test_missing_file_raises_enoent_with_its_name(tmp_path):
    h = aio_handle()
    path = str(tmp_path / "nope.bin")
    with pytest.raises(zinf.IoError) as info:
        h.sync_pread(torch.zeros(4096, dtype=torch.uint8), path)
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == path
    assert isinstance(info.value, OSError)


def test_a_failed_async_op_raises_from_wait_after_the_others_ended(tmp_path, rng):
    h = aio_handle()
    good = str(tmp_path / "good.bin")
    data = random_bytes(MB, rng)
    h.sync_pwrite(data, good)
    out = torch.zeros_like(data)
    assert h.async_pread(out, good) == 0
    # Fails at submission (the file is shorter than asked): raised at once, nothing queued.
    with pytest.raises(zinf.IoError):
        h.async_pread(torch.zeros(2 * MB, dtype=torch.uint8), good)
    assert h.wait() == 1
    assert torch.equal(out, data)


def test_getters_report_the_constructor_arguments():
    h = aio_handle(block_size=2 * MB, queue_depth=16, single_submit=True, overlap_events=True,
                   intra_op_parallelism=3)
    assert h.get_block_size() == 2 * MB
    assert h.get_queue_depth() == 16
    assert h.get_single_submit() is True
    assert h.get_overlap_events() is True
    assert h.get_intra_op_parallelism() == 3
    assert h.get_thread_count() == 3
    assert aio_handle(num_threads=2).get_intra_op_parallelism() == 2


def test_bad_arguments_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 2147483647\], got 0"):
        aio_handle(block_size=0)
    with pytest.raises(ValueError, match=r"queue_depth must be in \[1, 2147483647\], got 0"):
        aio_handle(queue_depth=0)
    h = aio_handle()
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(torch.zeros(8, 8, dtype=torch.uint8).t(), str(tmp_path / "x"))
    with pytest.raises(ValueError, match="torch.Tensor"):
        h.sync_pwrite(b"bytes", str(tmp_path / "x"))


def test_locked_tensors_are_zeroed_aligned_and_survive_free():
    h = aio_handle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.float16))
    assert t.dtype == torch.float16 and t.numel() == 1000
    assert torch.count_nonzero(t) == 0
    assert t.data_ptr() % 4096 == 0
    assert h.is_pinned(t)
    assert not h.is_pinned(torch.zeros(4))
    assert h.free_cpu_locked_tensor(t) is True
    assert h.free_cpu_locked_tensor(t) is False  # freed once
    t.fill_(1.5)  # still the caller's memory: freed only with the tensor
    assert float(t.sum()) == 1500.0
