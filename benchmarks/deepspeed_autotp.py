"""DeepSpeed's own AutoTP on CPU ranks over gloo: how far Muon's update moves between tp=1 and tp=2.

The published measurement (DeepSpeed's Muon under `tensor_parallel.autotp_size`): a one-layer Llama,
hidden 256, 8 heads of 32, intermediate 512, vocabulary 128, fp32, ZeRO-1, Muon lr 0.05 momentum
0.95, the same seed and batch on both sides, one step; the update of
model.layers.0.self_attn.q_proj.weight with the tp=2 shards concatenated in rank order differs from
the tp=1 update by 0.39 (relative), cosine 0.936, norms 0.0145 (tp=1) and 0.0161 (tp=2).

This script runs that experiment through DeepSpeed itself: `deepspeed.initialize` on 1 and on 2
CPU processes (gloo), the second with {"tensor_parallel": {"autotp_size": 2}}, and prints, for every
projection of the block, the relative difference and cosine between the two updates, next to the
published figures and to the harness's own FP64 per-shard figures (reports/tp_dependence.json,
one Gaussian gradient rather than a training step's, so a like-for-like kernel figure, not the same
number). Column-parallel projections (q, k, v, gate, up) are concatenated on dim 0, row-parallel
ones (o, down) on dim 1, as AutoTP splits them.

Needs deepspeed and transformers (`pip install -e '.[peers]' transformers`). DeepSpeed's CPU
accelerator JIT-compiles a shared-memory all-reduce (deepspeed/comm/torch.py, `build_shm_op`, called
when its TorchBackend starts) unless told otherwise; that op serves only `inference_all_reduce`, whose
own fallback, when the op is absent, is torch.distributed.all_reduce. By default this script starts
DeepSpeed without it, so every collective goes over gloo; `--shm` builds it (set
TORCH_EXTENSIONS_DIR to a directory that persists, so that it compiles once). Likewise the Adam half of
DeepSpeed's Muon (embeddings, norms, lm_head) would JIT-compile FusedAdam; the config's `torch_adam`
option gives it torch.optim.AdamW instead, which leaves the Muon half, whose update is measured, as it is.

    python benchmarks/deepspeed_autotp.py [--seed 0] [--steps 1] [--shm] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = {"q": {"rel_diff": 0.39, "cosine": 0.936, "norm_tp1": 0.0145, "norm_tp2": 0.0161}}
"""The published tp=1 vs tp=2 figures for q_proj (one training step)."""
PROJECTIONS = {"q": ("self_attn.q_proj", 0), "k": ("self_attn.k_proj", 0), "v": ("self_attn.v_proj", 0),
               "o": ("self_attn.o_proj", 1), "gate": ("mlp.gate_proj", 0), "up": ("mlp.up_proj", 0),
               "down": ("mlp.down_proj", 1)}
"""matrix -> (module under model.layers.0, the dim AutoTP splits: 0 column-parallel, 1 row-parallel)."""
LLAMA = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=8, num_hidden_layers=1,
             intermediate_size=512, vocab_size=128)
BATCH, SEQUENCE = 2, 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, seed: int, steps: int, shm: bool, out: str) -> None:
    """One rank: build the model from the seed, one DeepSpeed engine (AutoTP when world > 1), `steps`
    steps on one fixed batch; saves each projection's local weight before and after, and the loss."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")  # CPU ranks even where a GPU is visible
    import deepspeed
    import transformers

    if not shm:  # the module, not the package's attribute `torch` (which is torch itself)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**LLAMA)).float()
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1},
              "optimizer": {"type": "Muon", "params": {"lr": 0.05, "momentum": 0.95, "torch_adam": True}}}
    if world > 1:
        config["tensor_parallel"] = {"autotp_size": world}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    layer = engine.module.model.layers[0]
    before = {k: layer.get_submodule(m).weight.detach().clone() for k, (m, _) in PROJECTIONS.items()}
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, LLAMA["vocab_size"], (BATCH, SEQUENCE), generator=generator)
    losses = []
    for _ in range(steps):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    after = {k: layer.get_submodule(m).weight.detach().clone() for k, (m, _) in PROJECTIONS.items()}
    torch.save({"before": before, "after": after, "losses": losses}, f"{out}/rank{rank}.pt")


def run(world: int, seed: int, steps: int, shm: bool) -> list[dict]:
    """Every rank's saved tensors of one run on `world` CPU processes."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, _free_port(), seed, steps, shm, out), nprocs=world,
                           start_method="spawn")
        return [torch.load(f"{out}/rank{r}.pt") for r in range(world)]


def compare(tp1: list[dict], tp2: list[dict]) -> dict[str, dict[str, float]]:
    """Per projection: the tp=2 update (shards concatenated in rank order on AutoTP's split dim) vs tp=1."""
    rows = {}
    for name, (_, dim) in PROJECTIONS.items():
        one = (tp1[0]["after"][name] - tp1[0]["before"][name]).double()
        two = torch.cat([(r["after"][name] - r["before"][name]).double() for r in tp2], dim=dim)
        start = torch.cat([r["before"][name] for r in tp2], dim=dim)
        rows[name] = {"rel_diff": float((two - one).norm() / one.norm()),
                      "cosine": float((two * one).sum() / (two.norm() * one.norm())),
                      "norm_tp1": float(one.norm()), "norm_tp2": float(two.norm()),
                      "same_start": bool(torch.equal(start, tp1[0]["before"][name]))}
    return rows


def ours() -> dict[str, float]:
    """The harness's FP64 per_shard figure at tp=2 for each matrix (reports/tp_dependence.json)."""
    stored = json.loads((ROOT / "reports" / "tp_dependence.json").read_text())
    return {r["matrix"]: r["rel_diff"] for r in stored["rows"] if r["tp"] == 2 and r["mode"] == "per_shard"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--shm", action="store_true", help="build and use DeepSpeed's shared-memory all-reduce")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    tp1, tp2 = run(1, args.seed, args.steps, args.shm), run(2, args.seed, args.steps, args.shm)
    rows, kernel = compare(tp1, tp2), ours()
    print(f"loss tp=1 {tp1[0]['losses']}  tp=2 {[r['losses'] for r in tp2]}")
    print(f"{'matrix':7}{'split':>6}{'rel diff':>10}{'cosine':>9}{'|u| tp1':>10}{'|u| tp2':>10}"
          f"{'published':>18}{'ours (FP64 kernel)':>20}")
    for name, row in rows.items():
        pub = PUBLISHED.get(name)
        pub_text = f"{pub['rel_diff']:.2f} / {pub['cosine']:.3f}" if pub else "-"
        print(f"{name:7}{PROJECTIONS[name][1]:>6}{row['rel_diff']:>10.3f}{row['cosine']:>9.3f}{row['norm_tp1']:>10.4f}"
              f"{row['norm_tp2']:>10.4f}{pub_text:>18}{kernel.get(name, float('nan')):>20.3f}"
              + ("" if row["same_start"] else "   (initial weights differ!)"))
    if args.json:
        stored = {"command": " ".join(["python benchmarks/deepspeed_autotp.py", *(argv or sys.argv[1:])]),
                  "versions": {name: metadata.version(name) for name in ("deepspeed", "transformers", "torch")},
                  "settings": {**LLAMA, "seed": args.seed, "steps": args.steps, "shm": args.shm},
                  "losses": {"tp1": tp1[0]["losses"], "tp2": [r["losses"] for r in tp2]},
                  "rows": rows, "published": PUBLISHED, "ours_fp64_kernel": kernel}
        args.json.write_text(json.dumps(stored, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
