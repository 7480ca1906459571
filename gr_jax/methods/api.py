"""The extension surface: what a method may extend, implement or use of gr_jax, in one module. A method package
(`gr_jax/methods/<name>/`, or a package of your own that a gin file imports) imports gr_jax only from here and
from itself (`tests/test_methods.py`); what is not here is the core's own business and may change.

What a method extends or implements, how an experiment file binds it, and which method shows it:

| extension point | what a method writes | bound by | shown by |
|---|---|---|---|
| docid scheme | a `DocidScheme` subclass: `fit` on D0, `assign`, `state`/`load_state`, its declared capabilities (`decoded_by_model`, `uses_training_queries`, ...); tokens in a `DocidTokenSpace`; `first_seen_codes` numbers documents as atomic docids do | `prepare.docid_scheme = @MyDocids()` | glen, pag, mdgr, seal, genret, ultron, docvec |
| objective | `objective(model, params, batch, rng) -> (loss, {name: (sum, count)})` | `GenerativeRetriever.objective = @my_objective` | nci, genret, glen, seal (LTRGR) |
| training data | an `ObjectivesConfig`: `iterator(ObjectiveInputs)`, `refresh_period`, `on_refresh`, `examples` (data the starting model makes itself: `ObjectiveInputs.start`) | `prepare.objectives_config = @MyData()` | seal, ultron, genret |
| model contract | a `GenerativeRetriever` / `DecoderOnlyRetriever` subclass or any `Retriever`; `Capabilities` declared, never probed; a planner also implements `Planner`; `TracedSearch` for t5x | `prepare.model_fn = @MyRetriever` | glen, pag, nci, genret, seal, fewshot |
| head | a `TextHead` / `CodebookHead` / `InputCodebookHead` (untied input tables) or a subclass, over the docid token space | the model's `head` | nci (PAWA), genret, ripor |
| decoding constraint | an object with `Constraint`'s members (`TrieIndex`, `SubstringIndex` exist; a docid table's `index_kind` picks one) | the model's `rank` | seal (any n-gram of any document) |
| ranker | `ranker(docs_BxNxP, valid_BxNxP, beam_scores_BxN) -> (query, document row, score)`; `flat_slots`, `group_starts` | `GenerativeRetriever.ranker = @MyRanker()` | glen, mdgr, seal |
| decoding hooks | `bonus_fn(level, child_node_ids, query_state)` + `query_state_fn`; a flat search (`beam_search.beam_search_flat`, `Candidates`) | `GenerativeRetriever.bonus_fn` | pag |
| starting checkpoint | `initial.register(initial.InitialLoader(name, accepts, load, ...))` at import | INITIAL_CHECKPOINT_PATH | glen (refuses its phase-1 checkpoints), nci (its released .ckpt) |
| embedder | an `Embedder` (`trains_on_queries` to be fine-tuned on D0 and its queries first) | `prepare.embedder`, `run_dynamic.embedder` | dpr |
| trainer hooks | a training loop through `trainer.fit` (checkpoints, exact resume, the NaN guard) | — | dpr, pag (planner alignment) |
| command | a `Command` in `methods/<name>/command.py` (`python -m gr_jax.methods.<name>.command`) | `runs/<name>.gin` | pag, fewshot, seal, ripor |
| parity | `parity.py` checking against the authors' outputs (`mutations`: `sweep`, for `--mutate`) | `tools/check_parity.py --method <name>` | glen, pag, seal, nci, genret, ripor |

The rest of this module is the building blocks methods use: backbones, data and evaluation pieces, the
runtime's writing, provenance and validation helpers.
"""

# ruff: noqa: F401 (every name here is exported)

# --- docid schemes ---------------------------------------------------------------------------------------
from gr_jax.data.vocab import EOS_ID, PAD_ID, DocidTokenSpace, load_vocabulary
from gr_jax.docids.atomic import first_seen_codes
from gr_jax.docids.base import DocidScheme, DocidTable, FitContext, added_field
from gr_jax.docids.embed import Embedder, TfidfSvdEmbedder
from gr_jax.docids.lexical import FieldDocids
from gr_jax.docids.numeric import RQDocids, checked_embeddings
from gr_jax.docids.pseudo_query import read_queries_file
from gr_jax.docids.quantize import ProductQuantizer, ResidualQuantizer, exact_search, kmeans

# --- objectives, training data, the loop, starting checkpoints -------------------------------------------
from gr_jax.training import initial, trainer
from gr_jax.training.objectives import ObjectiveInputs, ObjectivesConfig, example_store

# --- the model contract, heads, searchers ----------------------------------------------------------------
from gr_jax.retriever.batching import map_padded
from gr_jax.retriever.contract import Capabilities, Planner, Retriever, TracedSearch
from gr_jax.retriever.decoder_only import DecoderOnlyRetriever
from gr_jax.retriever.heads import CodebookHead, InputCodebookHead, TextHead
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.retriever.search import Searcher, share_encoder

# --- decoding constraints, beam search, rankers ----------------------------------------------------------
from gr_jax.decoding import beam_search, rankers
from gr_jax.decoding.beam_search import Candidates
from gr_jax.decoding.rankers import beams_to_arrays, flat_slots, group_starts, per_query
from gr_jax.index.constraint import Constraint
from gr_jax.index.device import leaf_documents
from gr_jax.index.substring import DeviceSubstrings, SubstringIndex
from gr_jax.index.trie import TrieIndex

# --- backbones and LM tools ------------------------------------------------------------------------------
from gr_jax.backbones import bart, bart_convert, bart_tokenizer, llama, lm_generate, seq2seq, t5, t5_convert
from gr_jax.backbones.bert import Bert, SentenceEncoder, l2_normalise, load_sentence_encoder, mean_pool
from gr_jax.backbones.lm import LMContext, PseudoQueryGenerator, clean_text
from gr_jax.backbones.lm import batches as lm_batches

# --- data ------------------------------------------------------------------------------------------------
from gr_jax.data import pairs as dsi_pairs
from gr_jax.data import sources
from gr_jax.data.batches import batch_seed, pending_batches, restrict
from gr_jax.data.pairs import Pairs, query_pairs
from gr_jax.data.pipeline import ExampleStore, MixtureIterator, pad_sequences, tokenize
from gr_jax.data.readers import Corpus, DataError, QuerySet, fingerprint, read_queries_tsv
from gr_jax.data.trec import write_qrels, write_run

# --- baselines, evaluation, composition ------------------------------------------------------------------
from gr_jax.baselines.bm25 import BM25, hard_negatives
from gr_jax.baselines.dense import DenseIndex
from gr_jax.compose import import_checkpoint, restore
from gr_jax.evaluation import drift
from gr_jax.evaluation.metrics import evaluate
from gr_jax.evaluation.mutations import chosen, rel_diff, swapped, swapped_or_negated, sweep, worst
from gr_jax.evaluation.report import markdown_table
from gr_jax.evaluation.retrieval import evaluation_settings, retrieve

# --- commands and the runtime ----------------------------------------------------------------------------
from gr_jax.runtime.command import ON_A_TRAINED_SYSTEM, Command, deferred
from gr_jax.runtime import gin_checks, validation
from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import atomic_dir, json_text, load_npz, read_json, write_bytes, write_text
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.pickle_probe import refusal_text
from gr_jax.runtime.provenance import ProvenanceError, file_digest, normalized, read_records, records_text, reuse
from gr_jax.runtime.run_dir import RunDir
from gr_jax.runtime.validation import Count, Fraction, Positive, Signed, one_of
