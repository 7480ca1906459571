"""Ultron (Zhou et al., 2022; 000_dynamic_corpora.txt's Ultron-PQ and Ultron-URL): three training stages as one
resumable run — general pre-training (passages and terms of a document → its docid), search-oriented
pre-training (pseudo-queries → docid), supervised fine-tuning (queries → docid) — (`training`), and Ultron's URL
docids (`docids`: the title and the domain, or the reversed path and the domain). Ultron-PQ uses the core's PQ
docids. Experiments: gin_configs/experiments/demo/ultron_{pq,url}.gin and dynamic_ultron_{pq,url}.gin.

Files: training (UltronStages, StagedIterator: three stages as one run), docids (UltronUrlDocids)
"""
