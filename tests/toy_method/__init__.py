"""A toy method as a package outside the library, the way a method under gr_jax/methods/ is one: a docid scheme,
an objective with metric keys of its own, a ranker, a decoding bonus and a starting-checkpoint loader. Its gin file
(`toy.gin`) imports this package, which registers the pieces; no file under gr_jax/ names any of them
(tests/test_compose.py checks both)."""

from tests.toy_method import docids, loader, model  # noqa: F401 (registers the gin configurables and the loader)
