"""Targets the harness can judge, addressed as MODULE:CALLABLE (or a short alias).

The callable takes no arguments and returns a `harness.targets.base.Target`.
"""

from __future__ import annotations

import importlib

from harness.targets.base import OptimizerTarget, Target

ALIASES: dict[str, str] = {
    "ours": "harness.targets.ours:target",
    "ours-triton": "harness.targets.fast_paths:triton",
    "ours-graphs": "harness.targets.fast_paths:cuda_graphs",
    "torch": "harness.targets.torch_builtin:target",
    "control-layer-mixing": "harness.targets.controls:layer_mixing",
    "control-lr-last-two-dims": "harness.targets.controls:lr_last_two_dims",
    "control-stack-norm": "harness.targets.controls:stack_norm",
    "control-normuon-kernel-slice": "harness.targets.controls:normuon_kernel_slice_variance",
    "control-normuon-trailing-dims": "harness.targets.controls:normuon_trailing_dims_variance",
    "control-local-shard": "harness.targets.distributed_controls:local_shard",
    "control-padding-leak": "harness.targets.distributed_controls:padding_leak",
    "control-wrong-params": "harness.targets.distributed_controls:wrong_params",
    "control-no-gather": "harness.targets.distributed_controls:no_gather",
    "deepspeed-gram": "harness.targets.peers.deepspeed:gram",
    "deepspeed-standard": "harness.targets.peers.deepspeed:standard",
    "dion": "harness.targets.peers.dion:target",
    "heavyball": "harness.targets.peers.heavyball:target",
    "dtensor-muon": "harness.targets.peers.dtensor_muon:target",
    "gram-newton-schulz": "harness.targets.peers.gram_newton_schulz:target",
    "emerging-muon": "harness.targets.peers.emerging_optimizers:target",
    "emerging-muon-shape-scaling": "harness.targets.peers.emerging_optimizers:shape_scaling",
    "control-dion2-kernel-selection": "harness.targets.dion2_controls:kernel_selection",
    "control-dion2-ef-unselected": "harness.targets.dion2_controls:ef_unselected",
    "control-dion2-submatrix-lr": "harness.targets.dion2_controls:submatrix_lr",
    "control-dion2-local-as-global": "harness.targets.dion2_controls:local_as_global",
}
DEFAULT = "ours"


class TargetError(ValueError):
    """A target spec that does not name a usable target."""


def load_target(spec: str) -> Target:
    """Import and build the target named by `spec` (alias or MODULE:CALLABLE)."""
    path = ALIASES.get(spec, spec)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"target {spec!r} is neither an alias {sorted(ALIASES)} nor MODULE:CALLABLE")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"target {spec!r}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TargetError(f"target {spec!r}: {module_name} has no callable {attr!r}")
    built = factory()
    if not isinstance(built, Target):
        raise TargetError(f"target {spec!r}: {attr}() returned {type(built).__name__}, not a harness Target")
    return built


__all__ = ["ALIASES", "DEFAULT", "OptimizerTarget", "Target", "TargetError", "load_target"]
