"""gr_jax models in t5x's own entry points: `python -m t5x.train --gin_file=gr_jax/t5x/configs/dsi_demo.gin`.

t5x is not a dependency of the core (nothing else imports this package, and gin registration skips it); install it
as the README says. Importing the package registers our gin configurables (as `python -m gr_jax.train` does) and
adds our `gin_configs/` after t5x's own search paths, so a t5x gin file can include one of our experiment files.

    models   `RetrieverModel`: a t5x `BaseModel` around the model object our experiment file builds: its
             `loss_fn` is our objective, its parameters and logical axes ours
    data     `get_dataset`: the t5x `get_dataset_fn` that hands t5x our training batches, in our order
    checkpoints  a t5x checkpoint → our MODEL_DIR/checkpoints/<step> (`python -m gr_jax.t5x.checkpoints`)
"""

from __future__ import annotations

try:
    import t5x  # noqa: F401
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "gr_jax.t5x needs t5x, which is not on PyPI: install it from its repository with --no-deps, then its "
        "PyPI dependencies (README, 'Training with t5x')") from e

import gin

from gr_jax import gin_utils

gin_utils.register_configurables()
if str(gin_utils.GIN_CONFIGS) not in gin.config._LOCATION_PREFIXES:
    gin.add_config_file_search_path(str(gin_utils.GIN_CONFIGS))
