"""The `protocols` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: systems (BM25System, DenseSystem, TrainedSystem: one interface; probe), dynamic_corpora,
query_variation (`robustness`), language_shift (`cross_lingual`, + translators), lm_pseudo_queries
(`pseudo_queries`), paper_tables (`reproduce`: a paper's systems and tables from gin_configs/papers/<name>.json;
`--jobs` systems at a time, one shared XLA cache), released (`reproduce --released DIR`: the authors' checkpoints
imported and evaluated, ours beside the published values of gin_configs/released/)
"""
