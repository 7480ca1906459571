"""GenRET (Sun et al., 2023; 000_dynamic_corpora.txt's GenRET row): learned document tokenisation. One T5 reads a
document and assigns it a docid of T codes (`model`: codebook logits per position, greedy decoding), learned
progressively one position at a time with a balanced (Sinkhorn) assignment, an in-batch contrastive loss and a
reconstruction loss (`training`); the docids are the model's own, decoded again as it learns (`docids`).
Experiments: gin_configs/experiments/demo/genret.gin, dynamic_genret.gin."""
