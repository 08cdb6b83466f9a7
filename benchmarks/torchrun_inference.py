"""Data-parallel inference with fullfuse under torchrun: every rank fuses the same seed models (same weights: a
fixed seed), runs its shard of one fixed batch on its own GPU, and rank 0 gathers the shards and compares them with a
single-process run of the whole batch on cuda:0.

    torchrun --nproc-per-node 2 benchmarks/torchrun_inference.py             # rank 0 computes the reference itself
    torchrun --nproc-per-node 2 benchmarks/torchrun_inference.py --reference # the same, said explicitly
    python3 benchmarks/torchrun_inference.py                                 # one process: the whole batch, one shard

All ranks share one kernel cache: FULLFUSE_CACHE_DIR as torchrun passes it to every rank (or fullfuse's default,
~/.cache/fullfuse); each library is compiled once under a file lock, so concurrent ranks do not race.  Prints, per
seed model, the max abs difference between the gathered output and the reference, and EQUAL (bitwise) or DIFFERENT.
The kernels are deterministic by default, so the same images give the same bits on every GPU of one kind.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fullfuse  # noqa: E402
from fullfuse.seed_models import SeedA, SeedB  # noqa: E402

BATCH = {"A": (16, 8, 128, 128), "B": (4, 32, 16, 16, 16)}   # fixed batches, split across ranks along dim 0


def build(family: str, device: torch.device, path: str = "auto") -> torch.nn.Module:
    """The seed model with weights from a fixed seed (identical on every rank), fused."""
    torch.manual_seed(1234 if family == "A" else 5678)
    model = (SeedA() if family == "A" else SeedB()).eval()
    return fullfuse.fused_model(model.to(device), path=path)


def batch(family: str) -> torch.Tensor:
    """The fixed batch (made on the CPU from a fixed seed: identical on every rank)."""
    return torch.randn(BATCH[family], generator=torch.Generator().manual_seed(42 if family == "A" else 43))


def shard_bounds(n: int, world: int, rank: int):
    return round(rank * n / world), round((rank + 1) * n / world)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", action="store_true",
                        help="rank 0 computes the single-process reference (the default does the same)")
    parser.add_argument("--path", default="auto", choices=["auto", "fused", "fallback", "torch"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torchrun_inference: needs CUDA GPUs")
        return 1

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    distributed = world > 1
    if distributed:
        backend = "nccl" if dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend)
    else:
        backend = "none"

    if rank == 0:
        import cutlass_ops

        print(f"kernel cache shared by the {world} rank(s): {cutlass_ops.cache_dir()}", flush=True)
    status = 0
    for family in ("A", "B"):
        model = build(family, device, args.path)
        x = batch(family)
        n0, n1 = shard_bounds(x.shape[0], world, rank)
        with torch.no_grad():
            mine = model(x[n0:n1].to(device)).contiguous()
        torch.cuda.synchronize(device)
        plan = model.plans[0]
        print(f"rank {rank}/{world} ({backend}) {family}: images [{n0}, {n1}) on {device}, "
              f"{plan.last_path} ({plan.last_reason})", flush=True)

        if distributed:
            # shards may differ in size by one image: gather padded to the largest, then trim
            sizes = [shard_bounds(x.shape[0], world, r) for r in range(world)]
            largest = max(b - a for a, b in sizes)
            padded = torch.zeros((largest, *mine.shape[1:]), dtype=mine.dtype, device=device)
            padded[: mine.shape[0]] = mine
            send = padded if backend == "nccl" else padded.cpu()
            if backend == "nccl":   # all_gather: every NCCL build has it (rank 0 keeps the result)
                gathered = [torch.empty_like(send) for _ in range(world)]
                dist.all_gather(gathered, send)
            else:
                gathered = [torch.empty_like(send) for _ in range(world)] if rank == 0 else None
                dist.gather(send, gather_list=gathered, dst=0)
            if rank == 0:
                out = torch.cat([g[: b - a].to("cuda:0") for g, (a, b) in zip(gathered, sizes)])
        else:
            out = mine

        if rank == 0:
            with torch.cuda.device(0), torch.no_grad():
                reference = build(family, torch.device("cuda", 0), args.path)(x.to("cuda:0"))
            out = out.to("cuda:0")
            diff = (out.double() - reference.double()).abs().max().item() if out.numel() else 0.0
            equal = out.shape == reference.shape and torch.equal(out, reference)
            print(f"{family}: gathered {tuple(out.shape)} vs single-process {tuple(reference.shape)}: "
                  f"max abs diff {diff:.3e} {'EQUAL' if equal else 'DIFFERENT'}", flush=True)
            status |= 0 if out.shape == reference.shape else 1
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
