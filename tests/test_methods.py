"""A method is a folder (DESIGN.md §2): a method package imports gr_jax only through the extension surface
(gr_jax/methods/api.py), never another method, a protocol or a core module directly;
protocols and the composition talk to the model contract (retriever/contract.py) and never probe a model with
`hasattr`/`getattr`; every model object of the library follows the contract. Each check is also run on a
planted violation, to show it can fail."""

import ast
from pathlib import Path

import pytest

from tests.test_repo import ROOT, _import_graph, _under

METHODS = "gr_jax.methods"
API = "gr_jax.methods.api"  # the extension surface: all a method imports of gr_jax besides its own package
NO_PROBING = ("gr_jax/protocols", "gr_jax/compose.py", "gr_jax/run_setup.py")  # talk to the model contract only
TOY = ROOT / "tests" / "toy_method"


def _method_of(module: str):
    """'gr_jax.methods.glen.model' → 'glen'; None outside the methods (and for the extension surface)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and _under(module, (METHODS,)) and module != API else None


def method_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) pairs where a method imports of gr_jax anything but the extension surface and its own
    package: another method, a protocol, or a module of the core directly."""
    out = []
    for module, deps in graph.items():
        own = _method_of(module)
        if own is None:
            continue
        for d in deps:
            if d == API or _method_of(d) == own or d in ("gr_jax", METHODS):
                continue
            out.append((module, d))
    return sorted(out)


def _toy_imports() -> list[str]:
    """The gr_jax modules the toy method package (a method outside the library) imports."""
    found = []
    for path in sorted(TOY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gr_jax"):
                found.append(node.module)
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("gr_jax")]
    return found


def test_a_method_imports_gr_jax_only_through_the_extension_surface():
    graph = _import_graph()
    assert {m for m in graph if _method_of(m)} >= {"gr_jax.methods.glen.model", "gr_jax.methods.pag.model",
                                                   "gr_jax.methods.mdgr.docids", "gr_jax.methods.fewshot.command"}
    assert method_violations(graph) == []
    toy = _toy_imports()
    assert toy and set(toy) == {API}, toy  # the toy method, a package outside gr_jax, too


def test_the_extension_surface_has_a_table_row_for_each_extension_point():
    import gr_jax.methods.api as api

    rows = [line.split("|")[1].strip() for line in api.__doc__.splitlines() if line.startswith("| ")][1:]
    assert rows == ["docid scheme", "objective", "training data", "model contract", "head", "decoding constraint",
                    "ranker", "decoding hooks", "starting checkpoint", "embedder", "trainer hooks", "command",
                    "parity"]
    for name in ("DocidScheme", "ObjectivesConfig", "GenerativeRetriever", "Capabilities", "Constraint",
                 "flat_slots", "initial", "Embedder", "trainer", "Command", "CodebookHead"):
        assert hasattr(api, name), name


def test_the_method_check_sees_a_planted_violation():
    graph = _import_graph()
    graph["gr_jax.methods.pag.model"] = graph["gr_jax.methods.pag.model"] | {"gr_jax.methods.glen.ranker"}
    graph["gr_jax.methods.glen.model"] = graph["gr_jax.methods.glen.model"] | {"gr_jax.protocols.systems"}
    graph["gr_jax.methods.mdgr.ranker"] = graph["gr_jax.methods.mdgr.ranker"] | {"gr_jax.decoding.rankers"}
    assert method_violations(graph) == [("gr_jax.methods.glen.model", "gr_jax.protocols.systems"),
                                        ("gr_jax.methods.mdgr.ranker", "gr_jax.decoding.rankers"),
                                        ("gr_jax.methods.pag.model", "gr_jax.methods.glen.ranker")]


def probes(source: str, filename: str = "<source>") -> list[str]:
    """`hasattr(...)` calls and `getattr(x, name, default)` calls (a probe with a fallback) in Python source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_protocols_and_the_composition_do_not_probe_models():
    files = [p for name in NO_PROBING for p in ([ROOT / name] if name.endswith(".py")
                                                else sorted((ROOT / name).rglob("*.py")))]
    assert len(files) >= 6
    found = [f for p in files for f in probes(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "declare the capability in retriever/contract.py and read it from model.capabilities"


def test_the_probe_check_sees_a_planted_violation():
    planted = (ROOT / "gr_jax" / "protocols" / "query_variation.py").read_text() + (
        "\n\ndef _planted(model):\n    return hasattr(model, 'planner_tokens') or getattr(model, 'mode', None)\n")
    found = probes(planted, "query_variation.py")
    assert len(found) == 2 and "hasattr(model, 'planner_tokens')" in found[0]


def test_every_model_object_follows_the_contract():
    import numpy as np

    from gr_jax.methods.glen.model import GlenRetriever
    from gr_jax.methods.pag.model import PagRetriever
    from gr_jax.retriever import contract
    from gr_jax.backbones import llama, t5
    from gr_jax.retriever.decoder_only import DecoderOnlyRetriever
    from gr_jax.retriever.model import GenerativeRetriever

    config = t5.get_config("tiny", vocab_size=64)
    models = [GenerativeRetriever(config), GlenRetriever(config), PagRetriever(config),
              DecoderOnlyRetriever(llama.get_config("llama_tiny", vocab_size=64))]
    for model in models:
        contract.check(model)
        assert isinstance(model, contract.Retriever)
    planners = [m for m in models if m.capabilities.planner]
    assert [type(m).__name__ for m in planners] == ["PagRetriever"]
    assert isinstance(planners[0], contract.Planner) and contract.planner_of(models[0]) is None
    assert [type(m).__name__ for m in models if m.capabilities.decodes_docids] == ["GlenRetriever"]
    with planners[0].in_mode("simul_only"):
        assert planners[0].mode == "simul_only"
    assert planners[0].mode == "pag"
    with pytest.raises(ValueError, match="does not decode docids"):
        models[0].decode_docids({}, np.zeros((1, 4), np.int32))


def test_the_contract_check_names_what_a_model_object_lacks():
    from gr_jax.retriever import contract
    from gr_jax.retriever.model import GenerativeRetriever
    from gr_jax.backbones import t5

    class NoRank:  # a model object of one's own that forgot `rank`
        def __init__(self):
            inner = GenerativeRetriever(t5.get_config("tiny", vocab_size=64))
            self.config, self.ranker, self.capabilities = inner.config, inner.ranker, inner.capabilities
            for name in ("describe", "init_params", "param_axes", "loss_fn", "use_docids", "decode_docids"):
                setattr(self, name, getattr(inner, name))

    with pytest.raises(TypeError, match=r"NoRank.*has no rank$"):
        contract.check(NoRank())

    class ClaimsAPlanner(NoRank):  # declares a planner and has none of a Planner's members
        def __init__(self):
            super().__init__()
            self.capabilities = contract.Capabilities(planner=True)

        def rank(self, *a):
            return None

    with pytest.raises(TypeError, match="aligned_params, in_mode, mode, planned_mode"):
        contract.check(ClaimsAPlanner())

    class ClaimsATracedSearch(NoRank):  # declares `traced_search` (the t5x adapter's) without `beam_documents`
        def __init__(self):
            super().__init__()
            self.capabilities = contract.Capabilities(traced_search=True)

        def rank(self, *a):
            return None

    with pytest.raises(TypeError, match=r"ClaimsATracedSearch.*has no beam_documents$"):
        contract.check(ClaimsATracedSearch())


def test_gin_registration_walks_the_package():
    """Every module is imported for gin by walking the package: a module added under gr_jax/ needs no list."""
    from gr_jax.runtime import gin_utils

    names = set(gin_utils.register_configurables())
    on_disk = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in (ROOT / "gr_jax").rglob("*.py")}
    skipped = {n for n in on_disk if any(_under(n, (s,)) for s in gin_utils.NOT_FOR_GIN)}
    assert names == on_disk - skipped - {"gr_jax"}
    assert not Path(gin_utils.__file__).read_text().count("from gr_jax.methods")
