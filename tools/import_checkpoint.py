"""`python tools/import_checkpoint.py` is `python -m gr_jax.import_checkpoint` (gr_jax/import_checkpoint.py): a network
trained elsewhere → a MODEL_DIR that `python -m gr_jax.infer` evaluates."""

import sys

from gr_jax.import_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
