"""Docvec: atomic docids whose output vectors start as a pretrained sentence encoder's document vectors.

Every document gets one code of its own (DSI's atomic docids, a one-step generation), and the model's output
vector of that code starts as the encoder's embedding of the document (`docids.DocvecDocids`, which carries the
vectors in its docid table). A query is read by the same pretrained encoder (all-MiniLM-L6-v2: mean pooling,
normalised), and its code is the argmax of cosine(query, code vector) (`model.DocvecRetriever`). Before
training this *is* dense retrieval with the frozen encoder; training (query → code, document → code) moves the
query encoder and the code vectors, as DSI trains its docid embeddings. A new document (dynamic corpora) gets
its code's vector from the encoder, so it is retrievable without training. Experiments:
gin_configs/experiments/pydoc/docvec_minilm.gin, dynamic_docvec_minilm.gin.

Files: docids (DocvecDocids: one code per document carrying the embedder's vector of it), model (DocvecRetriever:
MiniLM reads the query; the docid is the nearest code vector, the vectors a trained table started from the
documents' vectors; later documents ranked by their own)
"""
