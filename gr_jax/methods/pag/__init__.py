"""PAG (004_pag_lost_in_decoding.txt): set and sequential docids (`docids`), the planner and the look-ahead-guided
search (`model`), the joint objectives (`training`), planner alignment for cross-lingual queries (`align`,
`aligned`: `python -m gr_jax.align_planner`) and the check against PAG's own outputs (`parity`).
Experiments: gin_configs/experiments/*/pag.gin."""
