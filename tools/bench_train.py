"""Training-step benchmark: our real train step (GenerativeRetriever.loss_fn + AdamW with gradient clipping,
jit, data-parallel mesh over the local devices) beside a plain transformers PyTorch `T5ForConditionalGeneration`
step with `torch.optim.AdamW` and `clip_grad_norm_` on the same shapes and the same weights.

Each contender runs in a process of its own (so that none shares the other's heap or thread pools), all
started by this one, all warmed up, on all CPU cores (XLA's thread pool; `torch.set_num_threads(os.cpu_count())`),
timed in alternating rounds (best round of each):
  ours              as `python -m gr_jax.train` runs it: synchronous CPU dispatch (`gin_utils.cpu_runtime`) and
                    the loop inside `host_memory.reuse_freed_memory()` (`trainer.fit`);
  ours_jax_default  the same step with JAX's asynchronous dispatch and glibc's default malloc (the library
                    before issue 18);
  torch             transformers' step.
Page faults per step are reported for each. On an accelerator: model-FLOPs utilisation (XLA's FLOP count /
step time / the device's peak; with --scan_layers the count is the unrolled program's, since XLA counts a loop's
body once). Appends a section to BENCHMARKS.md.

    python tools/bench_train.py                               # tiny and t5_small on CPU, vs PyTorch
    python tools/bench_train.py --configs tiny --batch 64 --targets 16        # the demo's shapes
    python tools/bench_train.py --configs t5_base --dtype bfloat16 --batch 128 --no_torch \
        --no_jax_default --scan_layers                                                      # a GPU run (MFU ≥ 40%)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from pathlib import Path

import numpy as np

from gr_jax.runtime import cli

ROOT = Path(__file__).resolve().parents[1]

# dense bf16 peak FLOP/s per device, for MFU (vendor datasheets)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5e": 197e12}


def peak_flops(kind: str) -> float | None:
    for name, peak in PEAK_BF16.items():
        if name.lower() in kind.lower():
            return peak
    return None


def _batch(vocab_size: int, batch: int, inputs: int, targets: int) -> dict:
    rng = np.random.default_rng(0)
    return {"inputs": rng.integers(3, vocab_size, (batch, inputs)).astype(np.int32),
            "targets": rng.integers(3, vocab_size, (batch, targets)).astype(np.int32)}


# ----------------------------------------------------------------------------------------------------------
# the contenders (each in its own process)
# ----------------------------------------------------------------------------------------------------------



def _flops(cost) -> float:
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    return float(cost.get("flops", 0.0)) if cost else 0.0


def _lowered_flops(step, *args) -> float:
    """XLA's FLOP count of `step` on arguments of these shapes, from the lowered program (no compilation): as
    lowered for this backend, else as lowered for the CPU (a GPU's lowering has no cost analysis: 0 on an H100,
    2026-11-27); 0.0 when neither gives one."""
    import jax

    plain = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    for platforms in (None, ("cpu",)):
        flops = _flops(jax.jit(step).trace(*plain).lower(lowering_platforms=platforms).cost_analysis())
        if flops:
            return flops
    return 0.0

class Ours:
    def __init__(self, spec: dict):
        import jax
        import jax.numpy as jnp

        from gr_jax.backbones import t5, t5_convert
        from gr_jax.retriever.model import GenerativeRetriever
        from gr_jax.training import partitioning, trainer

        self.jax = jax
        config = t5.get_config(spec["config"], dtype=spec["dtype"], dropout_rate=0.0)
        model = GenerativeRetriever(config, network=t5.T5(config, scan_layers=spec.get("scan_layers", False)))
        mesh = partitioning.make_mesh(1)
        params = model.init_params(0)
        if spec.get("hf_dir"):  # the weights for the PyTorch contender (copies: a view of a buffer blocks donation)
            t5_convert.save_hf(jax.tree_util.tree_map(np.array, params["network"]), config, spec["hf_dir"])
        params = jax.device_put(params, partitioning.param_shardings(model.param_axes(params), mesh))
        tx = trainer.make_optimizer(learning_rate=1e-4)  # AdamW, weight decay 0.01, clip_norm 1.0
        state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": jax.jit(tx.init)(params),
                 "nonfinite": jnp.zeros((), jnp.int32)}
        scalar = partitioning.replicated(mesh)
        shardings = jax.tree_util.tree_map(lambda x: x.sharding if x.ndim else scalar, state)
        self.state = jax.device_put(state, shardings)
        data = _batch(config.vocab_size, spec["batch"], spec["inputs"], spec["targets"])
        self.batch = jax.device_put(data, partitioning.batch_sharding(mesh))
        # shardings in and out as trainer.fit gives them: the step's outputs feed it again without a recompile
        self.step = jax.jit(trainer.make_train_step(model.loss_fn, tx), donate_argnums=(0,),
                            in_shardings=(shardings, partitioning.batch_sharding(mesh), scalar),
                            out_shardings=(shardings, scalar))
        self.key = jax.random.PRNGKey(0)
        t0 = time.perf_counter()
        compiled = self.step.lower(self.state, self.batch, self.key).compile()
        compile_s = time.perf_counter() - t0
        if spec.get("scan_layers"):  # XLA counts a loop's body once: count the unrolled program's FLOPs instead
            unrolled = GenerativeRetriever(config)
            shapes = jax.eval_shape(unrolled.init_params, 0)
            abstract = {**self.state, "params": shapes, "opt_state": jax.eval_shape(tx.init, shapes)}
            flops = _lowered_flops(trainer.make_train_step(unrolled.loss_fn, tx), abstract, self.batch, self.key)
        else:
            flops = _flops(compiled.cost_analysis()) or _lowered_flops(
                trainer.make_train_step(model.loss_fn, tx), self.state, self.batch, self.key)
        self.info = {"xla_gflop_per_step": flops / 1e9,
                     "params_m": t5.param_count(params) / 1e6, "device_kind": jax.devices()[0].device_kind,
                     "devices": jax.device_count(), "compile_s": compile_s}

    def __call__(self):
        self.state, _ = self.step(self.state, self.batch, self.key)

    def wait(self):  # the trainer blocks only at log steps: steps are timed back to back
        self.jax.block_until_ready(self.state)


class Theirs:
    """transformers' T5 on the same weights, one optimizer step as a PyTorch training loop writes it."""

    def __init__(self, spec: dict):
        import torch

        from gr_jax.backbones.t5_parity import load_torch_t5

        torch.set_num_threads(os.cpu_count() or 1)
        self.model = load_torch_t5(spec["hf_dir"])
        self.model.train()
        self.torch = torch
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01)
        data = _batch(self.model.config.vocab_size, spec["batch"], spec["inputs"], spec["targets"])
        self.inputs = torch.as_tensor(data["inputs"], dtype=torch.long)
        self.labels = torch.as_tensor(data["targets"], dtype=torch.long)
        self.info = {}

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        out = self.model(input_ids=self.inputs, attention_mask=self.inputs != 0, labels=self.labels)
        out.loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()

    def wait(self):  # eager: every step has finished when it returns
        pass


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _round(contender, steps: int) -> dict:
    f0, t0 = _faults(), time.perf_counter()
    for _ in range(steps):
        contender()
    contender.wait()
    return {"s_per_step": (time.perf_counter() - t0) / steps, "faults_per_step": (_faults() - f0) / steps}


def contender_process(name: str, spec: dict) -> int:
    """A child: builds its contender, warms it up, says "ready", then times one round per "round" line."""
    import contextlib

    from gr_jax.runtime import host_memory

    if name == "ours":  # before the first computation, as the entry points do
        host_memory.cpu_dispatch(synchronous=spec["sync_dispatch"])
    with contextlib.ExitStack() as stack:
        if name == "ours":
            stack.enter_context(host_memory.reuse_freed_memory())
        contender = Theirs(spec) if name == "torch" else Ours(spec)
        for _ in range(spec["warmup"]):
            contender()
        contender.wait()
        sys.stdout.write(json.dumps({"ready": name, **contender.info}) + "\n")
        sys.stdout.flush()
        for line in sys.stdin:
            if line.strip() != "round":
                break
            sys.stdout.write(json.dumps(_round(contender, spec["steps"])) + "\n")
            sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------------------------------------
# the driver
# ----------------------------------------------------------------------------------------------------------


class _Child:
    def __init__(self, name: str, spec: dict):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--contender", name, "--spec", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} contender stopped (exit code {self.proc.wait()})")
        return json.loads(line)

    def round(self) -> dict:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def bench(config_name: str, batch: int, inputs: int, targets: int, dtype: str, steps: int, warmup: int,
          rounds: int, with_torch: bool, sync_dispatch: bool, scan_layers: bool = False,
          with_jax_default: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"config": config_name, "batch": batch, "inputs": inputs, "targets": targets, "dtype": dtype,
                "steps": steps, "warmup": warmup, "sync_dispatch": sync_dispatch, "scan_layers": scan_layers,
                "hf_dir": str(Path(tmp) / "hf") if with_torch else None}
        children = [_Child("ours", spec)]
        if with_jax_default:
            children.append(_Child("ours_jax_default", {**spec, "hf_dir": None}))
        if with_torch:
            children.append(_Child("torch", spec))
        best = {c.name: {"s_per_step": np.inf, "faults_per_step": 0.0} for c in children}
        try:
            for _ in range(rounds):  # alternating rounds: a 2-core machine has noisy neighbours
                for c in children:
                    r = c.round()
                    if r["s_per_step"] < best[c.name]["s_per_step"]:
                        best[c.name] = r
        finally:
            for c in children:
                c.close()
    info = children[0].info
    dt = best["ours"]["s_per_step"]
    peak = peak_flops(info["device_kind"])
    row = {"config": config_name, "dtype": dtype, "params_m": info["params_m"], "batch": batch, "inputs": inputs,
           "targets": targets, "dispatch": "sync" if sync_dispatch else "async", "ms_per_step": dt * 1e3,
           "faults_per_step": best["ours"]["faults_per_step"],
           "tokens_per_s": batch * (inputs + targets) / dt, "xla_gflop_per_step": info["xla_gflop_per_step"],
           "mfu": (info["xla_gflop_per_step"] * 1e9 / dt) / (peak * info["devices"]) if peak else None,
           "device": f"{info['devices']}× {info['device_kind']}", "threads": os.cpu_count(),
           "scan_layers": scan_layers, "compile_s": info["compile_s"]}
    if with_jax_default:
        row.update(jax_default_ms_per_step=best["ours_jax_default"]["s_per_step"] * 1e3,
                   jax_default_faults_per_step=best["ours_jax_default"]["faults_per_step"])
    if with_torch:
        row.update(torch_ms_per_step=best["torch"]["s_per_step"] * 1e3,
                   torch_faults_per_step=best["torch"]["faults_per_step"],
                   speedup_vs_torch=best["torch"]["s_per_step"] / dt)
    return row


def main(argv=None) -> int:
    from gr_jax.backbones.t5 import _DTYPES, CONFIGS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny,t5_small", type=cli.name_list(sorted(CONFIGS), "T5 config"))
    parser.add_argument("--batch", type=cli.count, default=32)
    parser.add_argument("--inputs", type=cli.count, default=64)
    parser.add_argument("--targets", type=cli.count, default=8)
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    parser.add_argument("--steps", type=cli.natural, default=0, help="steps per timed round (default: 20 tiny, 3 others)")
    parser.add_argument("--rounds", type=cli.count, default=5)
    parser.add_argument("--warmup", type=cli.natural, default=3)
    parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch step (e.g. on a GPU run)")
    parser.add_argument("--scan_layers", action="store_true",
                        help="T5's layers in one scanned body per stack (compiles in a fraction of the time)")
    parser.add_argument("--no_jax_default", action="store_true",
                        help="skip the 'ours_jax_default' contender (it differs only in CPU dispatch: e.g. a GPU run)")
    parser.add_argument("--async_dispatch", action="store_true",
                        help="'ours' with JAX's asynchronous CPU dispatch instead of the entry points' synchronous one")
    parser.add_argument("--no_write", action="store_true")
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # a child process: which contender
    parser.add_argument("--spec", help=argparse.SUPPRESS)  # a child process: its settings as JSON
    args = parser.parse_args(argv)
    if args.contender:
        return contender_process(args.contender, json.loads(args.spec))
    from gr_jax.runtime.cli import setup_logging

    setup_logging()
    with_torch = not args.no_torch
    if with_torch:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            sys.stderr.write("torch/transformers not installed: PyTorch step skipped\n")
            with_torch = False
    rows = [bench(c, args.batch, args.inputs, args.targets, args.dtype,
                  args.steps or (20 if c.endswith("tiny") else 3), args.warmup, args.rounds, with_torch,
                  not args.async_dispatch, args.scan_layers, not args.no_jax_default)
            for c in args.configs]
    for r in rows:
        sys.stdout.write(json.dumps(r) + "\n")
    if not args.no_write:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        fmt = lambda v: "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
        import importlib.metadata as md

        versions = ", ".join(f"{p} {md.version(p)}" for p in ("jax", "torch", "transformers") if _installed(md, p))
        from gr_jax.evaluation.report import benchmark_writer

        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_train") as f:
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
