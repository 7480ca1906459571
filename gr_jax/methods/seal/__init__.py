"""SEAL, MINDER and LTRGR: n-gram identifiers generated under a substring index (000 §5; the authors' code as
described in docids.py, scoring.py, model.py and training.py).

Files: docids (identifier texts with view markers, new ids or SEAL's spelled in a BART vocabulary: SEAL, MINDER;
fixed-position units), model (SealRetriever / SealDecoderOnly: one search per view, the top 2N candidates of every
step as keys), ranker (LM+FM intersective scoring, first pass, unigram bonus; numpy, the oracle), device_ranker (the
same scoring as one program over a batch of queries: the candidates' texts as bit sets, the greedy a scan over
keys), training (SealPairs; SEAL++ replay), training_ltrgr (rank data, LtrgrPairs, LtrgrObjective), command
(`rank_data`; rank_data.py is its earlier spelling), parity (against SEAL's FM-index and aggregate_evidence),
import_released (a released fairseq checkpoint → MODEL_DIR)
"""
