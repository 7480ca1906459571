"""GLEN (002_glen.txt): docids learned by the model (`docids`: GLEN's docid file, docids decoded from documents),
the hidden-state-fed decoder and its collision-free search (`model`), phase 2's objective and batches
(`training`), the collision-free ranker (`ranker`) and the check against GLEN's own outputs (`parity`).
Experiments: gin_configs/experiments/*/glen_phase1.gin, glen.gin, glen_released.gin.

Files: docids (GLEN's docid file, decoded docids), model (GlenRetriever; registers its phase-1 refusal loader),
training (phase 2), ranker (CollisionFree, RandomTieOrder), parity, parity_reference (GLEN's PyTorch inference, for
the benchmark)
"""
