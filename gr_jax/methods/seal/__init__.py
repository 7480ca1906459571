"""SEAL, MINDER and LTRGR: n-gram identifiers generated under a substring index (000 §5; the authors' code as
described in docids.py, scoring.py, model.py and training.py)."""
