"""One package per method. A method is what the core does not share: its docid scheme, network or model object,
objective, ranker, starting-checkpoint loader, parity reference and own commands, bound by its experiment gin
files (gin_configs/experiments/<dataset>/<method>.gin). A method imports the core (and the composition, for its
own commands), never another method or a protocol (tests/test_methods.py checks it); gin finds its
configurables because the package is walked (`gin_utils.register_configurables`). WORKSPACE.md "How to add a
method" is the recipe."""
