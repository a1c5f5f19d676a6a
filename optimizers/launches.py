"""Every Triton launch of ours, so that a step's kernels can be compiled side by side before it runs.

Triton compiles a kernel for each specialization (argument dtypes, constexprs, which integers are 1 or
multiples of 16, which pointers are 16-byte aligned) at its first launch, on the launching thread: a
step's first launch of each kernel waits for its compile (about 0.45 s each on the H200 machine, 11 of
them in the 24-layer Gram Newton–Schulz step, 5 s in all). Within `recording()`, `launch` notes the
launch instead of running it, and `on_device` lets meta tensors stand in for CUDA ones, so that a step
run on meta tensors (optimizers/plan.py `compile_ahead`) lists exactly the launches the real one will
make; `compile_all` then compiles them on a thread pool (Triton's compiler releases the GIL for most of
its passes and its ptxas and launcher builds are subprocesses: 8 compiles took 2.17 s on 8 threads
against 5.86 s one by one, docs/performance.md §5).
`compile_in_background` runs `compile_all` on a thread of its own, for kernels a stand-in of the same bits
replaces until they are compiled (optimizers/plan.py `compile_for`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

WORKERS = 16
"""Compile threads at most (one per kernel, up to the machine's CPUs)."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch as it was asked for: `kernel[grid](*args, **options)`."""

    kernel: Any
    grid: tuple
    args: tuple
    options: dict


@dataclass(frozen=True)
class _Rehearsal:
    """An open `recording()`: the launches noted so far, and the device its meta tensors stand in for."""

    noted: list[Launch]
    device: torch.device | None


_REHEARSAL: ContextVar[_Rehearsal | None] = ContextVar("optimizers.launches.rehearsal", default=None)
"""The innermost open `recording()` of this thread and context (None: launches run)."""


def launch(kernel: Any, grid: tuple, *args: Any, **options: Any) -> None:
    """`kernel[grid](*args, **options)`, or, within `recording()`, the note of it."""
    rehearsal = _REHEARSAL.get()
    if rehearsal is not None:
        rehearsal.noted.append(Launch(kernel, tuple(grid), args, options))
        return
    kernel[grid](*args, **options)


def noting() -> bool:
    """True within `recording()`: what runs is a rehearsal, which reads, caches and counts nothing."""
    return _REHEARSAL.get() is not None


def on_device(t: torch.Tensor) -> bool:
    """`t` lies where the kernels run: CUDA, or a meta tensor standing in for one within `recording()`."""
    return t.is_cuda or (noting() and t.is_meta)


def device_of(t: torch.Tensor) -> torch.device:
    """The device `t` lies on, or, for a meta tensor within `recording(device)`, the device it stands in for
    (the options a device decides, such as the default compute dtype, are the real device's)."""
    rehearsal = _REHEARSAL.get()
    if t.is_meta and rehearsal is not None and rehearsal.device is not None:
        return rehearsal.device
    return t.device


@contextlib.contextmanager
def recording(device: torch.device | None = None) -> Iterator[list[Launch]]:
    """Within: launches are noted in the yielded list, in order, and not run; meta tensors stand in for
    tensors on `device` (`device_of`)."""
    noted: list[Launch] = []
    token = _REHEARSAL.set(_Rehearsal(noted, device))
    try:
        yield noted
    finally:
        _REHEARSAL.reset(token)


def signature(item: Any) -> Any:
    """The part of a launch argument Triton specializes a kernel on: a tensor's dtype and whether its
    address is 16-byte aligned (a meta tensor's address is its storage offset in bytes); an int's being 1
    or a multiple of 16; a tensor descriptor's block and its tensor's signature; a float nothing; anything
    else (bools, dtypes, constexpr values) itself."""
    if isinstance(item, torch.Tensor):
        return ("tensor", item.dtype, item.data_ptr() % 16 == 0)
    if isinstance(item, float):
        return "float"
    if isinstance(item, int) and not isinstance(item, bool):
        return ("int", item == 1, item % 16 == 0)
    if hasattr(item, "block_shape") and hasattr(item, "base"):  # a host-side TMA descriptor
        return ("descriptor", tuple(item.block_shape), signature(item.base))
    return item


def specialization(item: Launch) -> tuple:
    """What decides the kernel `item` compiles: the kernel, its arguments' signatures and its options
    (constexprs, warps, stages) by value; not the grid."""
    return (id(item.kernel), tuple(signature(a) for a in item.args), tuple(sorted(item.options.items())))


def distinct(launches: list[Launch]) -> list[Launch]:
    """`launches` less those that would compile what an earlier one compiles (`specialization`)."""
    seen, out = set(), []
    for item in launches:
        key = specialization(item)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


COMPILED: set[tuple] = set()
"""The specializations `compile_all` compiled in this process: a record of Triton's own per-process kernel
cache (what a launch would find compiled), kept so that a plan compiles ahead only what is missing."""


def compiled(item: Launch) -> bool:
    """`compile_all` already compiled what `item` would (`specialization`) in this process."""
    return specialization(item) in COMPILED


FAILURES: list[str] = []
"""Kernels `compile_all` could not compile ahead in this process, with the error (their real launch then
compiles them, or fails as it always would): a log of the process's compiles, read by tests and benchmarks."""


def compile_all(launches: list[Launch], device: torch.device) -> int:
    """Compile (and load on `device`) each distinct launch's kernel, side by side on a thread pool, as
    its first real launch would: Triton's own `warmup`, then its launcher and module (a kernel already
    compiled in this process is found in Triton's cache at once). A kernel that fails here is noted in
    FAILURES and left to its real launch, which handles the failure itself
    (optimizers/symmetric_triton.py falls back to its base variant). Returns how many compiled."""
    todo = distinct(launches)
    if not todo:
        return 0
    import triton  # noqa: PLC0415 - only where there are launches (triton is optional)

    with torch.cuda.device(device):
        triton.runtime.driver.active.utils  # noqa: B018 - its one-time build, before the threads share it
        for kernel in {id(item.kernel): item.kernel for item in todo}.values():
            # Triton's per-device binder and kernel cache, made here once: a defaultdict entry made by two
            # threads at once is made twice, and a compile stored in the copy that loses is lost
            caches = getattr(kernel, "device_caches", None)
            if caches is not None:
                caches[triton.runtime.driver.active.get_current_device()]  # noqa: B018

    def one(item: Launch) -> bool:
        try:
            with torch.cuda.device(device):
                binary = item.kernel.warmup(*item.args, grid=item.grid, **item.options)
                init = getattr(binary, "_init_handles", None)  # the launcher and module (Triton internals)
                if init is not None:
                    init()
            COMPILED.add(specialization(item))
        except Exception as exc:  # noqa: BLE001 - the real launch meets it again and handles it
            name = getattr(getattr(item.kernel, "fn", None), "__name__", repr(item.kernel))
            FAILURES.append(f"{name}: {type(exc).__name__}: {exc}")
            return False
        return True

    with ThreadPoolExecutor(min(len(todo), WORKERS, os.cpu_count() or 1)) as pool:
        return sum(pool.map(one, todo))


BACKGROUND: list[threading.Thread] = []
"""Compiles started by `compile_in_background` and not yet waited for (a daemon thread each: a process may exit
before one ends): the process's compile threads, as Triton's compiles are the process's."""


def compile_in_background(launches: list[Launch], device: torch.device, done: Callable[[], None]) -> None:
    """`compile_all(launches, device)` on a thread of its own, then `done()`; an error that escapes it is
    noted in FAILURES (the launches meet it again when they run)."""
    def work() -> None:
        try:
            compile_all(launches, device)
        except Exception as exc:  # noqa: BLE001 - a speed-up only, on a thread nobody joins in a step
            FAILURES.append(f"background compile: {type(exc).__name__}: {exc}")
        finally:
            done()
    thread = threading.Thread(target=work, name="triton-compile", daemon=True)
    BACKGROUND.append(thread)
    thread.start()


def wait() -> None:
    """Wait for every background compile (tests, benchmarks)."""
    while BACKGROUND:
        BACKGROUND.pop().join()
