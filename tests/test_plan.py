"""optimizers/plan.py: the parameters a plan steps, the digest the ranks agree on, and the rehearsal's meta stand-ins
(it runs a step on meta tensors laid out as the real ones)."""

from __future__ import annotations

import pytest
import torch

from optimizers import Muon, plan


@pytest.mark.parametrize("algorithm", ["muon", "normuon", "dion2"])
def test_an_empty_parameter_with_a_gradient_is_stepped_over(algorithm):
    """A parameter of no elements (a 0 x 10 matrix, a 6 x 0 one) is left out of the plan: it gets no state and the
    step does not fail (a megabatch of empty matrices cannot be reshaped); the others step as without it."""
    def step(with_empty):
        g = torch.Generator().manual_seed(0)
        full = torch.nn.Parameter(torch.randn(6, 10, generator=g))
        empty = [torch.nn.Parameter(torch.zeros(0, 10)), torch.nn.Parameter(torch.zeros(6, 0))] if with_empty else []
        for p in [full, *empty]:
            p.grad = torch.ones_like(p)
        opt = Muon([full, *empty], lr=0.1, algorithm=algorithm)
        opt.step()
        assert all(p not in opt.state for p in empty)
        return full.detach()
    assert torch.equal(step(True), step(False))


def test_the_direct_apply_threshold_is_the_documented_one():
    """Parameters of 2^22 elements or more apply a half-precision result directly (docs/gpu-speed.md): a measured
    choice the docs quote, so a changed one is a failing test and a CHANGELOG entry (the step's bits are the same
    either side of it)."""
    assert plan.DIRECT_APPLY_NUMEL == 2**22


def test_the_digest_is_a_distinct_nonnegative_63_bit_int():
    """plan.digest of a fingerprint: an int in [0, 2^63), so that it and its negation fit the int64 all-reduce of
    the ranks' agreement (optimizers/agreement.py); distinct fingerprints give distinct digests."""
    entries = [[(0, i, (i + 1, 3), "torch.float32", "()", True)] for i in range(32)]
    digests = [plan.digest(e) for e in entries]
    assert all(type(d) is int and 0 <= d < 2**63 for d in digests)
    assert len(set(digests)) == len(digests)
    assert max(digests) >= 2**61  # the high bits are used: a digest is not a small number
    assert plan.digest(list(entries[3])) == digests[3]
    torch.tensor([d for x in digests for d in (x, -x)], dtype=torch.int64)


def views() -> list[torch.Tensor]:
    block = torch.zeros(10, 12)
    return [block[2:5, 3:9], block.mT[1:], block, block[4], torch.zeros(0, 3), torch.zeros(3, 4, 5)[:, 1:, ::2]]


@pytest.mark.parametrize("index", range(len(views())))
def test_a_meta_stand_in_has_the_views_layout_and_a_storage_that_spans_exactly_it(index):
    """`_meta(t)`: t's shape, strides, dtype and storage offset, on a storage of offset + span elements (span: 1 +
    sum((n - 1) * stride), 0 for an empty tensor), the least that holds it: the same layout on a real storage of
    that size is accepted, one element fewer is refused (meta tensors check no bounds, the CPU does)."""
    t = views()[index]
    m = plan._meta(t)
    assert (m.device.type, m.shape, m.stride(), m.storage_offset(), m.dtype) == (
        "meta", t.shape, t.stride(), t.storage_offset(), t.dtype)
    size = m.untyped_storage().nbytes() // m.element_size()
    torch.empty(size).as_strided(t.shape, t.stride(), t.storage_offset())
    if t.numel():
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.empty(size - 1).as_strided(t.shape, t.stride(), t.storage_offset())
    else:
        assert size == 0


def test_rows_of_one_contiguous_block_stand_in_as_rows_of_one_meta_block():
    """`_meta_row`: rows of a contiguous block (momentum_block's buffers) are the same rows of one meta block, so a
    megabatch's stand-ins are a block too; a row of a non-contiguous base, or a tensor that is no view, is a
    `_meta` of its own."""
    block = torch.zeros(4, 6, 8)
    blocks: dict[int, torch.Tensor] = {}
    rows = [plan._meta_row(block[i], blocks) for i in (1, 3)]
    assert list(blocks) == [id(block)] and blocks[id(block)].shape == block.shape
    for i, row in zip((1, 3), rows):
        assert row._base is blocks[id(block)]  # (a meta storage's data_ptr is 0 for all)
        assert (row.shape, row.stride(), row.storage_offset()) == (block[i].shape, block[i].stride(), i * 48)
    # a block placed at offset 16: its row 1 (at 64) is at 48 in a meta block at offset 0 (64 - 16, not 64 ^ 16)
    placed = torch.empty(0).set_(torch.zeros(256).untyped_storage(), 16, (4, 6, 8))
    assert plan._meta_row(placed[1], {}).storage_offset() == 48
    by_columns = torch.empty_strided((4, 6, 8), (1, 32, 4))  # a block whose rows are not contiguous
    fresh = torch.zeros(6, 8)
    for t in (by_columns[2], fresh):
        row = plan._meta_row(t, blocks)
        assert (row.shape, row.stride(), row.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
        assert row._base is not blocks[id(block)]
    assert list(blocks) == [id(block)]


def test_a_momentum_block_is_made_only_for_a_key_of_the_parameters_shape():
    """plan.momentum_block makes the rows of one zero block the state `key` of a megabatch without state, only where
    the algorithm's state holds `key` itself shaped like the parameter: not for a key of another shape, though
    keys named before and after it (by sort order) are the parameter's shape, and not for a key shaped like a prefix of it."""
    from types import SimpleNamespace

    from optimizers.algorithms.base import StateKey, parameter_shape

    params = tuple(torch.zeros(4, 6) for _ in range(3))
    batch = plan.Megabatch((4, 6), params, None)

    def made(*keys):
        state = {p: {} for p in params}
        plan.momentum_block("m", SimpleNamespace(state=keys), {}, batch, state)
        return [sorted(s) for s in state.values()]
    assert made(StateKey("m", parameter_shape)) == [["m"]] * 3
    assert made(StateKey("a", parameter_shape), StateKey("m", lambda shape, group: shape[:1]),
                StateKey("z", parameter_shape)) == [[]] * 3
    assert made(StateKey("m", lambda shape, group: shape[:1] + (5,))) == [[]] * 3
    assert made(StateKey("m", None)) == [[]] * 3


def test_the_cache_key_changes_exactly_with_what_a_plan_depends_on():
    """plan.cache_key: a changed option (not lr or weight_decay), a gradient's presence or kind, a replaced state
    tensor, or a step count turned invalid changes the key; lr, weight_decay, new gradient values and a step count
    counting on (any int >= 0) do not. A parameter without a gradient has a key too."""
    p, q = torch.zeros(4, 6), torch.zeros(4, 6)
    p.grad = torch.ones(4, 6)
    group = {"params": [p, q], "momentum": 0.95, "lr": 0.1, "weight_decay": 0.0, "betas": [0.9, 0.95],
             "variance_eps": 1e-8}  # options named before and after "params"
    buffer = torch.zeros(4, 6)

    def key(step=3, **changes):
        return plan.cache_key([{**group, **changes}], {p: {"momentum_buffer": buffer, "step": step}})[0]
    base = key()
    built = {"".join(["par", "ams"]) if k == "params" else k: v for k, v in group.items()}  # a run-time "params"
    assert plan.cache_key([built], {p: {"momentum_buffer": buffer, "step": 3}})[0] == base
    for same in (key(lr=0.5, weight_decay=0.1), key(step=0), key(step=7)):
        assert same == base
    p.grad = torch.full((4, 6), 2.0)
    assert key() == base
    for changed in (key(momentum=0.9), key(betas=[0.9, 0.99]), key(variance_eps=0.0), key(step=-1), key(step=1.0), key(step=True),
                    key(params=[p])):
        assert changed != base
    p.grad = torch.ones(4, 6).to_sparse()  # a gradient of another layout
    assert key() != base
    p.grad = None
    assert key() != base
    assert plan.cache_key([group], {p: {"momentum_buffer": torch.zeros(4, 6), "step": 3}})[0] != base


@pytest.mark.parametrize("devices, compiles", [([], False), (["cuda:0"], True), (["cuda:0", "cuda:0"], True), (["cpu"], False),
                                               (["meta"], False), (["cuda:0", "cuda:1"], False),
                                               (["cpu", "cuda:0"], False)])
def test_kernels_are_compiled_ahead_only_for_megabatches_on_one_cuda_device(monkeypatch, devices, compiles):
    """plan.compile_ahead compiles (compile_for) only where the single-process megabatches lie on one CUDA device
    and a group takes kernels there (none where there is no such megabatch); stand-in plans, with kernels taken everywhere, so that the devices decide."""
    from types import SimpleNamespace

    from optimizers import kernels

    monkeypatch.setattr(kernels, "of", lambda fused, t: SimpleNamespace(on=True))
    monkeypatch.setattr(plan, "compile_for", lambda plans, state, device: 7)
    batches = [SimpleNamespace(params=[SimpleNamespace(device=torch.device(d))], layout=None) for d in devices]
    plans = [SimpleNamespace(group={"fused": None}, megabatches=batches)]
    assert plan.compile_ahead(plans, {}) == (7 if compiles else 0)


@pytest.mark.parametrize("record", ["Megabatch", "Paths", "GroupPlan"])
def test_a_plans_records_are_frozen(record):
    """A cached plan is shared by every step that hits its key: its records cannot be changed in place."""
    import dataclasses

    cls = getattr(plan, record)
    fields = dataclasses.fields(cls)
    made = cls(*[None] * len(fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0].name, 1)


def test_a_declared_apply_without_a_foreach_form_applies_parameter_by_parameter():
    """An Apply stage that declares no foreach (nor fused) form is run per parameter, with the bits of the stock
    apply's foreach form."""
    import dataclasses

    from optimizers import MUON
    from optimizers.algorithms.base import decoupled_apply
    from optimizers.algorithms.stages import Apply

    def step(algorithm):
        g = torch.Generator().manual_seed(2)
        ps = [torch.nn.Parameter(torch.randn(6, 10, generator=g)) for _ in range(3)]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        Muon(ps, lr=0.1, weight_decay=0.1, algorithm=algorithm).step()
        return [p.detach() for p in ps]
    plain = dataclasses.replace(MUON, apply=Apply(decoupled_apply))
    assert plain.apply.foreach is None
    assert all(torch.equal(a, b) for a, b in zip(step(plain), step(MUON)))


def test_the_fingerprint_says_which_parameters_have_a_gradient():
    """plan.fingerprint: per parameter (group, index, shape, dtype, placements, has a gradient), in order."""
    p, q = torch.zeros(4, 6), torch.zeros(3)
    p.grad = torch.ones(4, 6)
    assert plan.fingerprint([{"params": [p]}, {"params": [q]}]) == [
        (0, 0, (4, 6), "torch.float32", "()", True), (1, 0, (3,), "torch.float32", "()", False)]


def test_a_parameter_without_a_gradient_does_not_stop_the_ones_after_it():
    """The plan leaves out a parameter without a gradient and steps every later one."""
    ps = [torch.nn.Parameter(torch.ones(4, 6)) for _ in range(3)]
    ps[0].grad, ps[2].grad = torch.ones(4, 6), torch.ones(4, 6)
    Muon(ps, lr=0.1).step()
    assert [bool(torch.equal(p, torch.ones(4, 6))) for p in ps] == [False, True, False]


def test_an_elementwise_group_does_not_stop_the_groups_after_it():
    """A plan of an elementwise group (AdamW) followed by a matrix group steps both."""
    a, m = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(4, 6))
    a.grad, m.grad = torch.ones(5), torch.ones(4, 6)
    Muon([{"params": [a], "algorithm": "adamw"}, {"params": [m]}], lr=0.1).step()
    assert not torch.equal(a, torch.ones(5)) and not torch.equal(m, torch.ones(4, 6))


def test_an_algorithm_switched_in_writes_its_missing_defaults_into_the_group():
    """A group switched to another algorithm between steps takes that algorithm's defaults for the options it
    lacked, written into the live param group once the step has checked every group."""
    p = torch.nn.Parameter(torch.ones(4, 6))
    p.grad = torch.ones(4, 6)
    opt = Muon([p], lr=0.1)
    opt.step()
    assert "beta2" not in opt.param_groups[0]
    opt.param_groups[0]["algorithm"] = "normuon"
    opt.state.clear()
    opt.step()
    assert opt.param_groups[0]["beta2"] == 0.95
