"""The toy's starting-checkpoint loader: INITIAL_CHECKPOINT_PATH = 'toy-init:<seed>' starts from a tiny T5
initialised with that seed (registered with the library's loaders, as a method registers its released model)."""

from gr_jax.methods.api import initial, t5

PREFIX = "toy-init:"
LOADS = {"count": 0}


def _config(path: str) -> t5.T5Config:
    return t5.get_config("tiny", vocab_size=512)


def _load(path: str):
    LOADS["count"] += 1
    config = _config(path)
    return config, t5.init_params(config, seed=int(path[len(PREFIX):]))


initial.register(initial.InitialLoader("toy initialisation", lambda path: path.startswith(PREFIX), _load,
                                       config=_config, priority=50))
