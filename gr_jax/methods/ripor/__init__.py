"""RIPOR (Zeng et al., "Scalable and Effective Generative Information Retrieval"): sequence docids that start from
relevance. A dense retriever's document vectors are residual-quantised into M codes of K values (`docids`), the
model's per-position code embeddings start at the quantiser's centroids, so that before any training a docid's
score is the dense score of the document's reconstructed vector (`model`); then seq2seq training on (query or
document) → docid. Offline, the query side is all-MiniLM-L6-v2 with a small residual decoder (the deviation is
stated in `model`'s docstring). Experiment: gin_configs/experiments/pydoc/ripor_minilm.gin."""
