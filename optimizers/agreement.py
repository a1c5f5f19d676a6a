"""Distributed agreement: before any rank writes, every rank of the optimizer's process group learns
whether all ranks accepted the step and step the same parameter set.

Each step costs one all-reduce (MAX) of three int64: the rank's fingerprint digest, its negation
(so the maximum and the minimum travel together) and a rejection flag. It runs every step, not
only when this rank's parameter set changed: a rank whose set did not change cannot know that
another's did. Only when the digests differ or a rank rejected its step, every rank all-gathers
the fingerprints and rejection messages, and raises: the rank that rejected raises its own error;
every other rank raises one ValueError naming that rank, or, for different parameter sets, the
same ValueError naming the first parameter where the ranks differ.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def agree(group: dist.ProcessGroup, fingerprint: list[tuple], digest: int, error: Exception | None) -> None:
    """Raise on every rank unless every rank of `group` planned its step (`error` None) with the same
    `digest` of its `fingerprint` (optimizers.plan.fingerprint)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    votes = torch.tensor([digest, -digest, int(error is not None)], dtype=torch.int64, device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=group)
    high, negated_low, rejected = votes.tolist()
    if not rejected and high == -negated_low:
        return
    mine = (None if error is None else f"{type(error).__name__}: {error}", fingerprint)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    if error is not None:
        raise error
    for rank, (message, _) in enumerate(everyone):
        if message is not None:
            raise ValueError(f"rank {rank} rejected this step, so no rank steps: {message}")
    raise ValueError(difference([entries for _, entries in everyone]))


def difference(fingerprints: list[list[tuple]]) -> str:
    """The first parameter where the ranks' fingerprints differ, described the same on every rank."""
    def describe(entry: tuple | None) -> str:
        if entry is None:
            return "no such parameter"
        _, _, shape, dtype, placements, has_grad = entry
        return f"shape {shape} {dtype} placements {placements} {'with' if has_grad else 'without'} a gradient"

    base = fingerprints[0]
    for rank, other in enumerate(fingerprints[1:], start=1):
        for j in range(max(len(base), len(other))):
            a = base[j] if j < len(base) else None
            b = other[j] if j < len(other) else None
            if a != b:
                index, i = (a or b)[:2]
                return (f"ranks step different parameter sets (every rank must step the same parameters, the "
                        f"same ones with gradients, in the same order): param group {index} parameter {i}: "
                        f"rank 0 has {describe(a)}, rank {rank} has {describe(b)}")
    return "ranks step different parameter sets"
