"""What one case's target may not carry into the judging or into later cases: torch's global
settings and random state, and the case's inputs.

Settings (`SETTINGS`: threads, float32 matmul precision and each backend's fp32 precision, default
dtype, deterministic algorithms and cuDNN's flags, reduced-precision reductions, grad and anomaly
mode) and the RNG states (CPU, and CUDA's where CUDA is initialised) are captured before a case and
restored after it (`kept_torch_state`), so every case starts from the same state whatever ran
before it, in one process or in any worker. A setting the case changed is named in its records;
the random state is restored without a word, since drawing random numbers is ordinary use.

Inputs: `Target.run` must not modify its inputs. A bitwise copy taken before the target runs is
compared after (`modified`): a target that wrote into them (the adapter mistake
`torch.nn.Parameter(p)` without `.clone()`, which steps the harness's own tensors) is that one
error on the case, instead of the wrong verdicts of checks that read altered inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce
from typing import Any

import torch

from harness.running.inputs import Inputs


@dataclass(frozen=True)
class Setting:
    """One global setting of torch: its name in messages, how to read and how to write it."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def _attribute(path: str) -> Setting | None:
    """The setting at attribute `path` below `torch` ("backends.cudnn.benchmark"), None where this
    torch build has no such attribute."""
    *parents, leaf = path.split(".")
    try:
        owner = reduce(getattr, parents, torch)
        getattr(owner, leaf)
    except AttributeError:
        return None
    return Setting(f"torch.{path}", lambda: getattr(owner, leaf), lambda value: setattr(owner, leaf, value))


def _deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _anomaly(value: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(value[0], value[1])


SETTINGS: tuple[Setting, ...] = tuple(s for s in (
    Setting("torch.get_num_threads()", torch.get_num_threads, torch.set_num_threads),
    # first the legacy switch, which writes the matmul precisions below; then each precision itself
    Setting("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision),
    *(_attribute(f"backends.{node}fp32_precision") for node in (
        "", "cuda.matmul.", "cudnn.", "cudnn.conv.", "cudnn.rnn.", "mkldnn.", "mkldnn.matmul.", "mkldnn.conv.",
        "mkldnn.rnn.")),
    _attribute("backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
    _attribute("backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
    Setting("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
    Setting("torch.are_deterministic_algorithms_enabled(), warn_only",
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()), _deterministic),
    _attribute("backends.cudnn.deterministic"),
    _attribute("backends.cudnn.benchmark"),
    Setting("torch.is_grad_enabled()", torch.is_grad_enabled, torch.set_grad_enabled),
    Setting("torch.is_anomaly_enabled(), check_nan",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()), _anomaly),
) if s is not None)
"""Every global setting restored after a case, in the order they are restored."""


@dataclass(frozen=True)
class TorchState:
    """The values of SETTINGS and the RNG states at one moment."""

    values: tuple[Any, ...]
    cpu_rng: torch.Tensor
    cuda_rng: tuple[torch.Tensor, ...] | None
    """CUDA's generators, one per device; None where CUDA was not initialised."""

    @classmethod
    def capture(cls) -> TorchState:
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else None
        return cls(tuple(s.get() for s in SETTINGS), torch.get_rng_state(), cuda)

    def changes(self, before: TorchState) -> list[str]:
        """Each setting that differs from `before`, as "name: before -> now"."""
        return [f"{s.name}: {b} -> {a}" for s, a, b in zip(SETTINGS, self.values, before.values) if a != b]

    def restore(self) -> None:
        """Write back every setting and RNG state that differs from this one now."""
        for setting, value in zip(SETTINGS, self.values):
            if setting.get() != value:
                setting.set(value)
        if not torch.equal(torch.get_rng_state(), self.cpu_rng):
            torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(list(self.cuda_rng))


@contextmanager
def kept_torch_state() -> Iterator[list[str]]:
    """Restore torch's settings and RNG states on leaving the block (also on an exception); the list
    it yields then holds the settings the block changed ("name: before -> after"), empty if none."""
    before = TorchState.capture()
    changed: list[str] = []
    try:
        yield changed
    finally:
        changed.extend(TorchState.capture().changes(before))
        before.restore()


def changed_note(changes: Sequence[str]) -> str:
    """The line a case's records carry when its target changed torch's settings."""
    return ("the target changed torch's global settings, restored after this case so that later cases "
            f"are not affected: {'; '.join(changes)}")


def copy_of(inputs: Inputs) -> list[torch.Tensor]:
    """A copy of every tensor of `inputs`, to compare against after the target ran."""
    return [t.clone() for t in _tensors(inputs)]


def modified(inputs: Inputs, copy: list[torch.Tensor]) -> str | None:
    """What differs, bit for bit, between `inputs` and the `copy` taken before the target ran, in one
    message that names the tensors and the rule; None if nothing does."""
    names = [f"parameter {i}" for i in range(len(inputs.params))] + [
        f"gradient {i} of step {k}" for k, step in enumerate(inputs.grads) for i in range(len(step))]
    changed = [n for n, now, then in zip(names, _tensors(inputs), copy) if not _same_bits(now, then)]
    if not changed:
        return None
    shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    return (f"the target modified its inputs ({shown} changed in place), which Target.run must not do: an "
            f"adapter that wraps the harness's tensors without copying them (torch.nn.Parameter(p) shares "
            f"p's storage; use torch.nn.Parameter(p.detach().clone())) steps the inputs every check reads, "
            f"so no check of this case was judged")


def _tensors(inputs: Inputs) -> list[torch.Tensor]:
    return [*inputs.params, *(g for step in inputs.grads for g in step)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if `a` and `b` have the same dtype, shape and bits (NaNs of the same payload are equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))
