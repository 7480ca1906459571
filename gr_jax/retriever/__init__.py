"""The `retriever` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: the retrieval core: contract (the model contract: Retriever, Planner, TracedSearch, Capabilities),
model (GenerativeRetriever), decoder_only, heads (text / codebook), search (Searcher over a local mesh, T5Searcher),
batching (map_padded)
"""
