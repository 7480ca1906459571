"""NCI (Wang et al., 2022; 000_dynamic_corpora.txt's NCI row): hierarchical k-means docids with position-specific
codes (the core's SemanticDocids and CodebookHead), the prefix-aware weight-adaptive decoder and the
consistency-regularised objective (`model`). Experiments: gin_configs/experiments/demo/nci.gin, dynamic_nci.gin.

Files: model (PawaHead, PawaCache, NciRetriever, nci_objective: consistency "kl" | "contrast"), released (NCI as its
authors released it: NciFlatHead, NciReleasedRetriever, NciDocids, their .ckpt as a starting checkpoint with its
head), parity (against tests/fixtures/nci_parity/<shape>)
"""
