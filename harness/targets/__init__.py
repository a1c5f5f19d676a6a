"""Targets the harness can judge, addressed as MODULE:CALLABLE (or a short alias).

The callable takes no arguments and returns a `harness.targets.base.Target`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import types
from collections.abc import Mapping

import torch

from harness.targets.base import OptimizerTarget, Target

ALIASES: Mapping[str, str] = types.MappingProxyType({
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
})
DEFAULT = "ours"


class TargetError(ValueError):
    """A target spec that does not name a usable target."""


def load_target(spec: str) -> Target:
    """Import and build the target named by `spec` (alias or MODULE:CALLABLE); TargetError, in one
    line, for a spec that names no module or callable, a callable that needs arguments (an optimizer
    class, say) or one that returns something other than a Target."""
    module_name, attr = _parts(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"target {spec!r}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TargetError(f"target {spec!r}: {module_name} has no callable {attr!r}")
    needs = _required_arguments(factory)
    if needs:
        what = ("a torch.optim.Optimizer class" if inspect.isclass(factory) and issubclass(factory, torch.optim.Optimizer)
                else "a class" if inspect.isclass(factory) else "a callable")
        raise TargetError(f"target {spec!r}: the callable must return a harness Target, and {attr} is {what} that "
                          f"needs {', '.join(needs)}; name a function that returns an adapter (OptimizerTarget)")
    built = factory()
    if not isinstance(built, Target):
        raise TargetError(f"target {spec!r}: the callable must return a harness Target; {attr}() returned "
                          f"{type(built).__name__}")
    return built


def target_module(spec: str) -> str:
    """The module a target spec (alias or MODULE:CALLABLE) names; TargetError as `load_target`."""
    return _parts(spec)[0]


def _parts(spec: str) -> tuple[str, str]:
    """(module, callable) of an alias or MODULE:CALLABLE; for anything else a TargetError that names
    the nearest alias, if one is near."""
    module_name, sep, attr = ALIASES.get(spec, spec).partition(":")
    if not sep or not module_name or not attr:
        near = difflib.get_close_matches(spec, ALIASES, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (the {len(ALIASES)} aliases: harness.targets.ALIASES)"
        raise TargetError(f"target {spec!r} is neither an alias nor MODULE:CALLABLE{hint}")
    return module_name, attr


def _required_arguments(factory: object) -> list[str]:
    """The parameters a call of `factory` with no arguments would lack (none where its signature is
    not introspectable)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


__all__ = ["ALIASES", "DEFAULT", "OptimizerTarget", "Target", "TargetError", "load_target", "target_module"]
