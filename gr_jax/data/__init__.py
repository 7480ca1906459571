"""The `data` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: vocab (token ids, vocabularies — SentencePiece, HF tokenizer.json, BERT WordPiece —, DocidTokenSpace: a
leaf like runtime/), readers (NQ320k layouts, MS MARCO, TREC DL, mMARCO, JSONL/TSV), sources (datasets by name),
pydoc (the standard library's documentation as a dataset, read with ast), pipeline (tokenize, ExampleStore,
MixtureIterator), pairs (DSI pairs), splits (dynamic split: the dataset's query splits or 000's pooled 'paper'
split), variations (query variations), batches (resumable document-id batches), demo, trec (runs/qrels)
"""
