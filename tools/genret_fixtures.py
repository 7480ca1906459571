"""Writes a GenRET parity fixture (tests/fixtures/genret_parity/<shape>/) from GenRET's own code; every size is a
flag.

    git clone https://github.com/sunnweiwei/GenRet && python tools/genret_fixtures.py --genret_repo GenRet \\
        --out tests/fixtures/genret_parity/t3_k8_relu
    python tools/genret_fixtures.py --genret_repo GenRet --out tests/fixtures/genret_parity/t4_k6_gated \\
        --positions 4 --codes 6 --d_model 48 --heads 6 --d_kv 8 --d_ff 96 --feed_forward gated-gelu \\
        --encoder_layers 3 --decoder_layers 2 --batch 5 --kmeans_documents 20 --query_max 16 --seed 1

It imports the authors' run.py from that working tree and runs, on a tiny random T5 (eval mode: no dropout),
their `Model` forward (docid logits of every position, the decoder states), their Sinkhorn assignment
(`center_distance_for_constraint` + `sinkhorn_raw`), their losses (`OurTrainer.train_step`: contrastive,
commitment, prefix-code, reconstruction) at every docid position t, and their `norm_by_prefix` of the documents'
states (the codebook initialisation's input). Their inference's `generate` over a prefix tree of docids (their `Tree`), as many beams as docids. Adaptations,
because APIs moved (nothing of run.py is edited): transformers 4.4x moved `transformers.generation_utils` to
`transformers.generation` (run.py line 12 imports the old name: it is made an alias of the new module before run.py
is imported); transformers 5's generation reads `base_model_prefix`, which their `Model` lacks (set on it), and hands
the model a cache, after which T5's input preparation (which their `Model` borrows) feeds only the newest code, at
position 0, since their `Model` keeps no cache: `use_cache=False` restores the whole prefix at every step, as their
transformers gave it. Their constrained k-means
(`k_means_constrained`, which needs ortools, and runs with `random_state=None`) is not called.

Folder: model/ (the T5 as an HF directory), head.npz (their `centroids.<i>.weight` [K, D] and
`code_embedding.<i>.weight` [K, D]), inputs.npz, outputs.npz (per position t: `t{t}/...`), meta.json (sizes, their
commit, the versions, the adaptation). Needs the [torch] extra. `methods/genret/parity.py` checks ours against it
(`python tools/check_parity.py --method genret --fixture tests/fixtures/genret_parity/t3_k8_relu [--mutate]`). The
layer norms are drawn 1 ± 0.1 (`--norm_spread`): at HF's ones a swap of two entries changes nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.provenance import git_commit

# the default shape (tests/fixtures/genret_parity/t3_k8_relu); every size is a flag
DEFAULTS = dict(positions=3, codes=8, batch=6, kmeans_documents=24, vocab=64, d_model=32, d_kv=8, d_ff=64,
                encoder_layers=2, decoder_layers=2, heads=4, query_max=9, doc_max=16)


def _import_run(repo: Path):
    import transformers

    if "transformers.generation_utils" not in sys.modules:  # the API that moved (module docstring)
        sys.modules["transformers.generation_utils"] = importlib.import_module("transformers.generation")
    sys.path.insert(0, str(repo))
    try:
        return importlib.import_module("run"), transformers.__version__
    finally:
        sys.path.remove(str(repo))


def write_fixture(repo: Path, out: Path, seed: int = 0, commit: str | None = None, sizes=None,
                  feed_forward: str = "relu", norm_spread: float = 0.1) -> dict:
    import torch
    from safetensors.numpy import save_file
    from transformers import T5Config, T5ForConditionalGeneration

    run, tf_version = _import_run(repo)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    z = sizes if sizes is not None else argparse.Namespace(**DEFAULTS)
    T, K, B, N, VOCAB, D = z.positions, z.codes, z.batch, z.kmeans_documents, z.vocab, z.d_model
    if K < 3 or z.query_max < 4 or z.doc_max < 7:
        raise ValueError("--codes ≥ 3 (the searched docids use codes ≥ 2), --query_max ≥ 4, --doc_max ≥ 7")
    cfg = T5Config(vocab_size=VOCAB, d_model=D, d_kv=z.d_kv, d_ff=z.d_ff, num_layers=z.encoder_layers,
                   num_decoder_layers=z.decoder_layers, num_heads=z.heads,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.1,
                   feed_forward_proj=feed_forward, tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0,
                   eos_token_id=1)
    t5 = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # HF's init sets every norm to ones, where a swap of two entries changes nothing
        for name, param in t5.named_parameters():
            if "layer_norm" in name and norm_spread:
                param.copy_(1.0 + norm_spread * torch.randn_like(param))
    master = run.Model(model=t5, code_length=T, use_constraint=True, sk_epsilon=1, zero_inp=False, code_number=K)
    with torch.no_grad():  # their codebooks start U(±1/√D) (then k-means); scale them up so the logits spread
        for c in master.centroids:
            c.weight.mul_(8.0)

    def texts(n, lo, hi):
        rows = [list(rng.integers(2, VOCAB, size=int(m) - 1)) + [1] for m in rng.integers(lo, hi, size=n)]
        width = max(map(len, rows))
        return np.array([r + [0] * (width - len(r)) for r in rows], np.int64)

    query, doc = texts(B, 3, z.query_max), texts(B, 6, z.doc_max)
    prefix = rng.integers(0, K, size=(B, T - 1))
    km_docs = texts(N, 4, 16)
    km_prefix = rng.integers(0, 2, size=(N, T - 1))
    outputs: dict[str, np.ndarray] = {}
    for t in range(T):  # stage t: their Model has t + 1 tables (the first t + 1 of the master's)
        model = run.Model(model=t5, code_length=t + 1, use_constraint=True, sk_epsilon=1, zero_inp=False,
                          code_number=K).eval()
        for i in range(t + 1):
            model.centroids[i].weight.data = master.centroids[i].weight.data
            model.code_embedding[i].weight.data = master.code_embedding[i].weight.data
        ids = torch.tensor(np.concatenate([np.zeros((B, 1), np.int64), prefix[:, :t]], 1))
        q, d = torch.tensor(query), torch.tensor(doc)
        with torch.no_grad():
            qo = model(input_ids=q, attention_mask=q.ne(0), decoder_input_ids=ids, aux_ids=None,
                       return_quantized_embedding=True)
            do = model(input_ids=d, attention_mask=d.ne(0), decoder_input_ids=ids, aux_ids=None,
                       return_quantized_embedding=True)
            centred = model.center_distance_for_constraint(-do.probability).double()
            plan = run.sinkhorn_raw(-centred, 1.0, 100, use_distrib_train=False)
            losses = run.OurTrainer.train_step(model, {"query": q, "doc": d, "ids": ids, "aux_ids": None},
                                               gathered=False)
            km_ids = torch.tensor(np.concatenate([np.zeros((N, 1), np.int64), km_prefix[:, :t]], 1))
            kd = torch.tensor(km_docs)
            states = model(input_ids=kd, attention_mask=kd.ne(0), decoder_input_ids=km_ids,
                           use_constraint=False).continuous_embeds.numpy().astype(np.float32)
        outputs.update({
            f"t{t}/query_logits": qo.logits.numpy(), f"t{t}/doc_logits": do.logits.numpy(),
            f"t{t}/query_state": qo.continuous_embeds.numpy(), f"t{t}/doc_state": do.continuous_embeds.numpy(),
            f"t{t}/plan": plan.numpy(), f"t{t}/codes": do.discrete_codes.numpy(),
            f"t{t}/kmeans_states": states, f"t{t}/kmeans_normed": np.asarray(
                run.norm_by_prefix(states, km_ids.tolist()), np.float32),
            **{f"t{t}/loss_{k}": np.float64(float(v)) for k, v in losses.items()
               if k in ("cl_loss", "ce_loss", "code_loss", "cl_dd_loss")}})
    # their inference (run.py `test`): generate over a prefix tree of docids (codes ≥ 2: T5's end token 1 would end a
    # beam early, their quirk, and 0 is its padding), as many beams as docids so that both searches are exhaustive
    docids = np.unique(rng.integers(2, K, size=(5, T)), axis=0)
    tree = run.Tree()
    tree.set_all([[0, *map(int, d)] for d in docids])
    run.Model.base_model_prefix = "model"  # transformers 5's GenerationMixin reads it (an API that moved)
    full = run.Model(model=t5, code_length=T, use_constraint=False, zero_inp=False, code_number=K).eval()
    for i in range(T):
        full.centroids[i].weight.data = master.centroids[i].weight.data
        full.code_embedding[i].weight.data = master.code_embedding[i].weight.data
    with torch.no_grad():
        q = torch.tensor(query)
        gen = full.generate(input_ids=q, attention_mask=q.ne(0), max_length=T + 1, num_beams=len(docids),
                            num_return_sequences=len(docids), prefix_allowed_tokens_fn=tree, output_scores=True,
                            return_dict_in_generate=True, use_cache=False)
    outputs["search_docids"] = docids
    outputs["search_beams"] = gen.sequences.numpy().reshape(B, len(docids), -1)[:, :, 1:]
    outputs["search_scores"] = gen.sequences_scores.numpy().reshape(B, len(docids))
    out.mkdir(parents=True, exist_ok=True)
    t5.save_pretrained(str(out / "model"))
    head = {f"centroids.{i}.weight": master.centroids[i].weight.detach().numpy() for i in range(T)}
    head.update({f"code_embedding.{i}.weight": master.code_embedding[i].weight.detach().numpy() for i in range(T)})
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in head.items()}, str(out / "head.safetensors"))
    np.savez(out / "inputs.npz", query=query, doc=doc, prefix=prefix, kmeans_docs=km_docs, kmeans_prefix=km_prefix)
    np.savez(out / "outputs.npz", **outputs)
    meta = {"positions": T, "codes": K, "batch": B, "kmeans_documents": N, "seed": seed,
            "sizes": {**vars(z), "feed_forward": feed_forward, "norm_spread": norm_spread},
            "command": "python tools/genret_fixtures.py --genret_repo GenRet " + " ".join(
                [f"--{k} {v}" for k, v in sorted(vars(z).items()) if DEFAULTS.get(k) != v]
                + ([f"--feed_forward {feed_forward}"] if feed_forward != "relu" else [])
                + ([f"--norm_spread {norm_spread}"] if norm_spread != 0.1 else [])
                + ([f"--seed {seed}"] if seed else [])),
            "genret_commit": commit or git_commit(repo), "torch": torch.__version__, "transformers": tf_version,
            "adapted": "run.py line 12 imports transformers.generation_utils, which transformers 4.4x moved to "
                       "transformers.generation: the old name is an alias of the new module; Model.base_model_prefix "
                       "set and use_cache=False for transformers 5's generate (run.py unchanged)",
            "settings": "eval mode (no dropout); Model(use_constraint=True, sk_epsilon=1, zero_inp=False); "
                        "centroids scaled ×8 after their U(±1/√D) init; prefix-group batches as B distinct documents"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genret_repo", required=True, help="a working tree of sunnweiwei/GenRet (its run.py)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--commit", help="the commit of --genret_repo when it is not a git working tree (an export)")
    parser.add_argument("--feed_forward", choices=("relu", "gated-gelu"), default="relu")
    parser.add_argument("--norm_spread", type=cli.nonnegative, default=0.1,
                        help="layer norms drawn 1 ± this (0: HF's ones, where --mutate cannot swap entries)")
    for name, default in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=cli.count, default=default)
    args = parser.parse_args(argv)
    repo = Path(args.genret_repo)
    if not (repo / "run.py").is_file():
        sys.stderr.write(f"error: {repo}: no run.py; give a working tree of github.com/sunnweiwei/GenRet\n")
        return 2
    sizes = argparse.Namespace(**{k: getattr(args, k) for k in DEFAULTS})
    try:
        meta = write_fixture(repo, Path(args.out), args.seed, args.commit, sizes, args.feed_forward,
                             args.norm_spread)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(meta) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
