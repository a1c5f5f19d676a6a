"""The checks of a case over its layout, judged from the pieces its ranks sent back (harness/running/ranks.py)
after the parent gathers them (each into its box, cases.layouts.regions). One process is the layout of
world size 1: its one piece is the whole trajectory.

  reference    gathered parameters vs the FP64 reference step, re-seeded every step from the
               gathered previous parameter (harness.judging.checks.reference); a case of a local
               selection scope also MEASURES (reports, never judges) how far its update is from the
               global-scope one: the layout dependence of that scope
  local_shard  the same-sharding reference: each rank's own piece vs the same piece of that
               reference step, so an error confined to one shard cannot hide in the whole's norm;
               allowed the whole's error allowance relative to the piece (`piece_tolerance`)
               (a TP case's reference is its mode's: the whole matrix for gather, each TP shard
               alone for per_shard, per head with heads; harness/algorithms/muon.py)
  layout       layout invariance: the gathered run vs the single-process run of the same case
               on the same target (bitwise when the target's relations are exact and all is fp64);
               for per_shard TP with heads, per-head exactness (each TP shard's whole heads equal
               the unsharded per-head update)
  replicas     replicated layout: every rank's parameters are bitwise those of rank 0
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cases import Case
from cases.layouts import regions
from harness.algorithms import algorithm
from harness.judging import checks
from harness.judging.metrics import compare_step
from harness.judging.outcome import NO_METRICS, Outcome, Trajectory, describe, worst_judged, worst_of
from harness.policy import tolerance
from harness.policy.bounds import REPLICAS, Tolerance
from harness.running.inputs import Inputs, f64
from harness.targets.base import Target

Pieces = list[Trajectory]
"""pieces[r][k][i]: rank r's piece of member i after step k."""


def gather(case: Case, pieces: Pieces) -> Trajectory:
    """The whole parameters: the one process's, rank 0's copy when replicated, else every rank's piece
    put in its box."""
    if case.world_size == 1 or case.layout == "replicated":
        return pieces[0]
    boxes = regions(case.layout, case.world_size, case.shape)
    out = []
    for k in range(case.steps):
        step = []
        for i in range(case.megabatch):
            whole = pieces[0][k][i].new_empty(case.shape)
            for box, rank in zip(boxes, pieces):
                whole[box] = rank[k][i]
            step.append(whole)
        out.append(step)
    return out


def reference(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    out = checks.reference(case, target, inputs, gather(case, pieces))
    if algorithm(case).local_blocks(case) is None or out.skipped:
        return out
    return dataclasses.replace(out, message=f"{out.message}; {scope_dependence(case, target, inputs, pieces)}")


def scope_dependence(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> str:
    """How far a local-scope run's update is from the global-scope reference update, re-seeded
    from the same parameters: max over members and steps of ||upd - upd_global|| / ||upd_global||."""
    whole = dataclasses.replace(case, scope="global")
    steps = checks.reference_steps(whole, target, inputs.params, inputs.grads, gather(case, pieces))
    worst = max(float(np.linalg.norm((x_new - x_prev) - (x_ref - x_prev)) / np.linalg.norm(x_ref - x_prev))
                for _, x_prev, x_new, x_ref in steps)
    return (f"layout dependence of the local selection scope (measured, not judged): the update is "
            f"{worst:.3g} (relative) from the global-scope update on {case.world_size} ranks")


def piece_tolerance(case: Case, tol: Tolerance, share: float) -> Tolerance:
    """The tolerance of one rank's piece of a step whose whole update has tolerance `tol`, the piece
    holding `share` = ||update_r|| / ||update|| of it: rtol / share, the whole's allowance
    (||err_r|| <= ||err|| <= rtol ||update||) relative to the piece.

    No tighter bound holds for every correct step. A deviation at the singular values alone
    (err = U diag(d) V^T) would give a piece at most sqrt(k) x the whole's relative error over the
    member's k singular directions, but rounding also moves the singular vectors: on NCCL ranks, the
    fp32 SVD of a 1 x 16 row vector (k = 1) put 2.3 x the whole's relative error into one rank's four
    columns (rel_err 7.2e-7 against the whole's 3.1e-7, 1.09 x a sqrt(k) allowance). An error confined
    to a piece still fails here once it exceeds what the whole may hold, and the layout check compares
    the distributed run with the single-process one far tighter. A piece whose reference update is
    zero is allowed its storage rounding only."""
    factor = 1.0 / share if share > 0 else 1.0  # a piece the reference leaves unmoved: storage rounding only
    return Tolerance(tol.rtol * factor, tol.storage_ulps,
                               f"{factor:.3g} x the step's rtol for one piece (1 / its share {share:.3g} of the "
                               f"update: the whole's allowance): {tol.source}")


def local_shard(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Each rank's piece vs the same piece of the FP64 reference step (empty pieces hold nothing to
    judge), within `piece_tolerance` (a replicated rank's piece is the whole: the step's own tolerance)."""
    whole = gather(case, pieces)
    try:
        policy = checks.policy(case, target, inputs)
    except tolerance.NoEntry as gap:
        return checks.gap_or_tie("local_shard", gap, case, target, inputs, whole)
    why = policy.ill_posed()
    if why:
        return Outcome("local_shard", NO_METRICS, None, why, skipped=True)
    boxes = regions(case.layout, case.world_size, case.shape)
    steps: list = []
    why = checks.selection_ill_posed(case, target, inputs, whole, steps)
    if why:
        return Outcome("local_shard", NO_METRICS, None, why, skipped=True)
    pairs = []
    for r, (rank, index) in enumerate(zip(pieces, boxes)):
        for n, (where, x_prev, _, x_ref) in enumerate(steps):
            i, k = divmod(n, case.steps)
            mine = f64(rank[k][i])
            if mine.size:
                tol = policy.at(i, k)
                if case.layout != "replicated":
                    share = float(np.linalg.norm((x_ref - x_prev)[tuple(index)])
                                  / max(np.linalg.norm(x_ref - x_prev), np.finfo(float).tiny))
                    tol = piece_tolerance(case, tol, share)
                pairs.append((compare_step(x_prev[tuple(index)], mine, x_ref[tuple(index)], case.param_dtype,
                                           tol.rtol, tol.storage_ulps), f"rank {r} {where}", tol))
    metrics, where, tol = worst_judged(pairs)
    return Outcome("local_shard", metrics, tol, describe(metrics, where, tol))


def layout(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Layout invariance: the gathered run against the target's single-process run of the same inputs."""
    single = target.run(inputs.params, inputs.grads, case)
    out = checks.relation("layout", case, target, inputs, gather(case, pieces), single, across_layouts=True)
    return dataclasses.replace(out, message=f"{case.layout_detail} on {case.world_size} ranks vs one process: "
                                            f"{out.message}")


def replicas(case: Case, target: Target, inputs: Inputs, pieces: Pieces) -> Outcome:
    """Every rank's replicated parameters bitwise equal rank 0's, member by member, step by step."""
    pairs = []
    for r in range(1, case.world_size):
        for k in range(case.steps):
            for i in range(case.megabatch):
                prev = f64(pieces[0][k - 1][i] if k else inputs.params[i])
                pairs.append((compare_step(prev, f64(pieces[r][k][i]), f64(pieces[0][k][i]), case.param_dtype,
                                           0.0, 0.0), f"rank {r} vs rank 0, member {i} step {k + 1}"))
    metrics, where = worst_of(pairs)
    verdict = "bitwise identical" if metrics.ratio == 0 else f"DIFFER (worst at {where}, max_abs {metrics.max_abs:.3g})"
    return Outcome("replicas", metrics, REPLICAS, f"{case.world_size} replicas {verdict}")
