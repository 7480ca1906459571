"""t5x's train step against ours, on the same model, optimizer and batch, in one process (needs t5x: README).

The system is what an experiment file builds (default: the demo's DSI, experiments/demo/dsi_atomic.gin, a tiny T5
with batch 64). Contenders, each compiled and warmed up, then timed in alternating rounds (best round of each):
  ours  `trainer.make_train_step` (the step `python -m gr_jax.train` runs) under `jax.jit` with our shardings;
  t5x   t5x's `Trainer._partitioned_train_step` (the step `python -m t5x.train` runs) over `models.RetrieverModel`,
        partitioned by t5x's `PjitPartitioner`.
Both run with JAX's default (asynchronous) dispatch, the t5x entry point's setting; `python -m gr_jax.train`
dispatches synchronously on CPU, which bench_train.py measures. The two steps compute the same update
(tests/t5x/test_adapter.py); the difference is each loop's bookkeeping (t5x's metrics and train-state objects, our
NaN guard). With `--infer`: retrieval of one batch of 32 dev queries instead — ours is `model.rank` (what
`python -m gr_jax.infer` runs per batch: the jitted search, the beams' documents fetched, the ranker), t5x's is
`RetrieverModel.predict_batch_with_aux` partitioned by t5x's `PjitPartitioner` as `t5x.infer` / `t5x.eval` run it
(the traced search, the ranker through `jax.pure_callback`), results fetched. Replaces its section of BENCHMARKS.md.

    python tools/bench_t5x.py
    python tools/bench_t5x.py --experiment experiments/demo/pag.gin
    python tools/bench_t5x.py --infer [--experiment experiments/demo/pag.gin]
    python tools/bench_t5x.py --gin "t5.get_config.name = 't5_base'" --gin "BATCH_SIZE = 128"   # T5-base (a GPU)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

from gr_jax.runtime import cli

ROOT = Path(__file__).resolve().parents[1]


def timed(step, state, batch, steps: int):
    t0 = time.perf_counter()
    for _ in range(steps):
        state = step(state, batch)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - t0) / steps


def bench(experiment: str, steps: int, warmup: int, rounds: int, bindings=()) -> dict:
    import gin
    from t5x import partitioning as t5x_partitioning
    from t5x import trainer as t5x_trainer
    from t5x import utils as t5x_utils

    from gr_jax.runtime import gin_utils
    from gr_jax.t5x.data import BatchIterator
    from gr_jax.t5x.models import RetrieverModel
    from gr_jax.training import partitioning, trainer

    with tempfile.TemporaryDirectory() as tmp:
        gin_utils.parse([experiment], [f"MODEL_DIR = '{tmp}/run'", *bindings])
        model = RetrieverModel()
        batches = BatchIterator(model.setup.iterator)
        batch = next(batches)
        tx = model.optimizer_def.optax_optimizer

        # ours
        mesh = partitioning.make_mesh(1)
        params = model.setup.model.init_params(model.seed)
        state, shardings, _ = trainer._initial_state(model.setup.model, params, tx, mesh)
        scalar = partitioning.replicated(mesh)
        ours_step = jax.jit(trainer.make_train_step(model.setup.model.loss_fn, tx),
                            in_shardings=(shardings, partitioning.batch_sharding(mesh), scalar),
                            out_shardings=(shardings, scalar), donate_argnums=(0,))
        key = jax.random.PRNGKey(1)
        ours = lambda s, b: ours_step(s, b, key)[0]  # noqa: E731

        # t5x
        partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
        shapes = {k: v.shape for k, v in batches.element_spec.items()}
        types = {k: v.dtype for k, v in batches.element_spec.items()}
        init = t5x_utils.TrainStateInitializer(model.optimizer_def, model.get_initial_variables, shapes,
                                               partitioner, input_types=types)
        t5x_state = init.from_scratch(jax.random.PRNGKey(0))
        loop = t5x_trainer.Trainer(model, t5x_state, partitioner, eval_names=[], summary_dir=None,
                                   train_state_axes=init.train_state_axes, rng=jax.random.PRNGKey(0),
                                   learning_rate_fn=lambda step: 1.0, num_microbatches=None)
        t5x_step = loop._partitioned_train_step
        t5x = lambda s, b: t5x_step(s, b)[0]  # noqa: E731

        states = {"ours": state, "t5x": t5x_state}
        fns = {"ours": ours, "t5x": t5x}
        best = {name: float("inf") for name in fns}
        for name, fn in fns.items():
            states[name], _ = timed(fn, states[name], batch, max(warmup, 1))
        for _ in range(rounds):
            for name, fn in fns.items():
                states[name], seconds = timed(fn, states[name], batch, steps)
                best[name] = min(best[name], seconds)
        gin.clear_config()
    leaves = jax.tree_util.tree_leaves(params)
    return {"experiment": experiment, "bindings": "; ".join(bindings), "model": type(model.setup.model).__name__,
            "params_m": round(sum(x.size for x in leaves) / 1e6, 3),
            "batch": {k: list(v.shape) for k, v in batch.items()}, "device": f"{jax.device_count()}× "
            f"{jax.devices()[0].platform}", "ours_ms_per_step": round(best["ours"] * 1e3, 2),
            "t5x_ms_per_step": round(best["t5x"] * 1e3, 2), "t5x_over_ours": round(best["t5x"] / best["ours"], 3)}


def bench_infer(experiment: str, steps: int, warmup: int, rounds: int, bindings=()) -> dict:
    import gin
    import numpy as np
    from t5x import partitioning as t5x_partitioning
    from t5x import utils as t5x_utils

    from gr_jax.runtime import gin_utils
    from gr_jax.t5x import system_task
    from gr_jax.t5x.models import RetrieverModel

    with tempfile.TemporaryDirectory() as tmp:
        gin_utils.parse([experiment], [f"MODEL_DIR = '{tmp}/run'", *bindings])
        model = RetrieverModel()  # the system built as t5x.train builds it; parameters from SEED
        ex = system_task.split_examples(model.setup, "dev")
        L = model.setup.feature_lengths["inputs"]
        q = np.zeros((32, L), np.int32)
        for i, row in enumerate(ex["inputs"][:32]):
            q[i, :len(row)] = row
        batch = {"inputs": q, "targets": np.zeros((32, model.setup.feature_lengths["targets"]), np.int32)}
        params = model.setup.model.init_params(model.seed)
        index, beams = model.setup.index, model.num_beams
        ours = lambda: model.setup.model.rank(params, q, index, beams)  # noqa: E731

        partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
        init = t5x_utils.TrainStateInitializer(None, model.get_initial_variables,
                                               {k: v.shape for k, v in batch.items()}, partitioner)
        t5x_params = init.from_scratch(jax.random.PRNGKey(0)).params
        step = partitioner.partition(model.predict_batch_with_aux,
                                     in_axis_resources=(init.train_state_axes.params, partitioner.data_partition_spec),
                                     out_axis_resources=None)
        t5x = lambda: jax.device_get(step(t5x_params, batch))  # noqa: E731

        fns = {"ours": ours, "t5x": t5x}
        best = {name: float("inf") for name in fns}
        for fn in fns.values():
            for _ in range(max(warmup, 1)):
                fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(steps):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / steps)
        gin.clear_config()
    return {"experiment": experiment, "model": type(model.setup.model).__name__, "queries": 32, "beams": beams,
            "documents": len(model.setup.dataset.corpus), "device": f"{jax.device_count()}× "
            f"{jax.devices()[0].platform}", "ours_ms_per_batch": round(best["ours"] * 1e3, 2),
            "t5x_ms_per_batch": round(best["t5x"] * 1e3, 2), "t5x_over_ours": round(best["t5x"] / best["ours"], 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="experiments/demo/dsi_atomic.gin")
    parser.add_argument("--steps", type=cli.count, default=20, help="steps per timed round")
    parser.add_argument("--warmup", type=cli.natural, default=3)
    parser.add_argument("--rounds", type=cli.count, default=5)
    parser.add_argument("--infer", action="store_true", help="retrieval of a batch instead of a train step")
    parser.add_argument("--gin", action="append", default=[],
                        help="a gin binding added after the experiment file (e.g. \"t5.get_config.name = 't5_base'\")")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    from gr_jax.runtime.cli import setup_logging

    setup_logging()
    try:
        import gr_jax.t5x  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    row = (bench_infer if args.infer else bench)(args.experiment, args.steps, args.warmup, args.rounds, args.gin)
    sys.stdout.write(json.dumps(row) + "\n")
    if not args.no_write:
        keys = list(row)
        from gr_jax.evaluation.report import benchmark_writer

        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_t5x") as f:
            f.write(f"\n## bench_t5x — {datetime.date.today().isoformat()}\n\n- command: `python tools/bench_t5x.py "
                    f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n| " + " | ".join(keys) + " |\n|"
                    + "---|" * len(keys) + "\n| " + " | ".join(str(row[k]) for k in keys) + " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
