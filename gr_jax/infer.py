"""python -m gr_jax.infer --gin_file=EXPERIMENT.gin --gin_file=runs/infer.gin --gin.MODEL_DIR="'DIR'"
    [--gin.EvalConfig.split="'test'"] [--gin.EvalConfig.num_beams=20] [--gin.CHECKPOINT_STEP=1000]

The split, beams and batch size are the experiment's `EvalConfig` (the command line's over the file's);
EVAL_SPLIT and NUM_BEAMS, their earlier names, still work.

Queries of a split → constrained beam search with a trained MODEL_DIR → TREC run file (documents in beam
order) at MODEL_DIR/runs/<split>.step<N>.run; with runs/eval.gin also the metrics (printed and written as
JSON next to the run). With t5x's `--multiprocess` flags (as for gr_jax.train) each process searches a block
of the queries and process 0 writes the merged run.
"""

from __future__ import annotations

import json
import logging
import sys

from gr_jax.runtime import distributed, gin_utils
from gr_jax.runtime.cli import setup_logging

log = logging.getLogger("gr_jax.infer")


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax import compose

        return compose.infer

    # The experiment file is the training one: its training settings are expected to stay unused here; the
    # split, beams and batch size are its EvalConfig's (command-line bindings over the file's).
    rc, out = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"], root="infer",
                                  allow_unused=("train", "make_optimizer"), multiprocess=True)
    if rc or not distributed.is_primary():
        return rc
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
