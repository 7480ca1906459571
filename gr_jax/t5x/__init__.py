"""gr_jax models in t5x's own entry points: `python -m t5x.train --gin_file=gr_jax/t5x/configs/dsi_demo.gin`.

t5x is not a dependency of the core (nothing else imports this package, and gin registration skips it); install it
as the README says ("With t5x itself"). Importing `models` registers our gin configurables (as `python -m
gr_jax.train` does) and puts our `gin_configs/` first in gin's search list, so a t5x gin file can include one of our
experiment files. This file imports nothing: the package can be listed without t5x.

    models   `RetrieverModel`: a t5x `BaseModel` around the model object our experiment file builds: its
             `loss_fn` is our objective, its parameters and logical axes ours
    data     `get_dataset`: the t5x `get_dataset_fn` that hands t5x our training batches, in our order
    checkpoints  a t5x checkpoint → our MODEL_DIR/checkpoints/<step> (`python -m gr_jax.t5x.checkpoints`)
    records  what the adapter keeps in a MODEL_DIR (t5x_system.json, checkpoint steps) and its error, without
             importing t5x: `checkpoints` needs only this and orbax
"""
