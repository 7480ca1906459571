"""RIPOR (Zeng et al., "Scalable and Effective Generative Information Retrieval"): sequence docids that start from
relevance. A dense retriever's document vectors are residual-quantised into M codes of K values (`docids`), the
model's per-position code embeddings start at the quantiser's centroids, so that before any training a docid's
score is the dense score of the document's reconstructed vector (`model`); then seq2seq training on (query or
document) → docid. Offline, the query side is all-MiniLM-L6-v2 with a small residual decoder (the deviation is
stated in `model`'s docstring). Experiment: gin_configs/experiments/pydoc/ripor_minilm.gin.

Files: docids (RiporDocids: RQ of the embedder's document vectors, the codebooks carried by the table), model
(RiporRetriever: MiniLM + a residual layer per position that starts at zero, code embeddings at the centroids: dense
retrieval over the reconstructions before training; raw-logit beam search), objectives (RiporRankData: the dense
teacher's margins; RiporPhases: seq2seq then the prefix-oriented ranking loss in one run), t5_layout
(RiporT5Retriever: RIPOR's own T5 — InputCodebookHead with a learned start, tables at the centroids), dense +
command (the T5's dense phase: `python -m gr_jax.methods.ripor.command`), parity (their code; --mutate)
"""
