# SPDX-License-Identifier: Apache-2.0
# zinf.compat.deepspeed's aio surface as DeepSpeed documents it: every I/O method with a path
# and with an open descriptor (positional and fd=), any block size and queue depth, the
# process-wide registry of locked tensors shared by every aio_handle and pin_handle, the
# module-level aio_read / aio_write / deepspeed_memcpy, DeepSpeed's keyword names. Every case
# compares the bytes and checks that nothing appeared in the working directory: a call form
# must never create or touch a file the caller did not name.
import errno
import os
import stat
import threading

import pytest
import torch

import zinf
from zinf.compat.deepspeed import (AsyncIOBuilder, PinMemoryBuilder, aio_handle, aio_read,
                                   aio_write, deepspeed_memcpy, pin_handle)
from zinf.torch import pinned_zeros

KB = 1024


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A working directory of its own, checked to stay empty."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    assert sorted(os.listdir(work)) == [], "a call created a file in the working directory"


def payload(n, seed=7, pinned=True):
    g = torch.Generator().manual_seed(seed)
    t = pinned_zeros((n,), torch.uint8) if pinned else torch.zeros(n, dtype=torch.uint8)
    t.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g))
    return t


def open_fd(path, flags, direct):
    """os.open(path, flags), with O_DIRECT if `direct`; skips (with the reason) on a file
    system that refuses O_DIRECT, such as an old tmpfs."""
    try:
        return os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)
    except OSError as e:
        if not direct:
            raise
        pytest.skip(f"O_DIRECT refused here: {e}")


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


WRITES = ["write", "pwrite", "sync_pwrite", "async_pwrite"]
READS = ["read", "pread", "sync_pread", "async_pread"]


def call(h, method, buf, where, offset, keyword):
    """Calls `method` in DeepSpeed's positional form, or with the file as fd=/filename=."""
    f = getattr(h, method)
    if keyword:
        kw = {"fd": where} if isinstance(where, int) else {"filename": where}
        if method in ("read", "write"):
            return f(buf, validate=False, file_offset=offset, **kw)
        if method in ("pread", "pwrite"):
            return f(buf, validate=False, file_offset=offset, **kw, **{"async": False})
        return f(buf, file_offset=offset, **kw)
    if method in ("read", "write"):
        return f(buf, where, False, offset)
    if method in ("pread", "pwrite"):
        return f(buf, where, False, False, offset)
    return f(buf, where, offset)


def expected_return(h, method):
    if method.startswith("async"):
        return 0
    return 0 if method in ("read", "write") else 1


@pytest.mark.parametrize("method", WRITES)
@pytest.mark.parametrize("form", ["path", "fd", "fd-direct"])
@pytest.mark.parametrize("keyword", [False, True])
def test_every_write_form_lands_in_the_named_file(tmp_path, cwd, method, form, keyword):
    h = aio_handle(4 * KB, 4)
    data = payload(64 * KB)
    target = tmp_path / "out.bin"
    target.write_bytes(b"\xee" * (128 * KB))
    fd = None
    if form == "path":
        where = str(target)
    else:
        fd = open_fd(target, os.O_WRONLY, form == "fd-direct")
        where = fd
    try:
        assert call(h, method, data, where, 16 * KB, keyword) == expected_return(h, method)
        if method.startswith("async"):
            assert h.wait() == 1
        if fd is not None:
            os.fstat(fd)  # still open: the caller's descriptor is never closed
    finally:
        if fd is not None:
            os.close(fd)
    got = file_bytes(target)
    assert got[:16 * KB] == b"\xee" * (16 * KB)
    assert got[16 * KB:80 * KB] == bytes(data.numpy())
    assert got[80 * KB:] == b"\xee" * (48 * KB)


@pytest.mark.parametrize("method", READS)
@pytest.mark.parametrize("form", ["path", "fd", "fd-direct"])
@pytest.mark.parametrize("keyword", [False, True])
def test_every_read_form_reads_the_named_file(tmp_path, cwd, method, form, keyword):
    h = aio_handle(4 * KB, 4)
    whole = payload(128 * KB, seed=3)
    target = tmp_path / "in.bin"
    target.write_bytes(bytes(whole.numpy()))
    out = pinned_zeros((32 * KB,), torch.uint8)
    fd = None
    if form == "path":
        where = str(target)
    else:
        fd = open_fd(target, os.O_RDONLY, form == "fd-direct")
        where = fd
    try:
        assert call(h, method, out, where, 8 * KB, keyword) == expected_return(h, method)
        if method.startswith("async"):
            assert h.wait() == 1
    finally:
        if fd is not None:
            os.close(fd)
    assert torch.equal(out, whole[8 * KB:40 * KB])


def test_the_descriptor_overload_writes_through_the_callers_descriptor(tmp_path, cwd):
    # FastFileWriter's call: async_pwrite(tensor, fd, offset) positionally. The bytes must go
    # to the descriptor's file, nothing named after the descriptor's number may appear.
    h = aio_handle()
    path = tmp_path / "ckpt.bin"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        data = payload(256 * KB)
        assert h.async_pwrite(data, fd, 0) == 0
        assert h.wait() == 1
        assert h.async_pwrite(data, fd=fd, file_offset=256 * KB) == 0
        assert h.wait() == 1
    finally:
        os.close(fd)
    assert file_bytes(path) == bytes(data.numpy()) * 2
    assert not os.path.exists(cwd / str(fd))


def test_a_misaligned_buffer_on_an_o_direct_descriptor_goes_through_a_bounce(tmp_path, cwd):
    h = aio_handle()
    path = tmp_path / "d.bin"
    fd = open_fd(path, os.O_CREAT | os.O_RDWR, direct=True)
    try:
        backing = payload(64 * KB + 1)
        data = backing[1:]  # an odd address
        assert data.data_ptr() % 4096 != 0
        assert h.sync_pwrite(data, fd, 0) == 1
        back = torch.zeros(64 * KB + 3, dtype=torch.uint8)[3:]
        assert h.sync_pread(back, fd, 0) == 1
        assert torch.equal(back, data)
    finally:
        os.close(fd)
    assert file_bytes(path) == bytes(data.numpy())


def test_o_direct_descriptor_with_a_misaligned_offset_is_refused_naming_it(tmp_path, cwd):
    h = aio_handle()
    path = tmp_path / "d.bin"
    fd = open_fd(path, os.O_CREAT | os.O_WRONLY, direct=True)
    try:
        with pytest.raises(zinf.IoError) as info:
            h.sync_pwrite(payload(4096), fd, 100)
        assert str(path) in str(info.value)
        assert f"descriptor {fd}" in str(info.value)
        assert "O_DIRECT" in str(info.value)
        assert (info.value.offset, info.value.length) == (100, 4096)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == 0


def test_a_descriptor_without_the_access_is_refused(tmp_path, cwd):
    h = aio_handle()
    path = tmp_path / "ro.bin"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(zinf.IoError) as info:
            h.sync_pwrite(payload(4096), fd)
        assert info.value.errno == errno.EBADF
        assert "reading only" in str(info.value)
    finally:
        os.close(fd)
    assert file_bytes(path) == b"x" * 4096
    with pytest.raises(zinf.IoError) as info:
        h.sync_pread(torch.zeros(16, dtype=torch.uint8), 987654)  # not open
    assert info.value.errno == errno.EBADF


@pytest.mark.parametrize("bad", [1.5, None, object(), [3], True])
def test_anything_but_a_path_or_a_descriptor_is_a_type_error(tmp_path, cwd, bad):
    h = aio_handle()
    for method in WRITES + READS:
        with pytest.raises(TypeError):
            call(h, method, payload(4096), bad, 0, False)


def test_a_path_with_a_nul_byte_is_refused_not_cut(tmp_path, cwd):
    h = aio_handle()
    for where in [str(tmp_path / "n.bin") + "\0zzz", "n.bin\0zzz", b"n.bin\0"]:
        with pytest.raises(ValueError, match="NUL"):
            h.sync_pwrite(payload(4096), where)
    assert not (tmp_path / "n.bin").exists()


def test_bytes_and_pathlike_paths_work(tmp_path, cwd):
    h = aio_handle()
    data = payload(8 * KB)
    assert h.sync_pwrite(data, tmp_path / "p.bin") == 1
    out = torch.zeros_like(data)
    assert h.sync_pread(out, os.fsencode(tmp_path / "p.bin")) == 1
    assert torch.equal(out, data)


def test_a_fifo_is_refused_without_blocking(tmp_path, cwd):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    h = aio_handle()
    errors = []

    def attempt():
        for op in (lambda: h.sync_pread(torch.zeros(16, dtype=torch.uint8), str(fifo)),
                   lambda: h.sync_pwrite(payload(4096), str(fifo))):
            try:
                op()
                errors.append(None)
            except zinf.IoError as e:
                errors.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "an aio call on a FIFO blocked"
    assert len(errors) == 2 and all(e is not None for e in errors)
    assert "FIFO" in str(errors[0]) or "fifo" in str(errors[0]).lower()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("block_size", [1, 1024, 5000, 4096 * 3 + 1])
@pytest.mark.parametrize("queue_depth", [1, 2, 5000])
def test_any_positive_block_size_and_queue_depth(tmp_path, cwd, block_size, queue_depth):
    h = AsyncIOBuilder().load().aio_handle(block_size, queue_depth, False, False, 2)
    assert h.get_block_size() == block_size
    assert h.get_queue_depth() == queue_depth
    assert h.get_alignment() == 4096
    data = payload(40 * KB + 5)
    path = str(tmp_path / "b.bin")
    assert h.sync_pwrite(data, path) == 1
    out = torch.zeros_like(data)
    assert h.sync_pread(out, path) == 1
    assert torch.equal(out, data)


def test_read_and_write_return_zero_and_take_an_offset(tmp_path, cwd):
    h = aio_handle()
    path = str(tmp_path / "rw.bin")
    data = payload(12 * KB)
    assert h.write(data, path, True, file_offset=4 * KB) == 0
    out = torch.zeros(12 * KB, dtype=torch.uint8)
    assert h.read(out, path, True, file_offset=4 * KB) == 0
    assert torch.equal(out, data)
    assert file_bytes(path)[:4 * KB] == b"\0" * (4 * KB)


def test_deepspeeds_keyword_names(tmp_path, cwd):
    h = aio_handle()
    path = str(tmp_path / "k.bin")
    data = payload(8 * KB)
    assert h.pwrite(buffer=data, filename=path, validate=True, **{"async": True}) == 0
    assert h.wait() == 1
    out = torch.zeros_like(data)
    assert h.pread(buffer=out, filename=path, validate=False, **{"async": False},
                   file_offset=0) == 1
    assert torch.equal(out, data)
    t = h.new_cpu_locked_tensor(num_elem=16, example_tenosr=torch.empty(0, dtype=torch.int32))
    assert t.dtype == torch.int32 and t.numel() == 16
    assert h.free_cpu_locked_tensor(t)
    with pytest.raises(TypeError, match="unexpected keyword"):
        h.pread(out, path, False, bogus=1)


def test_an_async_buffer_keeps_its_storage_until_wait(tmp_path, cwd):
    h = aio_handle()
    path = str(tmp_path / "s.bin")
    data = payload(1 << 20)
    expect = bytes(data.numpy())
    assert h.async_pwrite(data, path) == 0
    data.set_(torch.empty(0, dtype=torch.uint8))  # the caller lets go of the storage
    assert h.wait() == 1
    assert file_bytes(path) == expect


BLOCK = 64 * KB
BLOCKS = 800


def block_of(i, generation):
    """Block i's bytes in a round: its number and the round, so a block landing at another
    offset, from another round or not at all is seen."""
    t = torch.full((BLOCK,), (i * 7 + generation * 31) % 251, dtype=torch.uint8)
    t[:4] = torch.tensor([i & 255, i >> 8, generation, 0xA5], dtype=torch.uint8)
    return t


@pytest.fixture
def one_torch_thread():
    """torch's own threads off for tests whose threads each make many small tensors: on a
    busy machine every 64 KiB fill otherwise waits for torch's pool (20 ms instead of 20 us)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_threads(target, count):
    errors = []

    def guarded(t):
        try:
            target(t)
        except BaseException as e:  # noqa: B902  (re-raised on the main thread)
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("pinned", [False, True], ids=["torch_empty", "locked"])
def test_one_handle_shared_by_threads_writes_every_block(tmp_path, cwd, one_torch_thread,
                                                       pinned):
    # DeepSpeed's swappers share a handle across threads: one thread's wait() must neither
    # drop another's buffers still in flight nor return before its own thread's operations
    # are complete. Each thread writes a fresh tensor per block and lets go of it at once.
    h = aio_handle(block_size=BLOCK, queue_depth=32, intra_op_parallelism=2)
    path = str(tmp_path / "shared.bin")
    threads = 4
    for generation in range(5):
        def writer(t):
            for i in range(t, BLOCKS, threads):
                src = block_of(i, generation)
                buf = h.new_cpu_locked_tensor(BLOCK, src) if pinned else torch.empty_like(src)
                buf.copy_(src)
                assert h.async_pwrite(buf, path, file_offset=i * BLOCK) == 0
                del buf
                if i % 3 == 0:
                    h.wait()
            h.wait()
        run_threads(writer, threads)
        data = file_bytes(path)
        wrong = [i for i in range(BLOCKS)
                 if data[i * BLOCK:(i + 1) * BLOCK] != bytes(block_of(i, generation).numpy())]
        assert wrong == [], f"round {generation}: {len(wrong)} blocks wrong, first {wrong[:5]}"


@pytest.mark.parametrize("pinned", [False, True], ids=["torch_empty", "locked"])
def test_one_handle_shared_by_threads_reads_every_block(tmp_path, cwd, one_torch_thread,
                                                      pinned):
    h = aio_handle(block_size=BLOCK, queue_depth=32, intra_op_parallelism=2)
    path = str(tmp_path / "shared.bin")
    threads = 4
    for generation in range(5):
        with open(path, "wb") as f:
            for i in range(BLOCKS):
                f.write(bytes(block_of(i, generation).numpy()))
        got = {}

        def reader(t):
            mine = []
            for i in range(t, BLOCKS, threads):
                buf = (h.new_cpu_locked_tensor(BLOCK, torch.empty(0, dtype=torch.uint8))
                       if pinned else torch.zeros(BLOCK, dtype=torch.uint8))
                assert h.async_pread(buf, path, file_offset=i * BLOCK) == 0
                mine.append((i, buf))
                if i % 3 == 0:
                    h.wait()
                    # Every read this thread submitted is complete once its wait() returns.
                    for j, b in mine:
                        got[j] = bytes(b.numpy())
                    mine = []
            h.wait()
            for j, b in mine:
                got[j] = bytes(b.numpy())
        run_threads(reader, threads)
        wrong = [i for i in range(BLOCKS) if got[i] != bytes(block_of(i, generation).numpy())]
        assert wrong == [], f"round {generation}: {len(wrong)} blocks wrong, first {wrong[:5]}"


def test_a_buffer_resized_while_its_read_is_in_flight_is_refused_at_wait(tmp_path, cwd):
    # torch reallocates a resizable storage in place (the same storage object, new bytes),
    # so holding the storage does not keep the bytes: the read goes through bytes of its own,
    # and a tensor resized meanwhile gets nothing and a clear error, not bytes in freed memory.
    h = aio_handle()
    path = str(tmp_path / "r.bin")
    data = payload(1 << 20)
    h.sync_pwrite(data, path)
    out = torch.zeros(1 << 20, dtype=torch.uint8)
    assert h.async_pread(out, path) == 0
    out.resize_(4 << 20)
    out.fill_(9)
    with pytest.raises(ValueError, match=r"r\.bin.* offset 0 was resized while the read was in "
                                         r"flight \(shape \[1048576\] -> \[4194304\]\)"):
        h.wait()
    assert bool((out == 9).all())
    # The handle stays usable, and a buffer left alone gets its bytes.
    again = torch.zeros(1 << 20, dtype=torch.uint8)
    assert h.async_pread(again, path) == 0
    assert h.wait() == 1
    assert torch.equal(again, data)


def test_a_buffer_resized_while_its_write_is_in_flight_writes_what_it_held(tmp_path, cwd):
    h = aio_handle()
    path = str(tmp_path / "w.bin")
    data = payload(1 << 20, pinned=False)
    expect = bytes(data.clone().numpy())  # (numpy() of torch 2 makes its storage fixed)
    assert h.async_pwrite(data, path) == 0
    data.resize_(8 << 20)
    data.fill_(3)
    assert h.wait() == 1
    assert file_bytes(path) == expect


def test_the_locked_tensor_registry_is_process_wide():
    a = AsyncIOBuilder().load().aio_handle(1024, 2, False, False, 1)
    b = aio_handle()
    p = PinMemoryBuilder().load().pin_handle()
    t = a.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.float32))
    view = t.narrow(0, 1024, 1024)
    for h in (a, b, p):
        assert h.is_pinned(t) and h.is_pinned(view)
    assert p.free_cpu_locked_tensor(t) is True
    assert a.free_cpu_locked_tensor(t) is False  # freed once, through whichever handle
    u = p.new_cpu_locked_tensor(10, torch.empty(0, dtype=torch.bfloat16))
    assert a.is_pinned(u) and u.dtype == torch.bfloat16
    assert pin_handle().free_cpu_locked_tensor_by_ptr(u.data_ptr()) is True
    assert pin_handle().free_cpu_locked_tensor_by_ptr(u.data_ptr()) is False
    assert not a.is_pinned(torch.empty(100))
    assert not p.is_pinned(torch.empty(100))


def test_freed_locked_tensors_return_their_memory():
    p = pin_handle()
    p.free_cpu_locked_tensor(p.new_cpu_locked_tensor(1, torch.empty(0)))  # the pool exists
    before = zinf._native.pinned_in_use()
    t = p.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.float32))  # 4 MiB
    assert zinf._native.pinned_in_use() >= before + (4 << 20)
    assert p.free_cpu_locked_tensor(t)
    assert zinf._native.pinned_in_use() >= before + (4 << 20)  # the caller still holds it
    del t
    assert zinf._native.pinned_in_use() == before


def test_module_level_read_write_and_memcpy(tmp_path, cwd):
    op = AsyncIOBuilder().load()
    path = str(tmp_path / "m.bin")
    data = payload(20 * KB)
    assert op.aio_write(data, path, 1024, 2, False, False, True) == 0
    out = torch.zeros_like(data)
    assert aio_read(out, path, 1024, 2, False, False, True) == 0
    assert torch.equal(out, data)
    dst = torch.zeros(5, dtype=torch.float32)
    src = torch.arange(5, dtype=torch.float32)
    assert deepspeed_memcpy(dst, src) == 0
    assert torch.equal(dst, src)
    with pytest.raises(ValueError):
        deepspeed_memcpy(torch.zeros(4), torch.zeros(5))


def test_io_error_has_no_offset_where_there_is_none(tmp_path, cwd):
    h = aio_handle()
    with pytest.raises(zinf.IoError) as info:
        h.sync_pread(torch.zeros(16, dtype=torch.uint8), str(tmp_path / "missing"))
    assert info.value.offset is None and info.value.length is None
    short = tmp_path / "short"
    short.write_bytes(b"x" * 10)
    with pytest.raises(zinf.IoError) as info:
        h.sync_pread(torch.zeros(16, dtype=torch.uint8), str(short))
    assert "[Errno 0]" not in str(info.value)
    assert info.value.errno is None and info.value.filename == str(short)


def test_an_append_descriptor_is_refused_for_writes_and_an_extending_write_sizes_the_file(
        tmp_path, cwd):
    # pwrite on an O_APPEND descriptor writes at the end of the file whatever the offset: a
    # write asked for offset 0 landed at the end and reported success. Every write form through
    # such a descriptor is refused naming it and the offset, the file unchanged; reads work.
    # A path write that extends a file gets its blocks first and leaves the file exactly
    # offset + length long.
    h = aio_handle()
    path = tmp_path / "app.bin"
    path.write_bytes(b"\x11" * 8192)
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        data = payload(4096)
        for method in WRITES:
            with pytest.raises(ValueError, match=rf"descriptor {fd} has O_APPEND, which writes at "
                                                 r"the end of the file, not at file_offset=0"):
                call(h, method, data, fd, 0, False)
        assert h.wait() == 0
        out = torch.zeros(4096, dtype=torch.uint8)
        assert h.sync_pread(out, fd, 4096) == 1
        assert bytes(out.numpy()) == b"\x11" * 4096
    finally:
        os.close(fd)
    assert file_bytes(path) == b"\x11" * 8192
    grown = tmp_path / "grown.bin"
    assert h.sync_pwrite(payload(12288), str(grown), file_offset=1 << 20) == 1
    assert os.path.getsize(grown) == (1 << 20) + 12288
    assert file_bytes(grown)[:1 << 20] == b"\0" * (1 << 20)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible (GPU suite)")
@pytest.mark.parametrize("method", ["sync", "async"])
def test_a_cuda_tensor_round_trips_through_a_pinned_bounce(tmp_path, cwd, method):
    h = aio_handle()
    data = payload(3 << 20).to("cuda")
    path = str(tmp_path / "gpu.bin")
    back = torch.zeros_like(data)
    if method == "sync":
        assert h.sync_pwrite(data, path) == 1
        assert h.sync_pread(back, path) == 1
    else:
        assert h.async_pwrite(data, path) == 0
        assert h.wait() == 1
        assert h.async_pread(back, path) == 0
        assert h.wait() == 1  # the device copy is made once the bytes are in
    assert torch.equal(back.cpu(), data.cpu())
    assert file_bytes(path) == bytes(data.cpu().numpy())


def test_integers_out_of_range_or_not_integers_are_refused_naming_the_argument(tmp_path, cwd):
    # pybind11 refused these with a dump of the native signature, and int() truncated a float
    # offset: every one is now a TypeError or ValueError naming the argument, nothing written.
    path = tmp_path / "i.bin"
    for kwargs, what in [({"block_size": 2 ** 31}, "block_size"),
                         ({"queue_depth": -1}, "queue_depth"),
                         ({"intra_op_parallelism": -1}, "intra_op_parallelism"),
                         ({"num_threads": 2 ** 40}, "intra_op_parallelism")]:
        with pytest.raises(ValueError, match=rf"zinf: {what} must be in \[1, 2147483647\]"):
            aio_handle(**kwargs)
    h = aio_handle()
    data = payload(4096)
    for bad in [1.5, 4096.0, "4096", None]:
        with pytest.raises(TypeError, match="file_offset must be an integer"):
            h.sync_pwrite(data, str(path), file_offset=bad)
    for bad in [-1, 2 ** 63, 2 ** 70]:
        with pytest.raises(ValueError, match=rf"file_offset must be in \[0, {2 ** 63 - 1}\], "
                                             rf"got {bad}"):
            h.async_pwrite(data, str(path), file_offset=bad)
    assert h.wait() == 0
    assert not path.exists()
    assert h.sync_pwrite(data, str(path), file_offset=torch.tensor(4096)) == 1  # an index
    assert os.path.getsize(path) == 8192
    for bad in [-1, 2 ** 62]:
        with pytest.raises(ValueError, match=rf"num_elem must be in \[0, {2 ** 50}\], got {bad}"):
            h.new_cpu_locked_tensor(bad, torch.empty(0))
    with pytest.raises(TypeError, match="num_elem must be an integer"):
        pin_handle().new_cpu_locked_tensor(2.5, torch.empty(0))
