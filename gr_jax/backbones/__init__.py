"""The `backbones` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: networks with their loaders and parity: t5 (Dense reads a LoRA adapter beside its kernel;
`T5Config.pretrained_encoder`: a sentence encoder's BERT as the encoder) (+ t5_convert: HF T5 ↔ params, checkpoints;
t5_parity: against transformers; t5_embed: mean pooling), bart (+ bart_convert: HF ↔ params, fairseq checkpoints
through an unpickling allowlist, the library's id order; bart_tokenizer: GPT-2 BPE from either layout; bart_parity),
seq2seq (T5 or BART by config type: what a retriever builds), llama (+ llama_io: LM loaders, load_lm; llama_parity),
bert (sentence-transformers' encoders in Flax), layer_stack (scanned layers over per-layer parameters), random_init
(jitted module init; threefry kernel on GPU); LM tools: gguf (our GGUF reader), lm_tokenizer (GGUF BPE tokenizer,
LMVocabulary), lm (LMContext, PseudoQueryGenerator), lm_generate, paraphrase (LM paraphraser)
"""
