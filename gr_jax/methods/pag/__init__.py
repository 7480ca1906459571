"""PAG (004_pag_lost_in_decoding.txt): set and sequential docids (`docids`), the planner and the look-ahead-guided
search (`model`), the joint objectives (`training`), planner alignment for cross-lingual queries (`align`,
`aligned`: `python -m gr_jax.align_planner`) and the check against PAG's own outputs (`parity`).
Experiments: gin_configs/experiments/*/pag.gin.

Files: docids (sequential RQ + set docids), model_planner (s_simul: dense product, inverted index over key ranks,
the planning set by key), model_planned (the planning sets' own trie, searched flat), model_bonus (the look-ahead bonus tables and hooks), model (PagRetriever: look-
ahead, modes), model_aligned, training (joint objectives), training_align (planner alignment), command
(`align_planner`), parity
"""
