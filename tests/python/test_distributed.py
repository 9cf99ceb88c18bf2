# SPDX-License-Identifier: Apache-2.0
# zinf.distributed over torch.distributed's gloo on CPU processes (spawned, FileStore in a
# temp dir): ShardedAdam/ShardedAdamW on 2 and 3 ranks give every rank parameters bitwise
# equal to one process's zinf.torch.Adam/AdamW fed the average gradient (gradients chosen so
# that the average is exact in fp32), for the cpu and nvme tiers; a checkpoint saved by every
# rank loads into a fresh optimizer and steps on bitwise; ZeRO stage 2 (the default,
# reduce-scattered gradients) and 1 (all-reduced) alike, each step's collective byte counts
# those of its stage, stages 0 and 3 refused; an inf on one rank skips the step on all; the
# adapter's emulated
# reduce-scatter and averaging all-reduce; a rank whose collective raises gets a clear error,
# and no rank hangs (the process group's timeout and the harness's).
import datetime
import gc
import multiprocessing
import os
import queue
import traceback

import pytest
import torch

from zinf.torch import Adam, AdamW

STEPS = 3
HARNESS_TIMEOUT = 240  # seconds for a whole group, startup (importing torch twice) included


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))


def groups_of(model):
    # Two groups with their own settings: per-group hyper-parameters reach every rank's slices.
    return [{"params": model[0].parameters(), "weight_decay": 0.0},
            {"params": model[2].parameters(), "lr": 3e-3}]


def base_gradient(step, index, shape):
    # Multiples of 2^-6 in [-1, 1): sums of a few of them, and their average over 2 or 3 ranks
    # below, are exact in fp32 whatever order gloo adds them in.
    g = torch.Generator().manual_seed(1000 * step + index)
    return torch.randint(-64, 64, shape, generator=g).to(torch.float32) / 64


def rank_gradient(step, index, shape, rank, world, different):
    base = base_gradient(step, index, shape)
    if not different:
        return base
    # Offsets c_r * d with the c_r summing to 0 (2 ranks: -1, 1; 3 ranks: -2, 0, 2): the ranks'
    # gradients differ, their average is `base`, exactly.
    g = torch.Generator().manual_seed(7919 * step + index)
    d = torch.randint(-64, 64, shape, generator=g).to(torch.float32) / 128
    return base + (2 * rank - (world - 1)) * d


CASES = [(cls, state, different, 2) for cls in ("ShardedAdam", "ShardedAdamW")
         for state in ("cpu", "nvme") for different in (False, True)]
# Stage 1 all-reduces the gradients instead: the same weights, bitwise.
CASES += [("ShardedAdamW", "cpu", True, 1), ("ShardedAdam", "nvme", True, 1)]


def collective_bytes(model, world, stage):
    # A ring's bytes into each rank (StepStats): (N - 1) / N of each parameter's padded fp32
    # buffer, for the gradients' reduce-scatter (stage 2) or twice for their all-reduce
    # (stage 1), and for the parameters' all-gather.
    ring = sum(-(-p.numel() // world) * world * 4 // world * (world - 1)
               for p in model.parameters())
    return {"allgather_bytes": ring, "reduce_scatter_bytes": ring if stage == 2 else 0,
            "all_reduce_bytes": 2 * ring if stage == 1 else 0}


def train(model, opt, grad_of):
    for step in range(1, STEPS + 1):
        for i, p in enumerate(model.parameters()):
            p.grad = grad_of(step, i, p.shape)
        opt.step()
        if step == 1:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * 0.5  # a schedule: the next steps use it


def extra_step(model, opt, rank, world):
    for i, p in enumerate(model.parameters()):
        p.grad = rank_gradient(STEPS + 1, i, p.shape, rank, world, True)
    opt.step()


def check_load(rank, world, ckpt, saved, stepped, lrs, cls):
    # A fresh optimizer over other weights loads what every rank saved: the parameters become
    # the saved masters (all-gathered), and the next step is bitwise the original's.
    other = make_model(seed=99)
    loaded = cls(groups_of(other), lr=1e-2, weight_decay=0.05)
    loaded.load(ckpt)
    for p, q in zip(other.parameters(), saved):
        assert torch.equal(p, q)
    for g, lr in zip(loaded.param_groups, lrs):
        g["lr"] = lr  # the schedule's value: the step takes the groups' settings
    extra_step(other, loaded, rank, world)
    for p, q in zip(other.parameters(), stepped):
        assert torch.equal(p, q)


def run_parity(rank, world, tmp):
    import zinf.distributed as zd
    results = {}
    for n, (cls, state, different, stage) in enumerate(CASES):
        model = make_model(seed=rank)  # other weights on each rank: rank 0's are broadcast
        tier = {"state": state}
        if state == "nvme":
            # One path for every rank (it must exist): the rank<R> subfolders separate them.
            os.makedirs(os.path.join(tmp, f"nvme{n}"), exist_ok=True)
            tier.update(nvme_path=os.path.join(tmp, f"nvme{n}"), sub_group_size=32768)
        opt = getattr(zd, cls)(groups_of(model), lr=1e-2, weight_decay=0.05, stage=stage,
                               **tier)
        assert opt.stage == stage
        train(model, opt,
              lambda s, i, shape: rank_gradient(s, i, shape, rank, world, different))
        assert opt.last_step_stats["step"] == STEPS
        assert not opt.last_step_skipped
        moved = {k: opt.last_step_stats[k] for k in
                 ("allgather_bytes", "reduce_scatter_bytes", "all_reduce_bytes")}
        assert moved == collective_bytes(model, world, stage), (cls, state, stage, moved)
        results[n] = [p.detach().clone().numpy().tobytes() for p in model.parameters()]
        if state == "nvme":
            assert os.path.isdir(os.path.join(tmp, f"nvme{n}", f"rank{rank}"))
        if n == 0:
            ckpt = os.path.join(tmp, "ckpt")
            opt.save(ckpt)
            assert os.path.isfile(os.path.join(ckpt, "zinf-sharded"))
            saved = [p.detach().clone() for p in model.parameters()]
            extra_step(model, opt, rank, world)
            stepped = [p.detach().clone() for p in model.parameters()]
            lrs, cls_ = [g["lr"] for g in opt.param_groups], type(opt)
            del opt  # one owner per checkpoint directory: its lock goes with the optimizer
            gc.collect()
            check_load(rank, world, ckpt, saved, stepped, lrs, cls_)
    # An inf in one rank's gradients skips the step on every rank, with nothing changed; the
    # loss scale and clipping reach the sharded step (its global norm is reported).
    model = make_model(seed=0)
    opt = zd.ShardedAdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    for i, p in enumerate(model.parameters()):
        p.grad = base_gradient(1, i, p.shape) * 4
        if rank == world - 1 and i == 1:
            p.grad[0] = float("inf")
    opt.step(loss_scale=4.0)
    assert opt.last_step_skipped and opt.last_step_stats["skipped"]
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for i, p in enumerate(model.parameters()):
        p.grad = base_gradient(1, i, p.shape) * 4
    opt.step(loss_scale=4.0, clip=0.5)
    stats = opt.last_step_stats
    assert not opt.last_step_skipped and stats["step"] == 1
    assert stats["global_grad_norm"] > 0.5 and stats["grad_scale_applied"] < 0.25
    assert not any(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    # The adapter itself: gloo has no reduce-scatter and no average in torch 1.13; zinf
    # emulates the first and divides the sum for the second.
    c = zd.collectives()
    assert (c.rank, c.size, c.name) == (rank, world, "gloo")
    send = torch.arange(4 * world, dtype=torch.float32) * (rank + 1)
    recv = torch.empty(4, dtype=torch.float32)
    c.reduce_scatter(send.data_ptr(), send.numel() * 4, recv.data_ptr(), 16, "fp32", "avg")
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.equal(recv, torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32) * mean)
    flag = torch.tensor([rank], dtype=torch.uint8)
    c.all_reduce(flag.data_ptr(), 1, "u8", "max")
    assert int(flag) == world - 1
    gathered = torch.empty(world, dtype=torch.int64)
    mine = torch.tensor([10 * rank], dtype=torch.int64)
    c.all_gather(mine.data_ptr(), 8, gathered.data_ptr(), 8 * world)
    assert gathered.tolist() == [10 * r for r in range(world)]
    return results


def run_reshard_save(rank, world, tmp):
    # Three steps on `world` ranks, then every rank saves into <tmp>/../ckpt.
    import zinf.distributed as zd
    model = make_model(seed=rank)
    opt = zd.ShardedAdamW(groups_of(model), lr=1e-2, weight_decay=0.05, state="nvme",
                          nvme_path=tmp, sub_group_size=32768)
    train(model, opt, lambda s, i, shape: rank_gradient(s, i, shape, rank, world, True))
    opt.save(os.path.join(os.path.dirname(tmp), "ckpt"))
    return {"params": [p.detach().clone().numpy().tobytes() for p in model.parameters()],
            "lrs": [g["lr"] for g in opt.param_groups]}


def run_reshard_load(rank, world, tmp):
    # Another world size loads that checkpoint and takes the next step.
    import zinf.distributed as zd
    model = make_model(seed=99)
    opt = zd.ShardedAdamW(groups_of(model), lr=1e-2, weight_decay=0.05, state="nvme",
                          nvme_path=tmp, sub_group_size=32768)
    opt.load(os.path.join(os.path.dirname(tmp), "ckpt"))
    loaded = [p.detach().clone().numpy().tobytes() for p in model.parameters()]
    for g in opt.param_groups:
        g["lr"] = g["lr"] * 0.5  # the schedule's value after step 1, as train() set it
    extra_step(model, opt, rank, world)
    return {"loaded": loaded,
            "params": [p.detach().clone().numpy().tobytes() for p in model.parameters()]}


def run_failure(rank, world, tmp):
    import zinf
    import zinf.distributed as zd
    if rank == 1:
        def broken(self, data, dtype, op):
            raise RuntimeError("injected failure on rank 1")
        zd._TorchGroup.all_reduce = broken
    model = make_model(seed=0)
    opt = zd.ShardedAdam(model.parameters(), lr=1e-2)  # broadcasts only: works on both
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    out = {}
    try:
        opt.step()  # the reduce-scatter is emulated with all_reduce: rank 1's raises
        out["first"] = None
    except OSError as e:
        assert isinstance(e, zinf.IoError)
        out["first"] = str(e)
    if rank == 1:
        # The group is failed: a later step raises at once, without entering a collective.
        try:
            opt.step()
            out["second"] = None
        except OSError as e:
            out["second"] = str(e)
    return out


# Ranks that build the optimizer differently, the last rank the odd one: (what the odd rank
# changes, the difference every rank's error names). Once: other sizes aborted inside gloo,
# one more parameter waited for the group's timeout, and the rest trained on silently.
DISAGREEMENTS = [
    ("bigger", "parameter 0 has shape [14, 7], rank 0's [13, 7]"),
    ("one_more", "parameter count is 5, rank 0's 4"),
    ("reshaped", "parameter 0 has shape [4, 8], rank 0's [32]"),
    ("lr", "param group 0 has lr 0.02, rank 0's 0.01"),
    ("stage", "stage is 1, rank 0's 2"),
    ("betas", "param group 0 has betas (0.8, 0.999), rank 0's (0.9, 0.999)"),
    ("adamw", "optimizer is Adam, rank 0's AdamW"),
    # Refused by the odd rank itself: it raises its own error, the others name it.
    ("float64", "arguments were refused (ValueError: zinf: parameters must be float32, got "
                "torch.float64), rank 0's were accepted"),
    ("no_nvme_dir", "arguments were refused (IoError: [Errno 2] open directory failed: "),
]


def run_disagree(rank, world, tmp):
    import zinf.distributed as zd
    odd = rank == world - 1
    out = {}
    for case, _ in DISAGREEMENTS:
        torch.manual_seed(rank)
        params = list(make_model(seed=rank).parameters())
        kwargs = {"lr": 1e-2, "stage": 2}
        cls = zd.ShardedAdamW
        if odd and case == "bigger":
            params[0] = torch.nn.Parameter(torch.zeros(14, 7))
        elif odd and case == "one_more":
            params.append(torch.nn.Parameter(torch.zeros(3)))
        elif case == "reshaped":
            params = [torch.nn.Parameter(torch.ones(4, 8) if odd else torch.ones(32))]
        elif odd and case == "lr":
            kwargs["lr"] = 2e-2
        elif odd and case == "stage":
            kwargs["stage"] = 1
        elif odd and case == "betas":
            kwargs["betas"] = (0.8, 0.999)
        elif odd and case == "adamw":
            cls = zd.ShardedAdam
        elif odd and case == "float64":
            params[0] = torch.nn.Parameter(torch.zeros(13, 7, dtype=torch.float64))
        elif case == "no_nvme_dir":
            # The setup fails on the odd rank's node only (no such directory there).
            kwargs.update(state="nvme", sub_group_size=32768,
                          nvme_path=os.path.join(tmp, "missing" if odd else ""))
        before = [p.detach().clone() for p in params]
        try:
            cls(params, **kwargs)
            out[case] = None
        except (ValueError, OSError) as e:
            out[case] = str(e)
        # Refused before the parameters' broadcast: nothing changed, no rank folder left.
        assert all(torch.equal(p, b) for p, b in zip(params, before)), case
        assert not os.path.exists(os.path.join(tmp, f"rank{rank}")), case
    # The group is still usable: ranks that agree build and step.
    model = make_model(seed=rank)
    opt = zd.ShardedAdamW(model.parameters(), lr=1e-2)
    for i, p in enumerate(model.parameters()):
        p.grad = base_gradient(1, i, p.shape)
    opt.step()
    out["step"] = opt.last_step_stats["step"]
    return out


def worker(rank, world, tmp, scenario, timeout_s, results):
    try:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"),
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = {"parity": run_parity, "failure": run_failure, "reshard_save": run_reshard_save,
               "reshard_load": run_reshard_load, "disagree": run_disagree}[scenario](
                   rank, world, tmp)
        results.put((rank, "ok", out))
        if scenario != "failure":
            dist.destroy_process_group()
    except BaseException:  # noqa: B902 (the parent must hear about anything)
        results.put((rank, "error", traceback.format_exc()))
    results.close()
    results.join_thread()  # put() only queued it: os._exit would drop what is not yet sent
    # A failed rank ends its process, as the Collectives contract asks; its peers' gloo calls
    # then fail (peer closed, or the timeout).
    os._exit(0)


def launch(world, tmp, scenario, timeout_s=60):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, str(tmp), scenario, timeout_s, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < world:
            rank, status, payload = results.get(timeout=HARNESS_TIMEOUT)
            assert status == "ok", f"rank {rank} failed:\n{payload}"
            got[rank] = payload
    except queue.Empty:
        pytest.fail(f"{scenario} on {world} ranks: no answer from ranks "
                    f"{sorted(set(range(world)) - set(got))} within {HARNESS_TIMEOUT} s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return got


def reference(cls):
    # One process, zinf.torch's optimizer on the average gradient (exactly `base`).
    model = make_model(seed=0)
    opt = {"ShardedAdam": Adam, "ShardedAdamW": AdamW}[cls](groups_of(model), lr=1e-2,
                                                           weight_decay=0.05)
    train(model, opt, lambda s, i, shape: base_gradient(s, i, shape))
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_adam_is_bitwise_one_process_on_the_average(tmp_path, world):
    got = launch(world, tmp_path, "parity")
    for n, (cls, state, different, stage) in enumerate(CASES):
        want = reference(cls)
        for rank in range(world):
            params = [torch.frombuffer(bytearray(b), dtype=torch.float32).view(w.shape)
                      for b, w in zip(got[rank][n], want)]
            for i, (p, w) in enumerate(zip(params, want)):
                assert torch.equal(p, w), (f"{cls} state={state} different={different} "
                                           f"stage={stage}: rank {rank} parameter {i} differs "
                                           "from one process")
        # And the step did move the weights from the seed-0 model's.
        assert not torch.equal(want[0], make_model(seed=0)[0].weight.detach())


@pytest.mark.parametrize("saved,loaded", [(3, 2), (2, 3)])
def test_a_checkpoint_of_one_world_size_loads_into_another(tmp_path, saved, loaded):
    # Resharding: the ranks of the new world read the saved ranks' slices and redistribute
    # them; the parameters after the load are the saved ones and the next step is one
    # process's, bitwise.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = launch(saved, tmp_path / "a", "reshard_save")
    after = launch(loaded, tmp_path / "b", "reshard_load")
    model = make_model(seed=0)
    opt = AdamW(groups_of(model), lr=1e-2, weight_decay=0.05)
    train(model, opt, lambda s, i, shape: base_gradient(s, i, shape))
    trained = [p.detach().clone().numpy().tobytes() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    extra_step(model, opt, 0, 1)  # world 1: the offsets vanish, the gradient is the average
    stepped = [p.detach().clone().numpy().tobytes() for p in model.parameters()]
    for rank in range(saved):
        assert before[rank]["params"] == trained, f"saving rank {rank}"
    for rank in range(loaded):
        assert after[rank]["loaded"] == trained, f"loading rank {rank}: parameters after load"
        assert after[rank]["params"] == stepped, f"loading rank {rank}: the step after load"


def test_a_failing_collective_raises_on_every_rank_and_nobody_hangs(tmp_path):
    got = launch(2, tmp_path, "failure", timeout_s=10)
    first = got[1]["first"]
    assert first is not None, "rank 1's step should have failed"
    assert "reduce_scatter" in first and "rank 1 of 2" in first, first
    assert "RuntimeError: injected failure on rank 1" in first, first
    assert got[1]["second"] is not None, "a failed group must refuse the next step"
    # Rank 0 waited in gloo's all_reduce until rank 1 went away or the 10 s timeout: a
    # CollectiveError on its own rank, not a hang.
    assert got[0]["first"] is not None and "rank 0 of 2" in got[0]["first"], got[0]["first"]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_that_build_different_optimizers_are_refused_on_every_rank(tmp_path, world):
    # Every rank raises the same ValueError naming the odd rank and its first difference from
    # rank 0, at construction, well within the group's timeout; nothing is changed and the
    # group stays usable.
    got = launch(world, tmp_path, "disagree", timeout_s=60)
    for case, difference in DISAGREEMENTS:
        want = (f"zinf: the ranks built different sharded optimizers: rank {world - 1}'s "
                f"{difference} (every rank builds it over the same parameters and settings)")
        for rank in range(world - 1):
            if case == "no_nvme_dir":
                # The odd rank's own error, whole, in the middle.
                head, tail = want.split(" (every rank")
                tail = "/missing'), rank 0's were accepted (every rank" + tail
                assert got[rank][case].startswith(head), (case, rank, got[rank][case])
                assert got[rank][case].endswith(tail), (case, rank, got[rank][case])
            else:
                assert got[rank][case] == want, (case, rank)
        odd = got[world - 1][case]
        if case == "float64":
            assert odd == "zinf: parameters must be float32, got torch.float64"
        elif case == "no_nvme_dir":
            assert "missing" in odd and "the ranks" not in odd, odd
        else:
            assert odd == want, case
    assert all(got[rank]["step"] == 1 for rank in range(world))


@pytest.mark.parametrize("stage,why", [
    (0, "zinf: stage=0 keeps the whole optimizer state on every rank (plain data parallelism), "
        "which the sharded optimizer does not offer; give stage 1 or 2"),
    (3, "zinf: stage=3 partitions the parameters too, but torch holds the model's parameters "
        "whole on every rank; the sharded optimizer runs stage 1 or 2"),
    (4, "zinf: stage must be 1 or 2, got 4"),
    (True, "zinf: stage must be 1 or 2, got True")])
def test_a_stage_the_sharded_optimizer_does_not_run_is_refused(stage, why):
    # Refused before anything else (torch.distributed is not even initialised here).
    import zinf.distributed as zd
    with pytest.raises(ValueError) as e:
        zd.ShardedAdamW(make_model(seed=0).parameters(), stage=stage)
    assert str(e.value) == why


def test_integers_out_of_range_are_refused_naming_the_argument_before_any_collective():
    # As zinf.torch's optimizers: a ValueError naming the argument, not pybind11's dump of the
    # native signature; no process group is needed to be refused.
    import zinf.distributed as zd
    model = make_model(0)
    with pytest.raises(ValueError, match="zinf: threads must be >= 0, got -1"):
        zd.ShardedAdam(model.parameters(), threads=-1)
    with pytest.raises(ValueError, match=r"pipeline_depth must be in \[1, 4294967295\]"):
        zd.ShardedAdam(model.parameters(), pipeline_depth=2 ** 40)
    with pytest.raises(TypeError, match="pinned_budget must be an integer"):
        zd.ShardedAdam(model.parameters(), pinned_budget=1.5)
