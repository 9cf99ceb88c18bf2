# SPDX-License-Identifier: Apache-2.0
"""A small character-level GPT trained with its parameters and optimizer state on NVMe.

The transformer blocks' parameters live in zinf's swap store (zinf.torch.offload_parameters,
read ahead while the previous block computes) and the Adam state (fp32 masters and both
moments) in zinf's NVMe optimizer tier (zinf.torch.AdamW(state="nvme")). Each step prints the
loss, the step time and the NVMe traffic of the step over its time.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch/train_gpt.py \\
        --dir /nvme/scratch --steps 50

The text is the repository's own documentation (docs/*.md next to this example), or
generated words where that is missing (--text FILE to give one). --params and --state pick
other tiers (memory, cpu) and --optimizer torch uses torch.optim.AdamW, for comparisons;
--json FILE writes the losses and timings.
"""

import argparse
import json
import math
import pathlib
import random
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import zinf.torch as zt


class SelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        mask = torch.tril(torch.ones(context, context, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, context, context), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, context)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, dim, heads, blocks, context):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, context) for _ in range(blocks))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def load_text(path):
    if path:
        return pathlib.Path(path).read_text(encoding="utf-8")
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs"
    files = sorted(docs.glob("*.md")) if docs.is_dir() else []
    if files:
        return "\n".join(f.read_text(encoding="utf-8") for f in files)
    words = ("the swap store reads each layer ahead of the compute while the optimizer "
             "writes its state back to the drive").split()
    rnd = random.Random(0)
    return " ".join(rnd.choice(words) for _ in range(200_000))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", help="directory on the NVMe drive for the swap files "
                   "(default: a temporary directory)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model computes")
    p.add_argument("--params", choices=["nvme", "cpu", "memory"], default="nvme",
                   help="where the blocks' parameters live between uses")
    p.add_argument("--state", choices=["nvme", "cpu"], default="nvme",
                   help="zinf AdamW's state tier")
    p.add_argument("--optimizer", choices=["zinf", "torch"], default="zinf")
    p.add_argument("--prefetch-depth", type=int, default=2)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", help="a UTF-8 text file to train on")
    p.add_argument("--json", help="write {'losses': [...], ...} to this file")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    args = p.parse_args(argv)
    if args.device == "cuda" and args.optimizer == "zinf":
        p.error("--device cuda needs --optimizer torch: zinf's AdamW takes CPU parameters "
                "(the device-gradient path is not in the Python package yet)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    return args


def train(args):
    text = load_text(args.text)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = GPT(len(chars), args.dim, args.heads, args.blocks, args.context).to(device)
    n_params = sum(p.numel() for p in model.parameters())

    work = tempfile.TemporaryDirectory(dir=args.dir, prefix="train_gpt-")
    root = pathlib.Path(work.name)
    (root / "params").mkdir()
    (root / "state").mkdir()

    off = None
    if args.params != "memory":
        off = zt.offload_parameters(model, unit=Block, nvme_path=root / "params",
                                    device=args.params, prefetch_depth=args.prefetch_depth)
    if args.optimizer == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    else:
        def build():
            return zt.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            state=args.state, nvme_path=root / "state")

        if off is not None and args.state == "nvme":
            with off.materialized():  # its masters come from the parameters
                opt = build()
        else:
            opt = build()

    print(f"train_gpt: {n_params / 1e6:.2f}M parameters, {args.blocks} blocks, vocab "
          f"{len(chars)}, params={args.params}, optimizer={args.optimizer}"
          f"{'/' + args.state if args.optimizer == 'zinf' else ''}, device={args.device}, "
          f"dir={root}", flush=True)
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses, times, nvme_bytes = [], [], []
    for step in range(1, args.steps + 1):
        ix = torch.randint(len(data) - args.context - 1, (args.batch,), generator=gen)
        x = torch.stack([data[i:i + args.context] for i in ix]).to(device)
        y = torch.stack([data[i + 1:i + 1 + args.context] for i in ix]).to(device)
        before = off.stats() if off is not None and args.params == "nvme" else None
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        if off is not None:
            off.step(opt)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        moved = 0
        if before is not None:
            after = off.stats()
            moved += (after["bytes_read"] - before["bytes_read"] +
                      after["bytes_written"] - before["bytes_written"])
        stats = getattr(opt, "last_step_stats", None)
        if stats and args.state == "nvme":
            moved += stats["bytes_read"] + stats["bytes_written"]
        losses.append(loss.item())
        times.append(seconds)
        nvme_bytes.append(moved)
        if not args.quiet:
            print(f"step {step:4d}  loss {losses[-1]:.4f}  {seconds * 1e3:7.1f} ms  "
                  f"NVMe {moved / seconds / 1e9:6.3f} GB/s", flush=True)
    summary = {"losses": losses, "step_seconds": times, "nvme_bytes": nvme_bytes,
               "parameters": n_params}
    if off is not None:
        summary["param_stats"] = off.stats()
        rest = times[1:] or times
        print(f"train_gpt: median step {sorted(rest)[len(rest) // 2] * 1e3:.1f} ms, "
              f"parameter fetches {summary['param_stats']['acquires']} "
              f"({summary['param_stats']['hits']} read ahead)", flush=True)
    opt = off = model = None  # the swap files' owners go before their directory
    work.cleanup()
    return summary


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    summary = train(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
