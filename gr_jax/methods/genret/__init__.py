"""GenRET (Sun et al., 2023; 000_dynamic_corpora.txt's GenRET row): learned document tokenisation. One T5 reads a
document and assigns it a docid of T codes (`model`: codebook logits per position, greedy decoding), learned
progressively one position at a time with a balanced (Sinkhorn) assignment, an in-batch contrastive loss and a
reconstruction loss (`training`); the docids are the model's own, decoded again as it learns (`docids`).
Experiments: gin_configs/experiments/demo/genret.gin, dynamic_genret.gin.

Files: docids (GenretDocids: decoded by the model), model (GenretHead: start, raw_logits; GenretRetriever: greedy
docids), training (sinkhorn, released_plan, balanced_codes, genret_losses, genret_objective, GenretBatches,
GenretTraining: pre_stage, fit_stage), parity (against tests/fixtures/genret_parity/<shape>)
"""
