"""Shared set-up for command-line entry points (`python -m gr_jax.*`, `tools/*.py`)."""

from __future__ import annotations

import logging


def setup_logging(level: int = logging.INFO) -> None:
    """gr_jax's own loggers at `level`; third-party loggers (absl/orbax, jax, transformers) at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("gr_jax").setLevel(level)
    for name in ("absl", "jax", "orbax", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.WARNING)
    except ImportError:
        pass
