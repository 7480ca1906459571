"""DPR and DPR-HN (000_dynamic_corpora.txt §3.2): a query encoder and a document encoder, both started from a
pretrained sentence encoder (all-MiniLM-L6-v2 in Flax, `backbones/bert.py`), fine-tuned on P0 with in-batch
negatives (`model`); DPR-HN adds hard negatives, BM25's and a dense retriever's top-K (`negatives`). In the
dynamic-corpora protocol the document encoder trained on D0 is frozen and encodes D1..Dn as they arrive.
Experiments: gin_configs/experiments/demo/dynamic_dpr.gin, dynamic_dpr_hn.gin.

Files: model (DprEmbedder: MiniLM query + document encoders fine-tuned on P0, in-batch and hard negatives; DprModel,
DprIterator), training_negatives (BM25 / dense top-K)
"""
