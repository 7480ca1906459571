"""The `training` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: trainer (the loop; `LoopConfig.trainable` + `Partition`: a run that trains part of the parameters),
lora (adapters: add, merge, unmerge; `prepare.adapters`, `prepare.frozen`), sam (sharpness-aware minimisation as an
optax transformation), partitioning (mesh, logical-axis rules), objectives (Objectives, ObjectiveInputs,
example_store), initial (INITIAL_CHECKPOINT_PATH loaders, a registry), vocabulary (the run's vocabulary,
MODEL_DIR/vocabulary/)
"""
