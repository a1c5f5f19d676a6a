"""load_state_dict validates what it loads: saved groups under the live groups' rules, the algorithm,
every buffer's type, placement, dtype, shape and values; every structural problem is a ValueError
naming the group, parameter and key, and a rejected load changes nothing.

The DTensor cases run on gloo ranks of the harness's pool (spawned ranks import this module)."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import pytest
import torch
from snapshots import rejected_load_problems
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from harness.running.pool import pools
from optimizers import Muon, NorMuon


def stepped(cls: type = Muon, **options: Any) -> tuple[Muon, list[nn.Parameter]]:
    """Group 0 over two matrices (Muon or NorMuon), group 1 AdamW over a vector; stepped once."""
    g = torch.Generator().manual_seed(0)
    ps = [nn.Parameter(torch.randn(4, 6, generator=g)), nn.Parameter(torch.randn(8, 3, 2, 2, generator=g)),
          nn.Parameter(torch.randn(5, generator=g))]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt = cls([{"params": ps[:2]}, {"params": ps[2:], "algorithm": "adamw"}], flatten=True, **options)
    opt.step()
    return opt, ps


def saved(opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy(opt.state_dict())


def edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def corrupt(state: dict[str, Any]) -> dict[str, Any]:
        change(state)
        return state
    return corrupt


def entry(state: dict[str, Any], group: int, index: int) -> dict[str, Any]:
    return state["state"][state["param_groups"][group]["params"][index]]


BAD = [
    # (name, corrupt a saved Muon state, message)
    ("group-lr-negative", edit(lambda s: s["param_groups"][0].update(lr=-1.0)), r"param group 0: lr=-1\.0 is outside"),
    ("group-lr-nan", edit(lambda s: s["param_groups"][1].update(lr=math.nan)), "param group 1: lr must be finite"),
    ("group-orthogonalizer", edit(lambda s: s["param_groups"][0].update(orthogonalizer="qr")),
     "param group 0: unknown orthogonalizer 'qr'"),
    ("group-flag-type", edit(lambda s: s["param_groups"][0].update(nesterov="yes")), "param group 0: nesterov"),
    ("group-betas", edit(lambda s: s["param_groups"][1].update(betas=(0.9,))), "param group 1: betas"),
    ("algorithm-other", edit(lambda s: s["param_groups"][0].update(algorithm="normuon")),
     "param group 0: saved algorithm 'normuon'"),
    ("algorithm-missing", edit(lambda s: s["param_groups"][0].pop("algorithm")), "param group 0: saved algorithm None"),
    ("momentum-nan", edit(lambda s: entry(s, 0, 1)["momentum_buffer"].view(-1).__setitem__(3, math.nan)),
     "param group 0 parameter 1: momentum_buffer has values that are not finite"),
    ("momentum-inf", edit(lambda s: entry(s, 0, 0)["momentum_buffer"].fill_(math.inf)),
     "param group 0 parameter 0: momentum_buffer has values that are not finite"),
    ("momentum-list", edit(lambda s: entry(s, 0, 0).update(momentum_buffer=[[0.0] * 6] * 4)),
     "param group 0 parameter 0: momentum_buffer is a list, not a tensor"),
    ("momentum-shape", edit(lambda s: entry(s, 0, 1).update(momentum_buffer=torch.zeros(8, 12))),
     r"param group 0 parameter 1: momentum_buffer has shape \(8, 12\)"),
    ("momentum-int", edit(lambda s: entry(s, 0, 0).update(momentum_buffer=torch.zeros(4, 6, dtype=torch.int64))),
     "param group 0 parameter 0: momentum_buffer has dtype torch.int64"),
    ("adamw-step-string", edit(lambda s: entry(s, 1, 0).update(step="1")),
     "param group 1 parameter 0: step must be a non-negative int"),
    ("adamw-step-bool", edit(lambda s: entry(s, 1, 0).update(step=True)), "param group 1 parameter 0: step"),
    ("adamw-second-moment-negative", edit(lambda s: entry(s, 1, 0)["exp_avg_sq"].fill_(-1.0)),
     "param group 1 parameter 0: exp_avg_sq has values that are not finite and >= 0"),
    ("adamw-missing-key", edit(lambda s: entry(s, 1, 0).pop("exp_avg")), r"param group 1 parameter 0: state lacks \['exp_avg'\]"),
    ("extra-key", edit(lambda s: entry(s, 0, 0).update(variance=torch.zeros(4, 1))),
     r"param group 0 parameter 0: state has extra keys \['variance'\]"),
    ("entry-not-dict", edit(lambda s: s["state"].update({0: [1, 2]})), "param group 0 parameter 0: state is a list"),
    ("state-stray-id", edit(lambda s: s["state"].update({99: {}})), r"state entries \['99'\] belong to no parameter"),
    ("state-missing", edit(lambda s: s.pop("state")), "'state' must be a dict"),
    ("groups-not-list", edit(lambda s: s.update(param_groups={})), "param_groups"),
    ("groups-count", edit(lambda s: s["param_groups"].pop()), "1 param_groups, the optimizer has 2"),
    ("group-not-dict", edit(lambda s: s["param_groups"].__setitem__(1, "adamw")), "param group 1 is a str"),
    ("group-params-missing", edit(lambda s: s["param_groups"][0].pop("params")), "param group 0: 'params' must be"),
    ("group-params-strings", edit(lambda s: s["param_groups"][0].update(params=["a", "b"])),
     "param group 0: 'params' must be a list of integer ids"),
    ("group-params-count", edit(lambda s: s["param_groups"][0]["params"].pop()), "param group 0 has 1 parameters"),
    ("group-params-duplicate", edit(lambda s: s["param_groups"][1].update(params=[0])), "id 0 appears twice"),
    ("unknown-top-level", edit(lambda s: s.update(extra=1)), r"unknown top-level keys \['extra'\]"),
    ("not-a-dict", lambda s: [s], "optimizer state must be a dict"),
]


@pytest.mark.parametrize("name, corrupt, match", BAD, ids=[b[0] for b in BAD])
def test_a_bad_state_is_a_value_error_that_changes_nothing(name, corrupt, match):
    opt, _ = stepped()
    bad = corrupt(saved(opt))
    with pytest.raises(ValueError, match=match):
        copy.deepcopy(opt).load_state_dict(bad)
    assert rejected_load_problems(opt, bad) == []


def test_a_normuon_state_is_refused_by_muon_and_the_reverse():
    normuon, _ = stepped(NorMuon)
    muon, _ = stepped(Muon)
    with pytest.raises(ValueError, match="saved algorithm 'normuon', the optimizer's group runs 'muon'"):
        copy.deepcopy(muon).load_state_dict(saved(normuon))
    assert rejected_load_problems(muon, saved(normuon)) == []
    assert rejected_load_problems(normuon, saved(muon)) == []


def test_negative_or_nan_normuon_variance_is_refused():
    opt, _ = stepped(NorMuon)
    for value, match in ((-1e-3, "not finite and >= 0"), (math.nan, "not finite and >= 0")):
        bad = saved(opt)
        entry(bad, 0, 1)["variance"].view(-1)[0] = value
        with pytest.raises(ValueError, match="param group 0 parameter 1: variance has values that are " + match):
            copy.deepcopy(opt).load_state_dict(bad)
        assert rejected_load_problems(opt, bad) == []


def test_a_good_state_loads_and_keeps_the_options_it_does_not_name():
    opt, ps = stepped(NorMuon)
    twin, qs = stepped(NorMuon)
    good = saved(opt)
    good["param_groups"][0]["lr"] = 0.01
    del good["param_groups"][0]["beta2"]
    twin.param_groups[0]["beta2"] = 0.9
    twin.load_state_dict(good)
    assert twin.param_groups[0]["lr"] == 0.01 and twin.param_groups[0]["beta2"] == 0.9
    twin.step()


def test_the_check_flags_a_load_that_is_accepted():
    """Negative control of rejected_load_problems: a good state is not refused, and it says so."""
    opt, _ = stepped()
    assert rejected_load_problems(opt, saved(opt)) == ["the load was accepted"]


def placements_refused(ctx) -> dict[str, str]:
    """Rank side: DTensor buffers for plain parameters, plain buffers for DTensor parameters, and other
    placements, are refused with ValueError and change nothing."""
    out = {}
    torch.manual_seed(0)
    plain = nn.Parameter(torch.randn(4, 6))
    plain.grad = torch.randn(4, 6)
    sharded = nn.Parameter(distribute_tensor(torch.randn(4, 6), ctx.mesh, [Shard(0)]))
    sharded.grad = distribute_tensor(torch.randn(4, 6), ctx.mesh, [Shard(0)])
    for name, p in (("plain", plain), ("sharded", sharded)):
        opt = Muon([p], mesh=ctx.mesh)
        opt.step()
        good = opt.state_dict()  # shares the live buffers: a bad copy replaces entries, never edits them
        (key,) = good["state"]
        buffer = good["state"][key]["momentum_buffer"]
        if name == "plain":
            swaps = {"dtensor": distribute_tensor(buffer, ctx.mesh, [Shard(0)])}
        else:
            swaps = {"tensor": buffer.full_tensor(), "replicated": buffer.redistribute(ctx.mesh, [Replicate()])}
        for swap, value in swaps.items():
            bad = {**good, "state": {key: {**good["state"][key], "momentum_buffer": value}}}
            try:
                opt.load_state_dict(bad)
                out[f"{name}/{swap}"] = "accepted"
            except ValueError as exc:
                out[f"{name}/{swap}"] = str(exc)
            out[f"{name}/{swap} problems"] = repr(rejected_load_problems(opt, bad))
        out[f"{name}/good problems"] = repr(rejected_load_problems(opt, good))
    return out


def test_buffer_placements_must_match_their_parameters():
    result = pools().run("gloo", 2, placements_refused)
    assert result.ok, result.describe()
    got = result.values[0]
    assert "momentum_buffer is a DTensor, its parameter is not a DTensor" in got["plain/dtensor"], got
    assert "momentum_buffer is a plain tensor, its parameter is a DTensor" in got["sharded/tensor"], got
    assert "momentum_buffer is placed (Replicate(),)" in got["sharded/replicated"], got
    assert all(got[f"{k} problems"] == "[]" for k in ("plain/dtensor", "sharded/tensor", "sharded/replicated"))
    assert got["plain/good problems"] == got["sharded/good problems"] == "['the load was accepted']"
