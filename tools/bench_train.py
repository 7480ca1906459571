"""Training-step benchmark: our real train step (GenerativeRetriever.loss_fn + AdamW with gradient clipping,
jit, data-parallel mesh over the local devices) beside a plain transformers PyTorch `T5ForConditionalGeneration`
step with `torch.optim.AdamW` and `clip_grad_norm_` on the same shapes, the same weights, in the same process:
both warmed up, both on all CPU cores (XLA's thread pool and `torch.set_num_threads(os.cpu_count())`), timed in
alternating rounds (best round of each), inside `host_memory.reuse_freed_memory()` as `trainer.fit` runs it.
Also our step with glibc's default malloc settings (timed before, in the same process: the first config of a
run only) and the page faults per step. On an
accelerator: model-FLOPs utilisation (XLA's FLOP count / step time / the device's peak). Appends a section to
BENCHMARKS.md.

    python tools/bench_train.py                               # tiny and t5_small on CPU, vs PyTorch
    python tools/bench_train.py --configs t5_base --dtype bfloat16 --batch 128 --no_torch   # a GPU run (MFU ≥ 40%)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import host_memory
from gr_jax.cli import setup_logging
from gr_jax.models import convert, t5
from gr_jax.models.retriever import GenerativeRetriever
from gr_jax.training import partitioning, trainer

ROOT = Path(__file__).resolve().parents[1]

# dense bf16 peak FLOP/s per device, for MFU (vendor datasheets)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5e": 197e12}


def peak_flops(device) -> float | None:
    kind = getattr(device, "device_kind", "")
    for name, peak in PEAK_BF16.items():
        if name.lower() in kind.lower():
            return peak
    return None


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _round(contender, steps: int) -> tuple[float, float]:
    """(seconds per step, minor page faults per step) of `steps` steps back to back, then waiting for the
    result (as `trainer.fit` runs them: it blocks only at log steps)."""
    f0, t0 = _faults(), time.perf_counter()
    for _ in range(steps):
        contender()
    contender.wait()
    return (time.perf_counter() - t0) / steps, (_faults() - f0) / steps


class Ours:
    def __init__(self, config, batch: dict, lr: float):
        model = GenerativeRetriever(config)
        mesh = partitioning.make_mesh(1)
        params = model.init_params(0)
        # a copy: on the CPU device_get can return views of the device buffers, and a buffer with a view cannot
        # be donated to the step (each step would then allocate the whole state afresh)
        self.params_np = jax.tree_util.tree_map(lambda x: np.array(x, copy=True), params["network"])
        params = jax.device_put(params, partitioning.param_shardings(model.param_axes(params), mesh))
        tx = trainer.make_optimizer(learning_rate=lr)  # AdamW, weight decay 0.01, clip_norm 1.0
        self.state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": jax.jit(tx.init)(params),
                      "nonfinite": jnp.zeros((), jnp.int32)}
        self.batch = jax.device_put(batch, partitioning.batch_sharding(mesh))
        self.step = jax.jit(trainer.make_train_step(model.loss_fn, tx), donate_argnums=(0,))
        self.key = jax.random.PRNGKey(0)
        compiled = self.step.lower(self.state, self.batch, self.key).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        self.flops = float(cost.get("flops", 0.0)) if cost else 0.0
        self.params_count = t5.param_count(params)

    def __call__(self):
        self.state, _ = self.step(self.state, self.batch, self.key)

    def wait(self):
        jax.block_until_ready(self.state)


class Theirs:
    """transformers' T5 on the same weights, one optimizer step as a PyTorch training loop writes it."""

    def __init__(self, config, params_np, batch: dict, lr: float):
        import torch

        from gr_jax.models.parity import load_torch_t5

        torch.set_num_threads(os.cpu_count() or 1)
        with tempfile.TemporaryDirectory() as tmp:
            convert.save_hf(params_np, config, Path(tmp) / "hf")
            self.model = load_torch_t5(Path(tmp) / "hf")
        self.model.train()
        self.torch = torch
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.inputs = torch.as_tensor(batch["inputs"], dtype=torch.long)
        self.labels = torch.as_tensor(batch["targets"], dtype=torch.long)

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        out = self.model(input_ids=self.inputs, attention_mask=self.inputs != 0, labels=self.labels)
        out.loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()

    def wait(self):  # eager: every step has finished when it returns
        pass


def bench(config_name: str, batch: int, inputs: int, targets: int, dtype: str, steps: int, warmup: int,
          rounds: int, with_torch: bool) -> dict:
    config = t5.get_config(config_name, dtype=dtype, dropout_rate=0.0)
    rng = np.random.default_rng(0)
    data = {"inputs": rng.integers(3, config.vocab_size, (batch, inputs)).astype(np.int32),
            "targets": rng.integers(3, config.vocab_size, (batch, targets)).astype(np.int32)}
    ours = Ours(config, data, lr=1e-4)
    theirs = Theirs(config, ours.params_np, data, lr=1e-4) if with_torch else None
    best = {"ours": (np.inf, 0.0), "ours_default_malloc": (np.inf, 0.0), "torch": (np.inf, 0.0)}
    # glibc's settings cannot be put back to their initial (adaptive) state once changed, so the step with the
    # default settings is timed first, before any reuse_freed_memory() block of this process.
    default_first = not host_memory.ever_set()
    for _ in range(warmup):
        ours()
    ours.wait()
    for _ in range(rounds if default_first else 0):
        best["ours_default_malloc"] = min(best["ours_default_malloc"], _round(ours, steps))
    with host_memory.reuse_freed_memory():
        for _ in range(warmup):
            ours()
            if theirs is not None:
                theirs()
        ours.wait()
        for _ in range(rounds):  # alternating rounds: a 2-core machine has noisy neighbours
            best["ours"] = min(best["ours"], _round(ours, steps))
            if theirs is not None:
                best["torch"] = min(best["torch"], _round(theirs, steps))
    dt, faults = best["ours"]
    peak = peak_flops(jax.devices()[0])
    n_dev = jax.device_count()
    row = {"config": config_name, "dtype": dtype, "params_m": ours.params_count / 1e6, "batch": batch,
           "inputs": inputs, "targets": targets, "ms_per_step": dt * 1e3,
           "ms_per_step_default_malloc": best["ours_default_malloc"][0] * 1e3 if default_first else None,
           "faults_per_step": faults,
           "faults_per_step_default_malloc": best["ours_default_malloc"][1] if default_first else None,
           "tokens_per_s": batch * (inputs + targets) / dt, "xla_gflop_per_step": ours.flops / 1e9,
           "mfu": (ours.flops / dt) / (peak * n_dev) if peak and ours.flops else None,
           "device": f"{n_dev}× {jax.devices()[0].device_kind}", "threads": os.cpu_count(),
           "dispatch": "async" if jax.config.read("jax_cpu_enable_async_dispatch") else "sync"}
    if theirs is not None:
        row.update(torch_ms_per_step=best["torch"][0] * 1e3, torch_faults_per_step=best["torch"][1],
                   speedup_vs_torch=best["torch"][0] / dt)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny,t5_small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=0, help="steps per timed round (default: 20 tiny, 3 others)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch step (e.g. on a GPU run)")
    parser.add_argument("--sync_dispatch", action="store_true",
                        help="CPU: run each step on the calling thread (jax_cpu_enable_async_dispatch off), so that "
                             "glibc serves even temporaries of hundreds of MiB from the heap kept by host_memory; "
                             "with --no_torch (PyTorch's step, alternating in the same heap, fragments it)")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    if args.sync_dispatch:  # read when JAX creates its CPU client, i.e. before the first computation
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    with_torch = not args.no_torch
    if with_torch:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            sys.stderr.write("torch/transformers not installed: PyTorch step skipped\n")
            with_torch = False
    rows = [bench(c, args.batch, args.inputs, args.targets, args.dtype,
                  args.steps or (20 if c.endswith("tiny") else 3), args.warmup, args.rounds, with_torch)
            for c in args.configs.split(",")]
    for r in rows:
        sys.stdout.write(json.dumps(r) + "\n")
    if not args.no_write:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        fmt = lambda v: "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
        import importlib.metadata as md

        versions = ", ".join(f"{p} {md.version(p)}" for p in ("jax", "torch", "transformers")
                             if _installed(md, p))
        with (ROOT / "BENCHMARKS.md").open("a") as f:
            f.write(f"\n## bench_train — {datetime.date.today().isoformat()}\n\n- command: `python tools/bench_train.py "
                    f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n- versions: {versions}\n\n| "
                    + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
                    + "".join("| " + " | ".join(fmt(r.get(k)) for k in keys) + " |\n" for r in rows))
    return 0


def _installed(md, package: str) -> bool:
    try:
        md.version(package)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
