"""MDGR (000_dynamic_corpora.txt §6.1): chunk-level PQ docids with constrained expansion (`docids`) and the
coverage ranker of formula (8) (`ranker`). Experiments: gin_configs/experiments/*/dynamic_mdgr.gin.

Files: docids (ChunkedPQDocids), ranker (MDGRRanker, formula (8))
"""
