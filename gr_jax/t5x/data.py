"""`get_dataset`: t5x's `get_dataset_fn` for a `RetrieverModel`, over our own training batches.

t5x calls `get_dataset_fn(train_dataset_cfg, shard_id, num_shards, model.FEATURE_CONVERTER_CLS)`; the model passes
the built system there (`models.SystemBatches`), and this returns a clu `DatasetIterator` over its resumable
iterator: the same batches, in the same order, as `python -m gr_jax.train` draws from the same experiment. With
`utils.SaveCheckpointConfig.save_dataset = True` (configs/) t5x saves the iterator's position with each checkpoint
and a resumed run goes on where it stopped (`BatchIterator`).
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np
from clu.data import dataset_iterator

from gr_jax.runtime.io_utils import write_text
from gr_jax.t5x.models import SystemBatches, T5xAdapterError

log = logging.getLogger(__name__)


class BatchIterator(dataset_iterator.DatasetIterator):
    """A clu iterator over our resumable iterator (data/pipeline.py): t5x's loop draws, saves and restores it.

    t5x draws the first batch ahead (`peek_async`) before it saves `checkpoint_<start>`, so the iterator is then one
    batch past the step being saved. Each draw here records the state before it, by step, and a save writes the
    state of the step in its file name (`checkpoint_<N>/...`): a run resumed from any checkpoint draws what an
    uninterrupted run draws next."""

    def __init__(self, iterator):
        self.iterator = iterator
        state = iterator.get_state()
        first = next(iterator)  # the batch layout, read once; the iterator goes back to where it was
        iterator.set_state(state)
        self._spec = {k: dataset_iterator.ArraySpec(dtype=np.asarray(v).dtype, shape=np.asarray(v).shape)
                      for k, v in first.items()}
        self.step = 0  # the training step whose batch the next draw gives
        self._before: dict[int, dict] = {}  # step → the iterator's state before that step's draw (the last few)

    @property
    def element_spec(self):
        return self._spec

    def get_next(self):
        self._before[self.step] = self.iterator.get_state()
        self._before.pop(self.step - 8, None)
        self.step += 1
        return {k: np.asarray(v) for k, v in next(self.iterator).items()}

    def __next__(self):
        return self.get_next()

    def reset(self):
        raise T5xAdapterError("our training iterator is not reset: a run resumes from its saved position")

    def save(self, filename) -> None:
        step = checkpoint_step(filename)
        if step == self.step:
            state = self.iterator.get_state()
        elif step in self._before:
            state = self._before[step]
        else:
            raise T5xAdapterError(f"{filename}: t5x saves the data position of step {step}, but the iterator is at "
                                  f"step {self.step} and remembers steps {sorted(self._before)}")
        write_text(str(filename), json.dumps({"step": step, "iterator": state}, sort_keys=True))

    def restore(self, filename) -> None:
        try:
            with open(str(filename), encoding="utf-8") as f:
                saved = json.load(f)
            self.iterator.set_state(saved["iterator"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise T5xAdapterError(f"{filename}: cannot restore the data position ({e}); the checkpoint's dataset "
                                  f"item is damaged or was not written by gr_jax.t5x") from None
        self.step = int(saved["step"])
        self._before.clear()


def checkpoint_step(filename) -> int:
    """N of the `checkpoint_<N>` folder (t5x's layout, also while it is written under a temporary name)."""
    found = re.findall(r"checkpoint_(\d+)", str(filename))
    if not found:
        raise T5xAdapterError(f"{filename}: not inside a t5x checkpoint_<N> folder; cannot tell which step's data "
                              f"position to save")
    return int(found[-1])


def get_dataset(cfg, shard_id: int, num_shards: int, feature_converter_cls, *args, **kwargs) -> BatchIterator:
    """t5x's `get_dataset_fn` (module docstring). `cfg` is t5x's DatasetConfig of the run: its batch size and task
    must be the experiment's (both come from BATCH_SIZE and MIXTURE_OR_TASK_NAME unless a gin file split them)."""
    if not isinstance(feature_converter_cls, SystemBatches):
        raise T5xAdapterError("gr_jax.t5x.data.get_dataset reads the batches of a gr_jax RetrieverModel; set "
                              "MODEL = @models.RetrieverModel() (gr_jax/t5x/configs/)")
    model = feature_converter_cls.model
    if num_shards != 1:
        raise T5xAdapterError(f"t5x asks for data shard {shard_id} of {num_shards}: a gr_jax model's batches are "
                              f"drawn on one host for now (one process; several local devices are fine)")
    if cfg.batch_size != model.batch_size:
        raise T5xAdapterError(f"t5x's train DatasetConfig.batch_size is {cfg.batch_size} but the experiment's "
                              f"BATCH_SIZE is {model.batch_size}: bind one BATCH_SIZE for both")
    if cfg.mixture_or_task_name != model.task:
        raise T5xAdapterError(f"t5x's MIXTURE_OR_TASK_NAME {cfg.mixture_or_task_name!r} is not the experiment's "
                              f"dataset {model.task!r}: bind one MIXTURE_OR_TASK_NAME for both")
    return BatchIterator(model.setup.iterator)
