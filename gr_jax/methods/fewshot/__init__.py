"""Few-Shot GR (003_fewshot_gr.txt): an LM writes a docid bank, no training (`model`: prompt, docid writer, bank,
retriever), and the method's command (`run`: `python -m gr_jax.fewshot`). The LM itself and its pseudo-query
generator are core (`backbones/lm.py`). Experiments: gin_configs/experiments/demo/fewshot_smollm2.gin.

Files: model (prompt, DocidWriter, DocidBank, FewShotRetriever), command (`run_fewshot`: `fewshot`)
"""
