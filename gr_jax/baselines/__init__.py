"""The `baselines` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: bm25 (bm25s; hard negatives), dense (exact inner product, DPR-style fine-tuning)
"""
