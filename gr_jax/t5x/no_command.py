"""Imported by configs/runs/none/t5x_run.gin: a t5x gin file of ours read outside `python -m t5x.train`, `t5x.eval`
or `t5x.infer` (or `t5x.main --run_mode=...`), which choose its run tier. Stops with what to run instead."""

from gr_jax.t5x.models import T5xAdapterError

raise T5xAdapterError("this gin file is a t5x run of a gr_jax model: read it with python -m t5x.train, t5x.eval or "
                      "t5x.infer (each includes its own run tier, gr_jax/t5x/configs/runs/<command>/t5x_run.gin); "
                      "for python -m gr_jax.<command> pass the experiment file itself (e.g. "
                      "experiments/demo/dsi_atomic.gin)")
