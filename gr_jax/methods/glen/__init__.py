"""GLEN (002_glen.txt): docids learned by the model (`docids`: GLEN's docid file, docids decoded from documents),
the hidden-state-fed decoder and its collision-free search (`model`), phase 2's objective and batches
(`training`), the collision-free ranker (`ranker`) and the check against GLEN's own outputs (`parity`).
Experiments: gin_configs/experiments/*/glen_phase1.gin, glen.gin, glen_released.gin."""
