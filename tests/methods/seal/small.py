"""A SEAL-family run small enough for a test: 60 demo documents, a 300-piece vocabulary, short searches, no
final evaluation (later bindings win in gin)."""


def small_run(experiment: str, steps: int) -> str:
    """The gin text of `experiment` (e.g. 'experiments/demo/minder.gin') trained for `steps` steps, one
    checkpoint at the end."""
    return f"""
include '{experiment}'
load_dataset.demo_docs = 60
TRAIN_STEPS = {steps}
BATCH_SIZE = 16
prepare.vocab_size = 300
train.progress = False
train.checkpoint_period = {steps}
train.final_eval = False
SealSearch.body_length = 3
SealSearch.title_length = 4
SealSearch.query_length = 6
"""


def train_small(directory, name: str, experiment: str, steps: int):
    """`small_run` written to DIRECTORY/NAME.gin and trained into DIRECTORY/NAME → (gin file, MODEL_DIR)."""
    import gin

    from gr_jax import compose
    from gr_jax.runtime import gin_utils

    exp, model_dir = directory / f"{name}.gin", directory / name
    exp.write_text(small_run(experiment, steps))
    gin.clear_config()
    gin_utils.parse([str(exp)], [f"MODEL_DIR = '{model_dir}'"])
    compose.train()
    gin.clear_config()
    return exp, model_dir
