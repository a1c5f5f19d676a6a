"""Algorithm records: the registry, records and names as group options, variants by stage replacement,
options of added algorithms, and checkpoints that name the algorithm."""

import copy
import dataclasses

import pytest
import torch

import optimizers
from optimizers import ADAMW, DION2, MUON, NORDION2, NORMUON, REGISTRY, Algorithm, Muon, NorMuon


def params(*shapes, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype))
        p.grad = torch.randn(*shape, generator=g, dtype=dtype)
        out.append(p)
    return out


def test_registry_maps_each_name_to_its_record():
    assert REGISTRY == {"muon": MUON, "normuon": NORMUON, "dion2": DION2, "nordion2": NORDION2, "adamw": ADAMW}
    assert all(isinstance(a, Algorithm) and REGISTRY[a.name] is a for a in REGISTRY.values())
    assert [k.name for k in NORMUON.state] == ["momentum_buffer", "variance"] and ADAMW.elementwise


@pytest.mark.parametrize("cls, record", [(Muon, MUON), (NorMuon, NORMUON)])
def test_a_record_steps_exactly_as_its_name(cls, record):
    a, b = params((8, 4, 3, 3), (8, 4, 3, 3), (6, 20)), params((8, 4, 3, 3), (8, 4, 3, 3), (6, 20))
    cls(a, flatten=True).step()
    Muon(b, flatten=True, algorithm=record).step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_a_variant_replaces_one_stage_and_keeps_the_others():
    """orthogonalize -> zeros: the step is pure decay, and momentum still accumulates."""
    variant = dataclasses.replace(MUON, orthogonalize=lambda mats, group: torch.zeros_like(mats))
    ps = params((4, 6))
    before, grad = ps[0].detach().clone(), ps[0].grad.clone()
    opt = Muon(ps, algorithm=variant, lr=0.1, weight_decay=0.5)
    opt.step()
    assert torch.equal(ps[0].detach(), before * (1 - 0.1 * 0.5))
    assert torch.equal(opt.state[ps[0]]["momentum_buffer"], grad)


def test_options_of_an_added_algorithm_default_from_its_record_and_are_validated_by_it():
    def validate(where, group):
        if group["rank_fraction"] <= 0:
            raise ValueError(f"{where}: rank_fraction must be > 0")
    added = dataclasses.replace(MUON, name="added", defaults={**MUON.defaults, "rank_fraction": 0.25},
                                validate=validate)
    opt = Muon([{"params": params((4, 6)), "algorithm": added}])
    assert opt.param_groups[0]["rank_fraction"] == 0.25
    with pytest.raises(ValueError, match="param group 1: rank_fraction"):
        opt.add_param_group({"params": params((4, 6)), "algorithm": added, "rank_fraction": 0.0})
    assert len(opt.param_groups) == 1


def test_unknown_constructor_option_is_a_type_error():
    with pytest.raises(TypeError, match="rank_fraction"):
        Muon(params((4, 6)), rank_fraction=0.5)


def test_state_dict_names_the_algorithm_and_a_load_keeps_the_live_record():
    variant = dataclasses.replace(NORMUON)
    ps = params((4, 6))
    opt = Muon(ps, algorithm=variant)
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    assert state["param_groups"][0]["algorithm"] == "normuon"
    opt.load_state_dict(state)
    assert opt.param_groups[0]["algorithm"] is variant


def test_the_package_exposes_the_architecture():
    assert {"Muon", "NorMuon", "Algorithm", "MUON", "NORMUON", "REGISTRY"} <= set(optimizers.__all__)


def test_records_are_frozen_and_an_algorithm_compares_by_identity():
    """State keys and algorithm records cannot change once made; a copy of a record with the same stages is
    another algorithm (a group names its record), and records hash (plans key on them). Their decorators'
    mutants (frozen=False, eq=True) survived every case: a decorator runs at import, under no case."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        MUON.state[0].name = "m"
    with pytest.raises(dataclasses.FrozenInstanceError):
        MUON.name = "muon2"
    twin = dataclasses.replace(MUON)
    assert twin != MUON and twin == twin and hash(twin) != hash(MUON) and len({MUON, twin, NORMUON}) == 3


def test_an_empty_stack_runs_no_stage():
    """A megabatch stack of no members (a rank's empty share of an exchange) comes back as it is, before any
    stage runs: on CUDA a kernel launched over an empty grid is an error."""
    def refuse(*args):
        raise AssertionError("a stage ran on an empty stack")
    record = dataclasses.replace(MUON, orthogonalize=refuse)
    group = Muon(params((4, 6))).param_groups[0]
    empty = torch.empty(0, 4, 6)
    assert record.matrix_update(group, (4, 6))(empty) is empty


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_half_type_parameters_apply_one_by_one_with_the_per_tensor_bits(weight_decay):
    """decoupled_apply_all of bf16 parameters takes the per-tensor ops (a foreach op rounds its scalar to bf16 on
    CPU; inverting `foreach_exact` sent them through it); fp32 ones take foreach, with the same bits."""
    from optimizers.algorithms.base import decoupled_apply, decoupled_apply_all
    group = {"lr": 0.02, "weight_decay": weight_decay}
    for dtype in (torch.bfloat16, torch.float32):
        xs = [p.detach().to(dtype) for p in params((8, 4), (3, 5), seed=1)]
        updates = [p.grad.to(dtype) for p in params((8, 4), (3, 5), seed=2)]
        one_by_one = [x.clone() for x in xs]
        for x, u in zip(one_by_one, updates):
            decoupled_apply(x, u, {}, group, 0.7)
        decoupled_apply_all(xs, updates, group, 0.7)
        assert all(torch.equal(a, b) for a, b in zip(xs, one_by_one)), dtype
