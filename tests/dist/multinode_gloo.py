# SPDX-License-Identifier: Apache-2.0
# One rank of zinf.distributed over torch.distributed's gloo, with TCP across simulated nodes:
# tests/dist/multinode_test.sh starts it under scripts/multinode.sh (mpirun only launches it,
# one process per node, and gives it ZT_NODE_ADDRS; the group meets at node 0's address).
# ShardedAdamW with its state on the node's own drive trains 3 steps on gradients that differ
# between the ranks; every rank's parameters must be bitwise those of one zinf.torch.AdamW fed
# the average gradient (exact in fp32: dyadic values plus offsets that sum to 0, as in
# tests/python/test_distributed.py), the rank's state folder the only one on its drive, and the
# ranks on different hosts. Prints one line per rank; raises (exit 1) on any difference.
# Usage: multinode_gloo.py DRIVE
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist

import zinf.distributed as zd
from zinf.torch import AdamW

STEPS = 3


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))


def base_gradient(step, index, shape):
    g = torch.Generator().manual_seed(1000 * step + index)
    return torch.randint(-64, 64, shape, generator=g).to(torch.float32) / 64


def rank_gradient(step, index, shape, rank, world):
    # Offsets c_r * d with the c_r summing to 0: the ranks differ, their average is the base.
    g = torch.Generator().manual_seed(7919 * step + index)
    d = torch.randint(-64, 64, shape, generator=g).to(torch.float32) / 128
    return base_gradient(step, index, shape) + (2 * rank - (world - 1)) * d


def train(model, opt, grad_of):
    for step in range(1, STEPS + 1):
        for i, p in enumerate(model.parameters()):
            p.grad = grad_of(step, i, p.shape)
        opt.step()


def main():
    drive = sys.argv[1]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    master = os.environ["ZT_NODE_ADDRS"].split(",")[0]
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29500", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    assert len(set(hosts)) == world, f"the ranks are not on {world} hosts: {hosts}"

    model = make_model(seed=rank)  # other weights on each rank: rank 0's are broadcast
    opt = zd.ShardedAdamW(model.parameters(), lr=1e-2, weight_decay=0.05, state="nvme",
                          nvme_path=drive, sub_group_size=32768)
    train(model, opt, lambda s, i, shape: rank_gradient(s, i, shape, rank, world))
    folders = sorted(f for f in os.listdir(drive) if f.startswith("rank"))
    assert folders == [f"rank{rank}"], f"rank {rank}'s drive holds {folders}"

    reference = make_model(seed=0)
    train(reference, AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05), base_gradient)
    for i, (p, w) in enumerate(zip(model.parameters(), reference.parameters())):
        assert torch.equal(p, w), f"rank {rank}: parameter {i} differs from one process's"
    print(f"gloo rank {rank} of {world} on {hosts[rank]}: {STEPS} steps bitwise one AdamW "
          f"on the average; state in {drive}/rank{rank} only", flush=True)
    del opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
