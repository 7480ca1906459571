"""Decoding and index benchmarks; prints one JSON line per figure and replaces its section of BENCHMARKS.md.

    python tools/bench_decoding.py --quick            # small version, under two minutes on 2 CPU cores
    python tools/bench_decoding.py                    # full: tiny + small T5, 100k / 1M / 8.8M docids

(a) gr_jax vs transformers `generate(num_beams=k, prefix_allowed_tokens_fn=<dict trie>)`: same converted T5
    weights, same random docids, k = 10 and 100; ms/query and whether both return the same docids; ours with the
    trie's runs of levels scanned (the default) and with every level unrolled (`scan_levels=False`).
(b) constrained vs unconstrained search time (same model, beams and number of steps).
(c) TrieIndex build time and bytes for random docids, L = 8, V = 2048; decode time on that trie with a
    trivial model (batch 2, beam 70: STATIC's configuration).
(d) insert 10% new docids into a built index vs rebuilding from scratch.
(e) GPU only: T5-base random weights, scanned layers, 8.8M docids, beam 10 and 100, batch 16 (skipped without a
    GPU; `--e_docids N` runs it anywhere as a dry run that writes nothing).
(g) GLEN: our constrained decoding + collision-free ranking (`methods/glen/model.py`) vs the same algorithm written
    as GLEN's PyTorch code runs it (`methods.glen.torch_reference.glen_rank_torch`: hidden-state feedback with a KV cache, trie masks
    from a nested dict per beam per step, top-K over K × V), same weights and docids (M 3, collisions), tiny
    and small T5, N 10 and 100 (K = 2N); ms/query and whether the ranked lists are identical.
(f) the beam → documents → run tail (device gather, array ranker, run dicts) vs the decoding it follows,
    tiny T5, batch 64, beam 100 (target: ≤ 10% of decoding), and the per-beam Python loop it replaced.
(i) the same search (tiny T5, 16 queries) on one device and split over 2 host devices (a child process started
    with `--xla_force_host_platform_device_count=2`): the scaling from 1 to 2 devices on this machine.
(h) our search in each score mode (log_softmax, renormalized, raw) beside its matmul floor: the search's weight
    matmuls alone, one dot each, in one jitted program, their rate applied to all its FLOPs; tiny T5 with V 512
    and with T5's V 32128, beam 10 and 100.
Speed claims are ratios measured side by side in this run; absolute times are only meaningful on a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging
from gr_jax.decoding import beam_search as bs
from gr_jax.retriever.search import T5Searcher
from gr_jax.index.trie import TrieIndex
from gr_jax.backbones import t5, t5_convert
from gr_jax.evaluation.report import benchmark_writer

log = logging.getLogger("gr_jax.bench_decoding")  # shown by setup_logging
ROOT = Path(__file__).resolve().parents[1]
EOS = 1
ROWS: list[dict] = []


def emit(**row):
    ROWS.append(row)
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def timed(fn, repeats: int = 3, sync=jax.block_until_ready) -> float:
    """Best wall time of `repeats` calls after one warm-up call (compilation, caches, lazy set-up of either
    framework), in seconds. Every contender is timed through this, so ratios compare warm with warm."""
    sync(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sync(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def random_docids(n: int, length: int, vocab: int, seed: int, low: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.unique(rng.integers(low, vocab, (int(n * 1.02) + 16, length), dtype=np.int32), axis=0)
    return out[rng.permutation(len(out))[:n]]


# ----------------------------------------------------------------------------------------------------------
# (a) + (b): against transformers
# ----------------------------------------------------------------------------------------------------------


def bench_vs_transformers(model_name: str, n_docids: int, beams: list[int], n_queries: int, length: int):
    import torch
    import transformers  # noqa: F401

    from gr_jax.backbones.t5_parity import hf_prefix_allowed_fn, load_torch_t5

    torch.set_num_threads(2)
    config = t5.get_config(model_name, dropout_rate=0.0)
    if model_name == "t5_small":
        config = config.replace(vocab_size=2048)
    params = t5.init_params(config, seed=0)
    docids = random_docids(n_docids, length, config.vocab_size, seed=1)
    docids = np.concatenate([docids, np.full((len(docids), 1), EOS, np.int32)], axis=1)
    index = TrieIndex.build(docids, vocab_size=config.vocab_size, eos_id=EOS)
    trie = index.device()
    rng = np.random.default_rng(2)
    queries = rng.integers(3, config.vocab_size, (n_queries, 16))
    with tempfile.TemporaryDirectory() as tmp:
        t5_convert.save_hf(params, config, Path(tmp) / "hf")
        hf = load_torch_t5(Path(tmp) / "hf")
    allowed = hf_prefix_allowed_fn(docids, EOS)

    q_t = torch.tensor(queries)
    for k in beams:
        searcher = T5Searcher(t5.T5(config), num_beams=k, score_mode="log_softmax", length_penalty=1.0)
        ours_c = timed(lambda: searcher.search(params, queries, trie).scores)
        ours_u = timed(lambda: searcher.search_unconstrained(params, queries, docids.shape[1]).scores)
        # the default scans the trie's runs of levels (compiles ~3× faster); every level unrolled, for comparison
        unrolled = T5Searcher(t5.T5(config), num_beams=k, score_mode="log_softmax", length_penalty=1.0,
                              scan_levels=False)
        ours_c_unrolled = timed(lambda: unrolled.search(params, queries, trie).scores)
        res = searcher.search(params, queries, trie)

        def hf_run(constrained: bool):
            with torch.no_grad():
                return hf.generate(input_ids=q_t, attention_mask=q_t != 0, num_beams=k, num_return_sequences=k,
                                   max_new_tokens=docids.shape[1], min_new_tokens=docids.shape[1] if not constrained
                                   else 0, prefix_allowed_tokens_fn=allowed if constrained else None,
                                   length_penalty=1.0, do_sample=False, return_dict_in_generate=True,
                                   output_scores=True)

        hf_c = timed(lambda: hf_run(True), sync=lambda out: out)  # warmed up like ours: the first call of
        hf_u = timed(lambda: hf_run(False), sync=lambda out: out)  # generate() sets up far more than it decodes
        out = hf_run(True)
        hf_seqs = out.sequences[:, 1:].numpy().reshape(n_queries, k, -1)
        ours = np.asarray(res.tokens)[:, :, :hf_seqs.shape[2]]
        same = float(np.mean([set(map(tuple, ours[b])) == set(map(tuple, hf_seqs[b])) for b in range(n_queries)]))
        same_order = float(np.mean(np.all(ours == hf_seqs, axis=(1, 2))))
        emit(figure="a_vs_transformers", model=model_name, docids=int(len(docids)), beam=k, queries=n_queries,
             gr_jax_constrained_ms_per_query=1e3 * ours_c / n_queries,
             gr_jax_unconstrained_ms_per_query=1e3 * ours_u / n_queries,
             transformers_constrained_ms_per_query=1e3 * hf_c / n_queries,
             transformers_unconstrained_ms_per_query=1e3 * hf_u / n_queries,
             speedup_constrained=hf_c / ours_c, same_docid_sets=same, same_ranking=same_order,
             gr_jax_unrolled_levels_ms_per_query=1e3 * ours_c_unrolled / n_queries,
             speedup_constrained_unrolled_levels=hf_c / ours_c_unrolled,
             ours_constrained_vs_their_unconstrained=ours_c / hf_u)
        emit(figure="b_constrained_vs_unconstrained", model=model_name, beam=k, ratio=ours_c / ours_u)


# ----------------------------------------------------------------------------------------------------------
# (h): distance to the matmul floor
# ----------------------------------------------------------------------------------------------------------


def decode_matmuls(config: t5.T5Config, trie, batch: int, beams: int, query_len: int, score_mode: str):
    """The matrix products of one constrained T5 search, as the search runs them: [(rows, in, out, count)] for
    the weight matmuls (encoder, cross-attention keys/values, every decoder step's projections and FFN, the
    output projection — over V, or over a level's C candidate slots where `_token_scores` takes that path) and
    the multiply-adds of the attention products, which are no weight matmuls (reported as FLOPs only)."""
    D, F, HQ, V, L = config.d_model, config.d_ff, config.num_heads * config.d_kv, config.vocab_size, query_len
    ff_in = 2 if config.is_gated else 1
    mm = [(batch * L, D, HQ, 4 * config.num_layers), (batch * L, D, F, ff_in * config.num_layers),
          (batch * L, F, D, config.num_layers), (batch * L, D, HQ, 2 * config.num_decoder_layers)]
    attn_macs = 2 * batch * L * L * HQ * config.num_layers
    T = trie.depth
    for d, spec in enumerate(trie.specs):
        R = batch if d == 0 else batch * beams
        n = config.num_decoder_layers
        mm += [(R, D, HQ, 6 * n), (R, D, F, ff_in * n), (R, F, D, n)]
        attn_macs += R * HQ * (2 * T + 2 * L) * n  # self over the cache of T slots, cross over the L query states
        C = spec.num_slots
        if score_mode != "log_softmax" and not spec.dense and C * bs.CANDIDATE_RATIO <= V:
            attn_macs += R * C * D  # candidate logits: a gathered row per slot, no weight matmul
        else:
            mm.append((R, D, V, 1))
    return mm, attn_macs


def matmul_floor(config: t5.T5Config, trie, batch: int, beams: int, query_len: int, score_mode: str) -> dict:
    """The floor of one search on this machine: its weight matmuls and nothing else, one dot each (same shapes
    and count, distinct operands, so nothing is shared or fused) in one jitted program, timed like the search;
    that rate applied to all its FLOPs (the attention products are ~10% of them). ms per batch, GFLOP, and the
    matmul rate reached."""
    mm, attn_macs = decode_matmuls(config, trie, batch, beams, query_len, score_mode)
    rng = np.random.default_rng(0)
    xs, ws = [], []
    for m, k, n, count in mm:
        for _ in range(count):
            xs.append(jnp.asarray(rng.normal(size=(m, k)).astype(np.float32)))
            ws.append(jnp.asarray(rng.normal(size=(k, n)).astype(np.float32) / np.sqrt(k)))

    @jax.jit
    def run(xs, ws):
        return [jnp.dot(x, w) for x, w in zip(xs, ws)]

    t = timed(lambda: run(xs, ws), repeats=10)
    weight_flops = 2.0 * sum(m * k * n * c for m, k, n, c in mm)
    total = weight_flops + 2.0 * attn_macs
    return {"floor_ms": 1e3 * t * total / weight_flops, "gflop": total / 1e9,
            "matmul_gflop_per_s": weight_flops / t / 1e9}


def bench_floor(model_name: str, n_docids: int, beams: list[int], n_queries: int, length: int, vocab: int):
    """(h) Our search in each score mode beside its matmul floor (above), same model, trie and queries."""
    config = t5.get_config(model_name, dropout_rate=0.0).replace(vocab_size=vocab)
    params = t5.init_params(config, seed=0)
    docids = random_docids(n_docids, length, vocab, seed=1)
    docids = np.concatenate([docids, np.full((len(docids), 1), EOS, np.int32)], axis=1)
    index = TrieIndex.build(docids, vocab_size=vocab, eos_id=EOS)
    trie = index.device()
    queries = np.random.default_rng(2).integers(3, vocab, (n_queries, 16)).astype(np.int32)
    for k in beams:
        for mode in ("log_softmax", "renormalized", "raw"):
            searcher = T5Searcher(t5.T5(config), num_beams=k, score_mode=mode, length_penalty=1.0)
            ours = timed(lambda: searcher.search(params, queries, trie).scores, repeats=10)
            floor = matmul_floor(config, trie, n_queries, k, queries.shape[1], mode)
            emit(figure="h_matmul_floor", model=model_name, vocab=vocab, docids=int(len(docids)), beam=k,
                 queries=n_queries, score_mode=mode, slots_per_level=[s.num_slots for s in trie.specs],
                 gflop_per_query=floor["gflop"] / n_queries, ours_ms_per_query=1e3 * ours / n_queries,
                 floor_ms_per_query=floor["floor_ms"] / n_queries,
                 matmul_gflop_per_s=floor["matmul_gflop_per_s"], over_floor=1e3 * ours / floor["floor_ms"])


# ----------------------------------------------------------------------------------------------------------
# (i): the query batch over 1 and 2 devices
# ----------------------------------------------------------------------------------------------------------


def bench_devices_child(n_docids: int, beams: list[int], n_queries: int, length: int):
    """Runs in a process started with 2 host devices: the same search on one device and split over both."""
    from gr_jax.retriever.search import local_mesh

    config = t5.get_config("tiny", dropout_rate=0.0)
    params = t5.init_params(config, seed=0)
    docids = random_docids(n_docids, length, config.vocab_size, seed=1)
    docids = np.concatenate([docids, np.full((len(docids), 1), EOS, np.int32)], axis=1)
    trie = TrieIndex.build(docids, vocab_size=config.vocab_size, eos_id=EOS).device()
    queries = np.random.default_rng(2).integers(3, config.vocab_size, (n_queries, 16)).astype(np.int32)
    mesh = local_mesh()
    for k in beams:
        times, results = {}, {}
        for name, m in (("1", None), (str(mesh.shape["data"]), mesh)):
            searcher = T5Searcher(t5.T5(config), num_beams=k, score_mode="log_softmax", length_penalty=1.0, mesh=m)
            times[name] = timed(lambda: searcher.search(params, queries, trie).scores, repeats=10)
            results[name] = np.asarray(searcher.search(params, queries, trie).tokens)
        n = str(mesh.shape["data"])
        emit(figure="i_devices", model="tiny", docids=int(len(docids)), beam=k, queries=n_queries, devices=int(n),
             ms_per_query_1_device=1e3 * times["1"] / n_queries, ms_per_query_n_devices=1e3 * times[n] / n_queries,
             speedup=times["1"] / times[n], same_docids=float(np.array_equal(results["1"], results[n])))


def bench_devices(n_docids: int, beams: list[int], n_queries: int, length: int, devices: int = 2):
    """(i) XLA's host device count is fixed when JAX starts: the comparison runs in a child process."""
    import os
    import subprocess

    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                                     f"--xla_force_host_platform_device_count={devices}".strip())
    args = [sys.executable, __file__, "--child_devices", json.dumps([n_docids, beams, n_queries, length])]
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    for line in out.stdout.splitlines():
        row = json.loads(line)
        emit(**row)


# ----------------------------------------------------------------------------------------------------------
# (c) + (d): index build, bytes, decode with a trivial model, insert
# ----------------------------------------------------------------------------------------------------------


def _trivial_step(cache, tokens):
    return cache["q"] + cache["table"][tokens], cache


def bench_index(sizes: list[int], length: int = 8, vocab: int = 2048, decode: bool = True):
    for n in sizes:
        docids = random_docids(n, length, vocab, seed=n, low=0)
        gc.collect()
        t0 = time.perf_counter()
        index = TrieIndex.build(docids, vocab_size=vocab)
        build_s = time.perf_counter() - t0
        row = dict(figure="c_build", docids=int(n), length=length, vocab=vocab, build_s=build_s,
                   index_mb=index.nbytes / 2**20, nodes=int(index.num_nodes),
                   dense_levels=[d for d in range(index.depth) if index.decode_dense[d]],
                   max_children=index.max_children, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if decode:
            trie = index.device()
            rng = np.random.default_rng(0)
            B, N = 2, 70
            cache = {"q": jnp.asarray(rng.normal(size=(B, vocab)), jnp.float32),
                     "table": jnp.asarray(rng.normal(size=(vocab, vocab)), jnp.float32)}
            search = jax.jit(lambda c, t: bs.beam_search(_trivial_step, c, t, batch_size=B, num_beams=N,
                                                         score_mode="raw").scores)
            t0 = time.perf_counter()
            jax.block_until_ready(search(cache, trie))
            row["decode_compile_s"] = time.perf_counter() - t0
            row["decode_ms_batch2_beam70"] = 1e3 * timed(lambda: search(cache, trie), repeats=5)
        emit(**row)
        del index
        gc.collect()


def bench_insert(n: int, length: int = 8, vocab: int = 2048):
    docids = random_docids(n, length, vocab, seed=n + 1, low=0)
    cut = int(0.9 * n)
    base = TrieIndex.build(docids[:cut], vocab_size=vocab)
    t0 = time.perf_counter()
    base.insert(docids[cut:], np.arange(cut, n))
    insert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    TrieIndex.build(docids, vocab_size=vocab)
    rebuild_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    base.compact()
    compact_s = time.perf_counter() - t0
    emit(figure="d_insert_10pct", docids=int(n), insert_s=insert_s, rebuild_s=rebuild_s,
         insert_over_rebuild=insert_s / rebuild_s, compact_s=compact_s)


# ----------------------------------------------------------------------------------------------------------


def device_description() -> str:
    d = jax.devices()[0]
    if d.platform == "cpu":
        cpu = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        import os
        return f"CPU ({cpu}), {os.cpu_count()} cores"
    return f"{d.platform.upper()} ({d.device_kind})"


def write_markdown(command: str, path: Path):
    import importlib.metadata as md

    def ver(p):
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return "-"

    lines = [f"\n## bench_decoding — {datetime.date.today().isoformat()}\n",
             f"- device: {device_description()}",
             f"- versions: jax {ver('jax')}, flax {ver('flax')}, torch {ver('torch')}, transformers {ver('transformers')}",
             f"- command: `{command}`\n"]
    for fig in dict.fromkeys(r["figure"] for r in ROWS):
        rows = [r for r in ROWS if r["figure"] == fig]
        keys = [k for k in rows[0] if k != "figure"]
        lines.append(f"**{fig}**\n")
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "---|" * len(keys))
        for r in rows:
            lines.append("| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |")
        lines.append("")
    with benchmark_writer(path, "bench_decoding") as f:
        f.write("\n".join(lines) + "\n")


def bench_tail(n_docids: int = 20_000, batch: int = 64, beams: int = 100, length: int = 4):
    """(g) GLEN: our constrained decoding + collision-free ranking (`methods/glen/model.py`) vs the same algorithm written
    as GLEN's PyTorch code runs it (`methods.glen.torch_reference.glen_rank_torch`: hidden-state feedback with a KV cache, trie masks
    from a nested dict per beam per step, top-K over K × V), same weights and docids (M 3, collisions), tiny
    and small T5, N 10 and 100 (K = 2N); ms/query and whether the ranked lists are identical.
(f) the beam → documents → run tail vs the decoding it follows, tiny T5, batch 64, beam 100, docids
    shared by up to 4 documents: the device gather + array ranker + run construction of today, and the
    per-beam Python loop it replaced (host `TrieIndex.documents` per beam, list ranker)."""
    from gr_jax.compose import retrieve
    from gr_jax.decoding import rankers
    from gr_jax.index.device import leaf_documents
    from gr_jax.retriever.model import GenerativeRetriever

    config = t5.get_config("tiny", dropout_rate=0.0)
    model = GenerativeRetriever(config)
    params = model.init_params(0)
    docids = random_docids(n_docids // 2, length, 512, seed=5)
    seqs = np.concatenate([docids, docids[np.random.default_rng(6).integers(0, len(docids), n_docids - len(docids))]])
    index = TrieIndex.build(np.concatenate([seqs, np.full((len(seqs), 1), EOS, np.int32)], axis=1),
                            np.arange(len(seqs)), vocab_size=config.vocab_size, eos_id=EOS)
    queries = np.random.default_rng(7).integers(3, config.vocab_size, (batch, 16)).astype(np.int32)
    doc_ids = [f"doc{i:06d}" for i in range(len(seqs))]
    payload = index.device_payload()
    decode = timed(lambda: model.predict(params, queries, index, beams).scores)
    res = model.predict(params, queries, index, beams)

    def tail():
        docs, valid = leaf_documents(payload, jnp.where(res.valid, res.leaf_ids, -1))
        docs, valid, scores = jax.device_get((docs, valid, res.scores))
        q, d, s = model.ranker(docs, valid, scores)
        ids = np.asarray(doc_ids, dtype=object)[d]
        bounds = np.searchsorted(q, np.arange(batch + 1))
        s = s.tolist()
        return [dict(zip(ids[bounds[b]:bounds[b + 1]], s[bounds[b]:bounds[b + 1]])) for b in range(batch)]

    def python_loop():
        host = jax.device_get(res)
        out = []
        for b in range(batch):
            beams_b = [index.documents(int(host.leaf_ids[b, n])).tolist() for n in range(beams) if host.valid[b, n]]
            ranked = rankers.first_occurrence(beams_b, host.scores[b][host.valid[b]].tolist())
            out.append({doc_ids[x]: y for x, y in ranked})
        return out

    assert tail() == python_loop()  # the same run either way
    t_tail = timed(tail, sync=lambda out: out)
    t_loop = timed(python_loop, sync=lambda out: out)
    full = timed(lambda: retrieve(model, params, queries, [str(i) for i in range(batch)], index, doc_ids, beams,
                                  batch), sync=lambda out: out)
    emit(figure="f_beam_to_run_tail", docids=len(seqs), batch=batch, beam=beams, max_docs_per_docid=payload.max_docs,
         decode_ms=1e3 * decode, tail_ms=1e3 * t_tail, tail_over_decode=t_tail / decode,
         python_loop_ms=1e3 * t_loop, retrieve_ms=1e3 * full)


# ----------------------------------------------------------------------------------------------------------
# (g): GLEN against its PyTorch decoding
# ----------------------------------------------------------------------------------------------------------


def bench_glen(model_name: str, n_docs: int, beams: list[int], n_queries: int):
    import torch

    from gr_jax.docids.base import DocidTable
    from gr_jax.methods.glen import model as glen
    from gr_jax.methods.glen.parity_reference import glen_rank_torch
    from gr_jax.backbones.t5_parity import load_torch_t5
    from gr_jax.data.vocab import DocidTokenSpace

    torch.set_num_threads(2)
    config = t5.get_config(model_name, dropout_rate=0.0)
    if model_name == "t5_small":
        config = config.replace(vocab_size=2048)
    params = t5.init_params(config, seed=0)
    rng = np.random.default_rng(4)
    distinct = random_docids(int(n_docs * 0.8), 3, config.vocab_size, seed=5)
    tokens = np.concatenate([distinct, distinct[rng.integers(0, len(distinct), n_docs - len(distinct))]])
    weights = rng.normal(3.0, 1.0, tokens.shape).astype(np.float32)
    table = DocidTable(tokens, np.full(n_docs, 3), np.arange(n_docs), DocidTokenSpace("text", config.vocab_size,
                                                                                       length=3), weights)
    index = table.index(vocab_size=config.vocab_size)
    model = glen.GlenRetriever(config, docid_length=3, masked_ids=(2,))
    model.use_docids(table)
    full = {"network": params, "head": {}}
    lengths = rng.integers(4, 17, n_queries)
    mask = (np.arange(16)[None, :] < lengths[:, None]).astype(np.int64)
    queries = rng.integers(3, config.vocab_size, (n_queries, 16)) * mask
    with tempfile.TemporaryDirectory() as tmp:
        t5_convert.save_hf(params, config, Path(tmp) / "hf")
        hf = load_torch_t5(Path(tmp) / "hf")
    for n in beams:
        def ours():
            return model.rank(full, queries, index, n)

        def theirs():
            return glen_rank_torch(hf, queries, mask, tokens, weights, n, (2,))

        t_ours = timed(ours, sync=lambda out: out)  # rank returns host arrays: the time includes the tail
        t_theirs = timed(theirs, sync=lambda out: out)
        q, d, _ = ours()
        mine = [d[q == b].tolist() for b in range(n_queries)]
        same = float(np.mean([a == b for a, b in zip(mine, theirs())]))
        emit(figure="g_glen_vs_pytorch", model=model_name, docs=n_docs, distinct_docids=int(len(distinct)), n=n,
             k=2 * n, queries=n_queries, gr_jax_ms_per_query=1e3 * t_ours / n_queries,
             pytorch_ms_per_query=1e3 * t_theirs / n_queries, speedup=t_theirs / t_ours, same_ranking=same)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument("--no_write", action="store_true", help="print JSON lines only, do not touch BENCHMARKS.md")
    parser.add_argument("--only", choices=["a", "c", "d", "e", "f", "g", "h", "i"], action="append",
                        help="run only these parts")
    parser.add_argument("--e_docids", type=cli.count, default=0,
                        help="(e) with this many docids (default 8.8M; given, (e) runs on any device: a dry run)")
    parser.add_argument("--e_unrolled", action="store_true", help="(e) with T5's layers unrolled (default: scanned)")
    parser.add_argument("--e_config", default="t5_base", help="(e)'s T5 config (another than t5_base: a dry run)")
    parser.add_argument("--child_devices", help=argparse.SUPPRESS)  # (i)'s child process: its arguments as JSON
    args = parser.parse_args(argv)
    setup_logging()
    if args.child_devices:
        bench_devices_child(*json.loads(args.child_devices))
        return 0
    parts = set(args.only or ["a", "c", "d", "e", "f", "g", "h", "i"])
    if "a" in parts:
        try:
            import torch  # noqa: F401
            if args.quick:
                bench_vs_transformers("tiny", 2000, [10], n_queries=8, length=4)
            else:
                bench_vs_transformers("tiny", 10_000, [10, 100], n_queries=16, length=4)
                bench_vs_transformers("t5_small", 10_000, [10, 100], n_queries=16, length=4)
        except ImportError:
            emit(figure="a_vs_transformers", skipped="torch/transformers not installed")
    if "c" in parts:
        bench_index([100_000] if args.quick else [100_000, 1_000_000, 8_800_000])
    if "d" in parts:
        bench_insert(100_000 if args.quick else 1_000_000)
        if not args.quick:
            bench_insert(8_800_000)
    if "f" in parts:
        bench_tail(batch=64, beams=100)
    if "g" in parts:
        try:
            import torch  # noqa: F401
            if args.quick:
                bench_glen("tiny", 2000, [10], n_queries=8)
            else:
                for name in ("tiny", "t5_small"):
                    bench_glen(name, 10_000, [10, 100], n_queries=8)
        except ImportError:
            emit(figure="g_glen_vs_pytorch", skipped="torch/transformers not installed")
    if "h" in parts:
        if args.quick:
            bench_floor("tiny", 2000, [10], n_queries=8, length=4, vocab=512)
        else:
            bench_floor("tiny", 10_000, [10, 100], n_queries=16, length=4, vocab=512)
            bench_floor("tiny", 10_000, [10, 100], n_queries=16, length=4, vocab=32128)  # T5's vocabulary
    if "i" in parts:
        if jax.devices()[0].platform == "cpu":
            bench_devices(2000 if args.quick else 10_000, [10] if args.quick else [10, 100], 16, 4)
        else:
            emit(figure="i_devices", skipped="host devices only: on an accelerator use the lent devices")
    if "e" in parts:
        dry = args.e_config != "t5_base" or jax.devices()[0].platform != "gpu"
        if jax.devices()[0].platform == "gpu" or args.e_docids:  # elsewhere only as a small dry run
            if dry and not args.no_write:
                log.info("(e) without a GPU is a dry run: BENCHMARKS.md is not written")
                args.no_write = True
            bench_gpu(args.e_docids or 8_800_000, scan_layers=not args.e_unrolled, config_name=args.e_config)
        else:
            emit(figure="e_gpu_t5_base", skipped="no GPU on this machine")
    if not args.no_write:
        write_markdown("python tools/bench_decoding.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                       ROOT / "BENCHMARKS.md")
    return 0


def bench_gpu(n_docids: int = 8_800_000, n_queries: int = 16, scan_layers: bool = True, config_name: str = "t5_base"):
    """T5-base (random bf16 weights) over n_docids random L 8 / V 2048 docids. `scan_layers`: one compiled layer
    body per stack instead of 12 unrolled layers per docid level (the unrolled search had not compiled in 120 s on
    an H100)."""
    t0 = time.perf_counter()
    config = t5.get_config(config_name, dropout_rate=0.0, dtype="bfloat16").replace(vocab_size=2048 + 128)
    params = jax.block_until_ready(t5.init_params(config, seed=0))
    log.info("%s parameters in %.1f s", config_name, time.perf_counter() - t0)
    docids = random_docids(n_docids, 8, 2048, seed=3, low=0)
    log.info("%d random docids in %.1f s", n_docids, time.perf_counter() - t0)
    index = TrieIndex.build(docids, vocab_size=config.vocab_size)
    trie = index.device()
    log.info("trie on the device in %.1f s", time.perf_counter() - t0)
    queries = np.random.default_rng(0).integers(3, 2048, (n_queries, 32))
    for k in (10, 100):
        searcher = T5Searcher(t5.T5(config, scan_layers=scan_layers), num_beams=k, score_mode="log_softmax")
        t1 = time.perf_counter()
        jax.block_until_ready(searcher.search(params, queries, trie).scores)
        first = time.perf_counter() - t1  # compilation + one search
        log.info("beam %d: first constrained search (compilation included) %.1f s", k, first)
        c = timed(lambda: searcher.search(params, queries, trie).scores)
        u = timed(lambda: searcher.search_unconstrained(params, queries, 8).scores)
        emit(figure="e_gpu_t5_base", docids=n_docids, beam=k, batch=n_queries, ms_per_query=1e3 * c / n_queries,
             unconstrained_ms_per_query=1e3 * u / n_queries, ratio=c / u, first_call_s=first,
             scan_layers=scan_layers, device=jax.devices()[0].device_kind)


if __name__ == "__main__":
    sys.exit(main())
