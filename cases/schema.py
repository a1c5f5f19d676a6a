"""The case axes, declared once: how each is spelled in the id, parsed back, stored as a record column,
drawn by the property tests and filtered in the HTML report.

`TOKENS` lists the id's '/'-separated tokens in order; each writes and reads the `Case` fields it holds
(the optimizer token holds the optimizer, its fraction and its scope; the dtype token both dtypes).
Trailing tokens whose case has the default (the layout and world size of one process) are omitted, so
the parser takes any count between the required tokens and all of them. `COLUMNS` are the record
columns a case gives each of its records (reports/records.py builds `Record` from them); a column added
after schema version 1 has a default, and a run stored before it gets the value its case id says
(reports.records.from_row, through `column_values`); `FILTERS` are the columns the HTML report filters
by. `AXES` holds each field's domain: what the property tests draw (cases/strategies.py).

Nothing here may change an existing id: tests/test_case_ids_frozen.py holds the tiers' ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from cases import axes


@dataclass(frozen=True)
class Token:
    """One id token: `write` spells the case's `fields`, `read` parses them back (KeyError or ValueError
    on a token that does not fit); `omit` says when an optional (trailing) token is left out."""

    name: str
    fields: tuple[str, ...]
    write: Callable[[Any], str]
    read: Callable[[str], dict[str, Any]]
    omit: Callable[[Any], bool] | None = None


def _prefixed(prefix: str, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        if not text.startswith(prefix):
            raise ValueError(f"token {text!r} must read {prefix}<value>")
        return kind(text.removeprefix(prefix))
    return read


_OPTIMIZER_PARTS = (("fraction", "f", float), ("ef_decay", "ef", float), ("beta2", "b", float))
"""The optimizer token's optional parts after the name, in order: prefix and type of each."""


def _read_optimizer(text: str) -> dict[str, Any]:
    """NAME[-f<fraction>][-ef<ef_decay>][-b<beta2>][-defaults][-<scope>]; a part left out is None (fraction,
    scope) or its default."""
    name, *parts = text.split("-")
    fields: dict[str, Any] = {"optimizer": name, "fraction": None, "scope": None}
    if parts and parts[-1] in axes.SCOPES:
        fields["scope"] = parts.pop()
    if parts and parts[-1] in axes.CONSTRUCTIONS[1:]:
        fields["construct"] = parts.pop()
    for field, prefix, kind in _OPTIMIZER_PARTS:
        if parts and parts[0].startswith(prefix):
            fields[field] = kind(parts.pop(0).removeprefix(prefix))
    if parts:
        raise ValueError(f"optimizer token {text!r} must read "
                         "NAME[-f<fraction>][-ef<ef_decay>][-b<beta2>][-defaults][-<scope>]")
    return fields


def _read_nesterov(text: str) -> dict[str, Any]:
    """nesterov|plain, then _mu<momentum> where the momentum is not its default."""
    form, sep, momentum = text.partition("_")
    fields: dict[str, Any] = {"nesterov": _NESTEROV[form]}
    if sep:
        fields["momentum"] = _prefixed("mu", float)(momentum)
    return fields


def _read_decay(text: str) -> dict[str, Any]:
    """wd<weight decay>, then _lr<lr> where the lr is not its default."""
    decay, sep, lr = text.partition("_")
    fields: dict[str, Any] = {"weight_decay": _prefixed("wd", float)(decay)}
    if sep:
        fields["lr"] = _prefixed("lr", float)(lr)
    return fields


def _read_dtypes(text: str) -> dict[str, Any]:
    param, sep, compute = text.partition("@")
    if not sep:
        raise ValueError(f"dtype token {text!r} must read <param>@<compute>")
    return {"param_dtype": param, "compute_dtype": compute}


_ORTH_NAMES = {token: name for name, token in axes.ORTH_TOKENS.items()}
_FLATTEN = {"flat": True, "noflat": False}
_NESTEROV = {"nesterov": True, "plain": False}

TOKENS: tuple[Token, ...] = (
    Token("optimizer", ("optimizer", "fraction", "ef_decay", "beta2", "construct", "scope"),
          lambda c: c.optimizer_token, _read_optimizer),
    Token("layer", ("layer",), lambda c: f"{c.layer}-{c.shape_text}",
          lambda t: {"layer": t.rpartition("-")[0]}),  # the shape after it is checked by the canonical id
    Token("megabatch", ("megabatch",), lambda c: f"mb{c.megabatch}",
          lambda t: {"megabatch": _prefixed("mb", int)(t)}),
    Token("flatten", ("flatten",), lambda c: "flat" if c.flatten else "noflat", lambda t: {"flatten": _FLATTEN[t]}),
    Token("dtypes", ("param_dtype", "compute_dtype"), lambda c: f"{c.param_dtype}@{c.compute_dtype}", _read_dtypes),
    Token("orthogonalizer", ("orthogonalizer",), lambda c: axes.ORTH_TOKENS[c.orthogonalizer],
          lambda t: {"orthogonalizer": _ORTH_NAMES[t]}),
    Token("adjust_lr", ("adjust_lr",), lambda c: c.adjust_lr, lambda t: {"adjust_lr": t}),
    Token("nesterov", ("nesterov", "momentum"), lambda c: ("nesterov" if c.nesterov else "plain")
          + ("" if c.momentum == axes.MOMENTUM else f"_mu{c.momentum:g}"), _read_nesterov),
    Token("weight_decay", ("weight_decay", "lr"), lambda c: f"wd{c.weight_decay:g}"
          + ("" if c.lr == axes.LR else f"_lr{c.lr:g}"), _read_decay),
    Token("steps", ("steps",), lambda c: f"steps{c.steps}", lambda t: {"steps": _prefixed("steps", int)(t)}),
    Token("grad", ("grad",), lambda c: c.grad, lambda t: {"grad": t}),
    Token("seed", ("seed",), lambda c: f"seed{c.seed}", lambda t: {"seed": _prefixed("seed", int)(t)}),
    Token("layout", ("layout",), lambda c: c.layout, lambda t: {"layout": t}, omit=lambda c: c.layout == "single"),
    Token("world_size", ("world_size",), lambda c: f"ws{c.world_size}",
          lambda t: {"world_size": _prefixed("ws", int)(t)}, omit=lambda c: c.world_size == 1),
)
"""The id's tokens in order (see cases/case.py for an annotated id)."""

REQUIRED_TOKENS = sum(1 for t in TOKENS if t.omit is None)
if any(t.omit is None for t in TOKENS[REQUIRED_TOKENS:]):
    raise AssertionError("optional id tokens must all come after the required ones")


def write_id(case: Any) -> str:
    """The case's id: its tokens in order, the optional ones its case leaves at their default omitted."""
    return "/".join(t.write(case) for t in TOKENS if t.omit is None or not t.omit(case))


def read_id(case_id: str) -> dict[str, Any]:
    """The `Case` fields an id spells (not yet validated: `Case.from_id` builds and checks the case).
    ValueError when the count of tokens is outside [required, all]; KeyError or ValueError naming a
    token that does not fit."""
    parts = case_id.split("/")
    if not REQUIRED_TOKENS <= len(parts) <= len(TOKENS):
        raise ValueError(f"expected {REQUIRED_TOKENS} to {len(TOKENS)} '/'-separated tokens "
                         f"({', '.join(t.name for t in TOKENS)}), got {len(parts)}")
    fields: dict[str, Any] = {}
    for token, text in zip(TOKENS, parts):
        fields.update(token.read(text))
    return fields


@dataclass(frozen=True)
class Column:
    """A record column a case gives each of its records: `value(case)` of type `kind`. `since`: the
    schema version that added it (reports/records.py SCHEMA_VERSION); after version 1 it has a
    `default` (the value of a row whose case id does not parse). `filter`: the HTML report has a
    <select> filter for it."""

    name: str
    kind: type
    value: Callable[[Any], Any]
    since: int = 1
    default: Any = None
    filter: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("world_size", int, lambda c: c.world_size),
    Column("layout", str, lambda c: c.layout_detail, filter=True),
    Column("optimizer", str, lambda c: c.optimizer, filter=True),
    Column("layer", str, lambda c: c.kind, filter=True),
    Column("shape", str, lambda c: c.shape_text),
    Column("megabatch", int, lambda c: c.megabatch),
    Column("flatten", bool, lambda c: c.flatten),
    Column("param_dtype", str, lambda c: c.param_dtype, filter=True),
    Column("compute_dtype", str, lambda c: c.compute_dtype, filter=True),
    Column("orthogonalizer", str, lambda c: c.orthogonalizer, filter=True),
    Column("adjust_lr", str, lambda c: c.adjust_lr, since=4, default="", filter=True),
    Column("nesterov", str, lambda c: "nesterov" if c.nesterov else "plain", since=4, default=""),
    Column("weight_decay", float, lambda c: c.weight_decay, since=4, default=math.nan),
    Column("steps", int, lambda c: c.steps, since=4, default=0),
    Column("grad", str, lambda c: c.grad, since=4, default="", filter=True),
    Column("seed", int, lambda c: c.seed, since=4, default=-1),
    Column("fraction", str, lambda c: "" if c.fraction is None else f"{c.fraction:g}", since=4, default=""),
    Column("scope", str, lambda c: c.scope or "", since=4, default=""),
    Column("lr", float, lambda c: c.lr, since=5, default=math.nan),
    Column("momentum", float, lambda c: c.momentum, since=5, default=math.nan),
    Column("beta2", float, lambda c: c.beta2, since=5, default=math.nan),
    Column("ef_decay", float, lambda c: c.ef_decay, since=5, default=math.nan),
)
"""Record columns from the case, in order. Those of version 1 sit between `backend` and `status` of
`Record`; later ones after every other column, so that the stored column order only grows at the end.
`layer` is the layer's kind and `layout` names its pieces (shard0-uneven), as the reports group by them;
`fraction` is text as the id spells it, empty for an optimizer without one."""


def column_values(case: Any) -> dict[str, Any]:
    """Every case column's value for `case`."""
    return {c.name: c.value(case) for c in COLUMNS}


FILTERS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.filter)
"""The case columns the HTML report filters by."""
