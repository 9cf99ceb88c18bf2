# SPDX-License-Identifier: Apache-2.0
"""Benchmarks of zinf from Python, each a ratio against a reference measured in the same run.

  python3 -m zinf.bench adam [--numel 100M] [--threads 2] [--rounds 5]
                             [--layout torch|aligned|staggered]
      zinf.torch.AdamW against torch.optim.AdamW(foreach=True), alternated, on the same
      parameters (100 tensors): elements per second of each and the median ratio. --layout
      places every parameter and its gradient as torch.empty does (torch), on a 2 MiB
      boundary (aligned, as `zinf bench adam`'s arrays), or on it plus 0 and 3 x 1088 bytes
      (staggered); the moments are each optimizer's own.
  python3 -m zinf.bench step --dir D [--numel 256M] [--rounds 3] [--zinf PATH]
      zinf.torch.AdamW(state="nvme") against `zinf bench step` (the C++ pipeline) at the same
      size on the same directory, alternated: the binding's cost as the ratio of step times.
  python3 -m zinf.bench save --dir D [--size 1Gi] [--tensors 64] [--rounds 3]
      torch.save through zinf.torch.FastFileWriter against torch.save to a plain file on the
      same directory, alternated. Both are made durable and timed to the end of it: the plain
      save is followed by an fsync of its file (without it the page cache makes it look fast
      and nothing is on the drive yet), the FastFileWriter's close() fsyncs. Reports each
      side's seconds and GB/s and the median ratio plain / fast. Where fio is on PATH (--fio
      auto), each round also times fio writing the same bytes to a new file with O_DIRECT and
      a final fsync: the drive's durable rate, the floor of any writer's time, so that
      plain / fio says how much faster than torch.save anything can be on this drive.
  python3 -m zinf.bench activations --dir D [--tier nvme] [--width 512] [--layers 4]
                                    [--tokens 256] [--iters 2] [--rounds 3]
      A training iteration (forward, backward) of a stack of MLP blocks with
      zinf.torch.offload_activations against the same iteration without it, alternated: the
      median ratio of iteration times, and the bytes the store held at the end of forward
      (what left memory until backward) against every byte autograd saved.
  python3 -m zinf.bench aio --dir D [--size 1Gi] [--block-size 1Mi] [--queue-depth 8]
                            [--rounds 3] [--zinf PATH]
      zinf.compat.deepspeed.aio_handle (sync_pwrite then sync_pread of one pinned tensor from
      its new_cpu_locked_tensor) against `zinf bench io` at the same size, block size and queue
      depth on the same directory, alternated. Each side times what its first pass over a new
      file gives: the drop-in writes its new file once untimed (as `zinf bench io` preconditions
      its own), then overwrites and reads it, timed. Reports each side's GB/s and the median
      ratios drop-in / CLI.
  python3 -m zinf.bench deepspeed --dir D [--numel 100M] [--threads 1] [--size 1Gi]
                                  [--block-size 1Mi] [--queue-depth 8] [--rounds 3]
      zinf.compat.deepspeed (DeepSpeedCPUAdam, aio_handle) against DeepSpeed's own ops as its
      builders load them (CPUAdamBuilder, AsyncIOBuilder), alternated, in one process: the
      Adam step time of each over the same parameters (each its own copy, AdamW) and each
      handle's sync_pwrite then sync_pread of one pinned tensor of --size (its own
      new_cpu_locked_tensor; the file written once untimed first). Ratios are DeepSpeed /
      zinf time (above 1: zinf is faster). DeepSpeed is imported here only, so this runs in
      the peers environment (scripts/peers.sh) with DS_ACCELERATOR=cpu where there is no GPU.

Output: one JSON document on stdout.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import zinf.torch as ztorch


def count(text):
    """'100M', '2.5G', '1e8', '1000' -> int (M/G/K decimal here: parameter counts)."""
    t = str(text).strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(float(t) * mult)


_HUGE = 2 << 20  # a 2 MiB page
_STAGGER = 1088  # bytes between the arrays of one tensor under --layout staggered


def placed(values, layout, index):
    """`values` copied into a tensor laid out as `layout` says: "torch" (torch.empty's own
    placement), "aligned" (starting on a 2 MiB boundary, as zinf bench adam's arrays) or
    "staggered" (that boundary plus index x 1088 bytes, so that a parameter and its gradient
    never share their offset mod 4 KiB)."""
    if layout == "torch":
        return values.clone()
    shift = index * _STAGGER if layout == "staggered" else 0
    nbytes = values.numel() * values.element_size()
    raw = torch.empty(nbytes + _HUGE + shift, dtype=torch.uint8)
    at = (-raw.data_ptr()) % _HUGE + shift
    out = raw[at:at + nbytes].view(values.dtype).view(values.shape)  # keeps `raw` alive
    out.copy_(values)
    return out


def make_params(numel, tensors, layout="torch"):
    each = numel // tensors
    torch.manual_seed(0)
    ps = []
    for _ in range(tensors):
        p = torch.nn.Parameter(placed(torch.randn(each), layout, 0))
        p.grad = placed(torch.randn(each) * 1e-3, layout, 3)
        ps.append(p)
    return ps


def time_steps(opt, steps):
    opt.step()  # warm-up: state allocation
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t0) / steps


def bench_adam(a):
    torch.set_num_threads(a.threads)
    numel = count(a.numel)
    ps = make_params(numel, 100, a.layout)
    n = sum(p.numel() for p in ps)
    rows = []
    for r in range(a.rounds):
        z = time_steps(ztorch.AdamW(ps, lr=1e-3, threads=a.threads), a.steps)
        t = time_steps(torch.optim.AdamW(ps, lr=1e-3, foreach=True), a.steps)
        rows.append({"round": r + 1, "zinf_s": z, "torch_s": t, "ratio": t / z})
    ratio = statistics.median(r["ratio"] for r in rows)
    return {"bench": "python-adam", "numel": n, "threads": a.threads, "layout": a.layout,
            "rounds": rows,
            "zinf_elements_per_s": n / statistics.median(r["zinf_s"] for r in rows),
            "torch_elements_per_s": n / statistics.median(r["torch_s"] for r in rows),
            "median_speedup": ratio}


def cli_step(zinf_bin, directory, numel, steps):
    out = subprocess.run([zinf_bin, "bench", "step", "--dir", directory, "--numel", str(numel),
                          "--steps", str(steps), "--json"], capture_output=True, text=True,
                         check=True)
    doc = json.loads(out.stdout)
    return statistics.median(doc["step_seconds_all"])


def python_step(directory, numel, steps):
    ps = make_params(numel, 64)
    opt = ztorch.AdamW(ps, lr=1e-3, state="nvme", nvme_path=directory)
    opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    del opt
    return statistics.median(times)


def bench_step(a):
    numel = count(a.numel)
    zinf_bin = a.zinf or os.environ.get("ZINF_BIN", "zinf")
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for r in range(a.rounds):
            c = cli_step(zinf_bin, d, numel, a.steps)
            p = python_step(d, numel, a.steps)
            rows.append({"round": r + 1, "cli_s": c, "python_s": p, "ratio": p / c})
    return {"bench": "python-step", "numel": numel, "rounds": rows,
            "median_ratio": statistics.median(r["ratio"] for r in rows)}


def size_bytes(text):
    """'1Gi', '512Mi' -> binary multiples; anything else as count() reads it."""
    t = str(text).strip()
    for suffix, mult in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)):
        if t.endswith(suffix):
            return int(float(t[:-2]) * mult)
    return count(t)


def fio_write_seconds(fio, directory, nbytes, block):
    """Seconds fio takes to write nbytes (rounded up to 4 KiB: O_DIRECT's unit) to a new file
    in `directory` (O_DIRECT, io_uring, 4 blocks in flight, fsync at the end): the durable
    rate the writers are held to."""
    path = os.path.join(directory, "fio.dat")
    size = -(-nbytes // 4096) * 4096
    try:
        t0 = time.perf_counter()
        out = subprocess.run([fio, "--name=durable-write", "--filename=" + path, "--rw=write",
                              "--bs=%d" % min(block, size), "--size=%d" % size, "--direct=1",
                              "--ioengine=io_uring", "--iodepth=4", "--end_fsync=1",
                              "--output-format=json"], capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit("zinf.bench save: fio failed writing %s (exit %d): %s"
                             % (path, out.returncode, (out.stderr or out.stdout).strip()[-400:]))
        return elapsed
    finally:
        if os.path.exists(path):
            os.unlink(path)


def bench_save(a):
    size = size_bytes(a.size)
    each = max(size // a.tensors // 4, 1)
    torch.manual_seed(0)
    state = {"t%d" % i: torch.randn(each) for i in range(a.tensors)}
    nbytes = each * 4 * a.tensors
    fio = None
    if a.fio != "off":
        fio = shutil.which("fio")
        if fio is None and a.fio == "on":
            raise SystemExit("zinf.bench save: --fio on, but fio is not on PATH")
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        plain_path = os.path.join(d, "plain.pt")
        fast_path = os.path.join(d, "fast.pt")
        for r in range(a.rounds):
            for p in (plain_path, fast_path):
                if os.path.exists(p):
                    os.unlink(p)
            t0 = time.perf_counter()
            with open(plain_path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            plain = time.perf_counter() - t0
            t0 = time.perf_counter()
            with ztorch.FastFileWriter(fast_path) as f:
                torch.save(state, f)
                direct = f.is_direct
            fast = time.perf_counter() - t0
            row = {"round": r + 1, "plain_fsync_s": plain, "fast_s": fast,
                   "plain_gbps": nbytes / plain / 1e9, "fast_gbps": nbytes / fast / 1e9,
                   "speedup": plain / fast, "direct": direct}
            if fio is not None and direct:
                # (Where the file system refuses O_DIRECT, fio's direct write would fail too.)
                # torch.save's own bytes: the zip archive is the tensors plus a few KiB.
                ref = fio_write_seconds(fio, d, os.path.getsize(fast_path), 8 << 20)
                row.update({"fio_s": ref, "fio_gbps": nbytes / ref / 1e9,
                            "fast_over_fio": fast / ref, "plain_over_fio": plain / ref})
            rows.append(row)
    doc = {"bench": "python-save", "bytes": nbytes, "tensors": a.tensors, "rounds": rows,
           "median_plain_s": statistics.median(r["plain_fsync_s"] for r in rows),
           "median_fast_s": statistics.median(r["fast_s"] for r in rows),
           "median_speedup": statistics.median(r["speedup"] for r in rows)}
    timed = [r for r in rows if "fio_s" in r]
    if timed:
        doc["median_fio_s"] = statistics.median(r["fio_s"] for r in timed)
        doc["median_fast_over_fio"] = statistics.median(r["fast_over_fio"] for r in timed)
        doc["median_plain_over_fio"] = statistics.median(r["plain_over_fio"] for r in timed)
    return doc


class _Block(torch.nn.Module):
    """A transformer block's MLP half: LayerNorm, Linear(w, 4w), GELU, Linear(4w, w), residual."""

    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def bench_activations(a):
    from zinf.activations import ActivationStore, offload_activations

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block(a.width) for _ in range(a.layers)])
    x = torch.randn(a.tokens, a.width)
    saved = [0]

    def count_saved(t):
        saved[0] += t.numel() * t.element_size()
        return t

    def iteration(store):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        held = 0
        if store is None:
            loss = model(x).square().mean()
        else:
            with offload_activations(store, min_bytes=a.min_bytes):
                loss = model(x).square().mean()
            held = store.stats()["held_bytes"]
        loss.backward()
        return time.perf_counter() - t0, held

    with torch.autograd.graph.saved_tensors_hooks(count_saved, lambda t: t):
        model(x).square().mean().backward()  # what autograd saves in one iteration
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        store = ActivationStore(a.tier, nvme_path=d if a.tier == "nvme" else None,
                                pinned_budget_bytes=a.pinned_budget)
        iteration(None)  # warm-up: allocations, the store's files
        iteration(store)
        for r in range(a.rounds):
            plain = statistics.median(iteration(None)[0] for _ in range(a.iters))
            runs = [iteration(store) for _ in range(a.iters)]
            offloaded = statistics.median(t for t, _ in runs)
            rows.append({"round": r + 1, "plain_s": plain, "offload_s": offloaded,
                         "ratio": offloaded / plain, "held_bytes": runs[-1][1]})
        stats = store.stats()
    return {"bench": "python-activations", "tier": a.tier, "width": a.width,
            "layers": a.layers, "tokens": a.tokens, "saved_bytes_per_iteration": saved[0],
            "rounds": rows, "median_ratio": statistics.median(r["ratio"] for r in rows),
            "store": stats}


def cli_io(zinf_bin, directory, size, block, qd):
    out = subprocess.run([zinf_bin, "bench", "io", "--dir", directory, "--size", str(size),
                          "--block-size", str(block), "--queue-depth", str(qd), "--loops", "1",
                          "--json", "--no-verify", "--buffer-bytes", str(size)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"zinf.bench aio: {zinf_bin} bench io failed: {out.stderr.strip()}")
    return {job["op"]: job["gbps"] for job in json.loads(out.stdout)["jobs"]}


def handle_io(h, directory, name, size):
    """Seconds of `h`'s sync_pwrite then sync_pread of one pinned tensor of `size` random bytes
    (its own new_cpu_locked_tensor) to a new file `name`, written once untimed first (as
    `zinf bench io` preconditions its own): the drop-in's and DeepSpeed's handles alike."""
    buf = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    buf.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))  # not zeros: a disk may skip them
    path = os.path.join(directory, name)
    try:
        h.sync_pwrite(buf, path)
        t = time.perf_counter()
        h.sync_pwrite(buf, path)
        write = time.perf_counter() - t
        t = time.perf_counter()
        h.sync_pread(buf, path)
        read = time.perf_counter() - t
    finally:
        h.free_cpu_locked_tensor(buf)
        os.remove(path)
    return write, read


def dropin_io(directory, size, block, qd):
    from zinf.compat.deepspeed import aio_handle
    write, read = handle_io(aio_handle(block, qd), directory, "dropin.bin", size)
    return {"write": size / write / 1e9, "read": size / read / 1e9}


def bench_aio(a):
    size, block = size_bytes(a.size), size_bytes(a.block_size)
    zinf_bin = a.zinf or os.environ.get("ZINF_BIN", "zinf")
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for r in range(a.rounds):
            first_cli = r % 2 == 1  # alternate which side goes first
            c = cli_io(zinf_bin, d, size, block, a.queue_depth) if first_cli else None
            p = dropin_io(d, size, block, a.queue_depth)
            if c is None:
                c = cli_io(zinf_bin, d, size, block, a.queue_depth)
            rows.append({"round": r + 1, "cli_write_gbps": c["write"], "cli_read_gbps": c["read"],
                         "dropin_write_gbps": p["write"], "dropin_read_gbps": p["read"],
                         "write_ratio": p["write"] / c["write"], "read_ratio": p["read"] / c["read"]})
    return {"bench": "python-aio", "size": size, "block_size": block,
            "queue_depth": a.queue_depth, "rounds": rows,
            "median_write_ratio": statistics.median(r["write_ratio"] for r in rows),
            "median_read_ratio": statistics.median(r["read_ratio"] for r in rows)}


def bench_deepspeed(a):
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam as DsAdam
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except ImportError as e:
        sys.exit(f"zinf.bench deepspeed: DeepSpeed is not importable here ({e}): run it in the "
                 "peers environment (scripts/peers.sh)")
    try:
        # DeepSpeed's logger writes to stdout, which holds this benchmark's JSON.
        from deepspeed.utils import logger as ds_logger
        for h in ds_logger.handlers:
            if hasattr(h, "setStream"):
                h.setStream(sys.stderr)
    except ImportError:
        pass
    from zinf.compat.deepspeed import DeepSpeedCPUAdam as ZAdam
    from zinf.compat.deepspeed import aio_handle as ZHandle
    torch.set_num_threads(a.threads)
    numel = count(a.numel)
    base = make_params(numel, 16)

    def copies():
        ps = [torch.nn.Parameter(p.detach().clone()) for p in base]
        for p, q in zip(ps, base):
            p.grad = q.grad.clone()
        return ps

    size, block = size_bytes(a.size), size_bytes(a.block_size)
    ds_aio = AsyncIOBuilder().load()

    # DeepSpeed's aio_handle(block_size, queue_depth, single_submit, overlap_events,
    # intra_op_parallelism), and the drop-in with the same arguments.
    args = (block, a.queue_depth, False, True, 1)
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for r in range(a.rounds):
            sides = [("zinf", ZAdam, lambda: ZHandle(*args)),
                     ("deepspeed", DsAdam, lambda: ds_aio.aio_handle(*args))]
            if r % 2:
                sides.reverse()
            row = {"round": r + 1}
            for name, adam, handle in sides:
                row[f"{name}_adam_s"] = time_steps(adam(copies(), lr=1e-3, weight_decay=0.01,
                                                        adamw_mode=True), a.steps)
                row[f"{name}_write_s"], row[f"{name}_read_s"] = handle_io(handle(), d,
                                                                          name + ".bin", size)
            for k in ("adam", "write", "read"):
                row[f"{k}_ratio"] = row[f"deepspeed_{k}_s"] / row[f"zinf_{k}_s"]
            rows.append(row)
    return {"bench": "python-deepspeed", "numel": sum(p.numel() for p in base),
            "threads": a.threads, "size": size, "block_size": block,
            "queue_depth": a.queue_depth, "rounds": rows,
            "median_adam_ratio": statistics.median(r["adam_ratio"] for r in rows),
            "median_write_ratio": statistics.median(r["write_ratio"] for r in rows),
            "median_read_ratio": statistics.median(r["read_ratio"] for r in rows)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m zinf.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    ad = sub.add_parser("adam", help="zinf.torch.AdamW against torch.optim.AdamW(foreach)")
    ad.add_argument("--numel", default="100M")
    ad.add_argument("--threads", type=int, default=2)
    ad.add_argument("--rounds", type=int, default=5)
    ad.add_argument("--steps", type=int, default=3)
    ad.add_argument("--layout", choices=("torch", "aligned", "staggered"), default="torch",
                    help="where the parameters and gradients lie (zinf's moments are its own)")
    st = sub.add_parser("step", help="state='nvme' against `zinf bench step`")
    st.add_argument("--dir", required=True, help="a directory on the drive to measure")
    st.add_argument("--numel", default="256M")
    st.add_argument("--rounds", type=int, default=3)
    st.add_argument("--steps", type=int, default=5)
    st.add_argument("--zinf", help="the zinf binary (default: $ZINF_BIN, else zinf on PATH)")
    sv = sub.add_parser("save", help="torch.save through FastFileWriter against plain+fsync")
    sv.add_argument("--dir", required=True, help="a directory on the drive to measure")
    sv.add_argument("--size", default="1Gi", help="bytes of tensors (Gi/Mi/Ki binary, G/M/K decimal)")
    sv.add_argument("--tensors", type=int, default=64)
    sv.add_argument("--rounds", type=int, default=3)
    sv.add_argument("--fio", choices=("auto", "on", "off"), default="auto",
                    help="time fio's durable write of the same bytes each round (auto: if on PATH)")
    ac = sub.add_parser("activations", help="an iteration with offload_activations against without")
    ac.add_argument("--dir", required=True, help="a directory on the drive to measure")
    ac.add_argument("--tier", choices=("nvme", "cpu"), default="nvme")
    ac.add_argument("--width", type=int, default=512)
    ac.add_argument("--layers", type=int, default=4)
    ac.add_argument("--tokens", type=int, default=256)
    ac.add_argument("--iters", type=int, default=2, help="iterations per side and round")
    ac.add_argument("--rounds", type=int, default=3)
    ac.add_argument("--min-bytes", type=int, default=1 << 20, dest="min_bytes")
    ac.add_argument("--pinned-budget", type=int, default=256 << 20, dest="pinned_budget")
    ai = sub.add_parser("aio", help="the DeepSpeed drop-in's aio_handle against `zinf bench io`")
    ai.add_argument("--dir", required=True, help="a directory on the drive to measure")
    ai.add_argument("--size", default="1Gi")
    ai.add_argument("--block-size", default="1Mi", dest="block_size")
    ai.add_argument("--queue-depth", type=int, default=8, dest="queue_depth")
    ai.add_argument("--rounds", type=int, default=3)
    ai.add_argument("--zinf", help="the zinf binary (default: $ZINF_BIN, else zinf on PATH)")
    ds = sub.add_parser("deepspeed", help="the DeepSpeed drop-in against DeepSpeed's own ops")
    ds.add_argument("--dir", required=True, help="a directory on the drive to measure")
    ds.add_argument("--numel", default="100M")
    ds.add_argument("--threads", type=int, default=1)
    ds.add_argument("--steps", type=int, default=3)
    ds.add_argument("--size", default="1Gi")
    ds.add_argument("--block-size", default="1Mi", dest="block_size")
    ds.add_argument("--queue-depth", type=int, default=8, dest="queue_depth")
    ds.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    doc = {"adam": bench_adam, "step": bench_step, "save": bench_save,
           "activations": bench_activations, "aio": bench_aio,
           "deepspeed": bench_deepspeed}[a.what](a)
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
