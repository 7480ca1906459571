"""The `evaluation` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: metrics (trec_eval conventions), retrieval (EvalConfig: every command's beams, batch and split;
retrieve), dynamic_measures (F_n, GA_n, IDBI), drift (plan-drift diagnostics), report (tables, plots), answers
(Answer@k: answer strings in the retrieved passages, as NQ retrieval reports it), mutations (the sweep of
`check_parity --mutate`: two rows of one fixture tensor swapped at a time), gradient_parity (the backbones against
transformers by logits and every parameter's gradient)
"""
