"""The `docids` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: schemes several methods share: base (DocidTable, DocidScheme + its declared capabilities, save/load),
atomic, lexical (title/URL, keywords), numeric (PQ, RQ, semantic), quantize (k-means, PQ, RQ, exact search in JAX),
pseudo_query, ngram, embed (the Embedder interface: TF-IDF+SVD, MiniLM through sentence-transformers)
"""
