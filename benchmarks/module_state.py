"""Count the module-level mutable objects of packages: the state a process keeps outside any object it made.

    python benchmarks/module_state.py optimizers [harness ...] [--list]

Imports every module of each package named and counts, per module, the names its own source binds at
module level (assignments, not imports) to a mutable object: a dict, list, set, bytearray, deque (and their
subclasses: OrderedDict, defaultdict), or an instance of a class whose instances are mutable (a non-frozen
dataclass, any object with a writable `__dict__`). Not counted: dunder names (`__all__`), modules, classes,
functions (an `lru_cache` wrapper included: its cache is memoization behind a function), type variables, and
immutable values (numbers, strings, tuples, frozensets, mappingproxy, frozen dataclasses, torch dtypes).
Context variables (contextvars.ContextVar) are listed apart: each is immutable, with a value per thread and
context. Prints one line per module with its count (and, with --list, each name and type), then the total per package.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextvars
import dataclasses
import importlib
import inspect
import os
import pkgutil
import sys
import types
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MUTABLE = (dict, list, set, bytearray, collections.deque)
"""Builtin containers whose instances (and subclasses' instances) are mutable."""


def own_names(module: types.ModuleType) -> list[str]:
    """Names the module's source binds at top level by assignment (Assign, AnnAssign, AugAssign)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return []
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.append(leaf.id)
    return list(dict.fromkeys(names))


def mutable(value: object) -> bool:
    """True for a mutable object (module docstring)."""
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                          types.GenericAlias, contextvars.ContextVar, typing.TypeVar)) or callable(value) and \
            hasattr(value, "cache_info"):
        return False
    if isinstance(value, MUTABLE):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return not type(value).__dataclass_params__.frozen
    return hasattr(value, "__dict__") and not callable(value)


def modules(package: str) -> list[types.ModuleType]:
    """The package and every module under it but `__main__`, imported (a module that cannot be imported is
    skipped)."""
    root = importlib.import_module(package)
    found = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=f"{package}."):
        if info.name.endswith(".__main__"):  # a command line: importing it runs the command
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ImportError as exc:
            print(f"  (skipped {info.name}: {type(exc).__name__}: {exc})")
    return found


def count(package: str, listing: bool) -> int:
    """Print the per-module counts of `package`; return its total."""
    total = 0
    for module in modules(package):
        values = {name: getattr(module, name) for name in own_names(module)
                  if hasattr(module, name) and not (name.startswith("__") and name.endswith("__"))}
        state = {name: value for name, value in values.items() if mutable(value)}
        scopes = [name for name, value in values.items() if isinstance(value, contextvars.ContextVar)]
        total += len(state)
        if state or scopes:
            extra = f" (+ {len(scopes)} context variables: {', '.join(scopes)})" if scopes else ""
            print(f"{module.__name__}: {len(state)}{extra}")
            if listing:
                for name, value in state.items():
                    print(f"    {name}: {type(value).__name__}")
    print(f"{package}: {total} module-level mutable objects")
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--list", action="store_true", help="name each object and its type")
    args = parser.parse_args(argv)
    for package in args.packages:
        count(package, args.list)


if __name__ == "__main__":
    main()
