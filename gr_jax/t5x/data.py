"""`get_dataset`: t5x's `get_dataset_fn` for a `RetrieverModel`, over our own training batches.

t5x calls `get_dataset_fn(train_dataset_cfg, shard_id, num_shards, model.FEATURE_CONVERTER_CLS)`; the model passes
the built system there (`models.SystemBatches`), and this returns a clu `DatasetIterator` over its resumable
iterator: the same batches, in the same order, as `python -m gr_jax.train` draws from the same experiment. With
`utils.SaveCheckpointConfig.save_dataset = True` (configs/) t5x saves the iterator's position with each checkpoint
and a resumed run goes on where it stopped.
"""

from __future__ import annotations

import json
import logging

import numpy as np
from clu.data import dataset_iterator

from gr_jax.io_utils import write_text
from gr_jax.t5x.models import SystemBatches, T5xAdapterError

log = logging.getLogger(__name__)


class BatchIterator(dataset_iterator.DatasetIterator):
    """A clu iterator over a `MixtureIterator` (data/pipeline.py): t5x's loop draws, saves and restores it."""

    def __init__(self, iterator):
        self.iterator = iterator
        state = iterator.get_state()
        first = next(iterator)  # the batch layout, read once; the iterator goes back to where it was
        iterator.set_state(state)
        self._spec = {k: dataset_iterator.ArraySpec(dtype=np.asarray(v).dtype, shape=np.asarray(v).shape)
                      for k, v in first.items()}

    @property
    def element_spec(self):
        return self._spec

    def get_next(self):
        return {k: np.asarray(v) for k, v in next(self.iterator).items()}

    def __next__(self):
        return self.get_next()

    def reset(self):
        raise T5xAdapterError("our training iterator is not reset: a run resumes from its saved position")

    def save(self, filename) -> None:
        write_text(str(filename), json.dumps(self.iterator.get_state(), sort_keys=True))

    def restore(self, filename) -> None:
        with open(str(filename), encoding="utf-8") as f:
            self.iterator.set_state(json.load(f))


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
