"""The lesson keeps its shape: handformer/nn and handformer/models read like the tutorials.

Counted by scripts/lesson_shape.py (its docstring defines a branch and a function's length):
- every `forward` of a lesson file is at most 40 lines and 3 branches; CausalLM's at most 25 lines;
- all lesson files together have at most LESSON_BRANCHES branches. It is a ratchet: a feature that
  adds a branch to the lesson raises the limit in the same commit, and the list below names it;
- nn/ and models/ import nothing of the practitioner rooms (adapters, inference) or of the layers
  above them (training, generation, tasks, serve, ...), and no module of the package imports
  itself back through a circle of imports.
"""

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import lesson_shape  # noqa: E402


@functools.cache
def package_graph() -> dict[str, frozenset[str]]:
    """The package's import graph (2.6 s to compute), once for this module's tests; read only."""
    return {m: frozenset(deps) for m, deps in lesson_shape.import_graph().items()}

# The lesson as the tutorials write it: 40, raised by: packed documents, an AttentionMask the caller
# builds passed to CausalLM.forward 1; partial RoPE (Phi-4-mini) 1, LongRoPE's short and long
# factors 1, a mixture of experts in place of the FFN 1, the router's renormalized top-k 1, a shared
# expert 1, a layer taking its kind's mask (sliding or global, Gemma 2/3) 1, both kinds of mask for a
# model that mixes them 1, global layers' full-length KV cache beside rolling ones 1, a model
# without dropout built with NoDropout (no module call a layer and step for nothing to drop) 1, the
# rolling cache a class of its own beside the plain KVCache (CausalLM.new_cache picks by config) 1,
# attention sinks (gpt-oss) joining the formula's softmax 1, YaRN's ramp rounded to whole dims 1,
# the latent cache of multi-head latent attention (DeepSeek-V3) beside them 1, linear attention's
# states (Qwen3.5) emptied when the cache truncates to 0 1.
LESSON_BRANCHES = 55
FORWARD_LINES, FORWARD_BRANCHES, CAUSAL_LM_FORWARD_LINES = 40, 3, 25

# What a lesson module may import from the package: the config, the models' starting weights, and
# the lesson itself.
LESSON_MAY_IMPORT = ("handformer.config", "handformer.initialization", "handformer.nn", "handformer.models")


def test_every_lesson_forward_fits_on_a_screen():
    forwards = [f for path in lesson_shape.lesson_files() for f in lesson_shape.functions(path)
                if f.name.split(".")[-1] == "forward"]
    assert len(forwards) >= 15, [f.name for f in forwards]  # the count sees every module's forward
    for f in forwards:
        assert f.lines <= FORWARD_LINES and f.branches <= FORWARD_BRANCHES, f
    (causal,) = [f for f in forwards if f.name == "CausalLM.forward"]
    assert causal.lines <= CAUSAL_LM_FORWARD_LINES, causal


def test_the_lesson_files_stay_within_their_branches():
    files = lesson_shape.lesson_files()
    assert {p.name for p in files} >= {"attention.py", "masks.py", "blocks.py", "kv_cache.py",
                                       "causal_lm.py", "seq2seq.py"}
    counts = {p.name: lesson_shape.file_branches(p) for p in files}
    assert sum(counts.values()) <= LESSON_BRANCHES, counts


def test_the_counter_counts_what_it_says(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "def f(x, y):\n"
        "    '''A docstring\n    of two lines.'''\n"
        "    if x is None:\n        raise ValueError('x')\n"  # a guard: not a branch
        "    if x:\n        y = 1\n    elif y:\n        y = 2\n"  # two
        "    z = [a for a in y if a]\n"  # one
        "    return x if z else y\n"  # one
        "def g(v):\n    match v:\n        case 1:\n            return 1\n        case _:\n            return 2\n")
    f, g = lesson_shape.functions(source)
    assert (f.name, f.branches, f.lines) == ("f", 4, 9)
    assert (g.name, g.branches) == ("g", 2)
    assert lesson_shape.file_branches(source) == 6


def test_the_lesson_imports_only_the_lesson():
    graph = package_graph()
    lesson = {m: deps for m, deps in graph.items() if m.startswith(("handformer.nn", "handformer.models"))}
    assert "handformer.nn.attention" in lesson and "handformer.models.causal_lm" in lesson
    for module, deps in lesson.items():
        outside = sorted(d for d in deps if not d.startswith(LESSON_MAY_IMPORT))
        assert not outside, f"{module} imports {outside}"


def test_no_module_imports_itself_through_a_circle():
    graph = package_graph()
    assert len(graph) > 100
    assert lesson_shape.cycles(graph) == []
    assert lesson_shape.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def diagram_rooms() -> list[set[str]]:
    """The rooms of docs/architecture.md's diagram, lowest first: each group between two `v`
    arrows, as the package's module prefixes it names (`nn/` -> handformer.nn, `config.py` ->
    handformer.config)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = text.split("## The rooms and the direction of imports", 1)[1].split("```", 2)[1]
    groups = []
    for group in diagram.split("\n    |\n    v\n"):
        names = set()
        for line in group.splitlines():
            for word in line.split():
                if word.endswith("/") and not line.startswith(" "):
                    names.add("handformer." + word.rstrip("/"))
                    break
            names |= {"handformer." + w[:-3] for w in line.split() if w.endswith(".py") and line[:1] != " "
                      and not line.split()[0].endswith("/")}
        groups.append(names)
    return groups


def test_imports_go_one_way_through_the_rooms_of_the_architecture_page():
    """A module imports only modules of its own room or of rooms below it, in the order
    docs/architecture.md draws them (the package root and __main__ sit above them all)."""
    rooms = diagram_rooms()
    assert [sorted(r)[:1] for r in rooms[:3]] == [["handformer.config"], ["handformer.nn"], ["handformer.models"]]
    assert {"handformer.tasks"} in rooms and {"handformer.cli"} in rooms

    def rank(module: str) -> int | None:
        for i, room in enumerate(rooms):
            if any(module == name or module.startswith(name + ".") for name in room):
                return i
        return None

    graph = package_graph()
    unplaced = sorted(m for m in graph if rank(m) is None and m not in ("handformer", "handformer.__main__"))
    assert not unplaced, f"modules in no room of the diagram: {unplaced}"
    upward = [f"{m} -> {d}" for m, deps in graph.items() for d in deps
              if rank(m) is not None and rank(d) is not None and rank(d) > rank(m)]
    assert not upward, upward


def test_the_practitioner_rooms_reach_the_model_only_from_outside():
    """LoRA lives in handformer/adapters, fusion, packing and quantization in handformer/inference;
    training and generation do not import them to do their own work (the checkpoint asks a
    module whether it adapts a frozen base; generate's thread choice is inference's)."""
    graph = package_graph()
    rooms = ("handformer.adapters", "handformer.inference")
    assert not [d for d in graph["handformer.training.checkpoint"] if d.startswith(rooms)]
    assert not (ROOT / "handformer" / "nn" / "lora.py").exists()
    assert {"handformer.inference.fuse", "handformer.inference.packed_linear", "handformer.inference.quant",
            "handformer.inference.quant_int4", "handformer.adapters.lora"} <= set(graph)


def test_the_families_room_sits_on_the_lesson_and_every_model_is_built_through_it():
    """handformer/families imports the lesson (and replace.py) only, nothing imports it from below,
    and no module of the package builds `CausalLM(cfg)` itself: a family's variants would be
    missing (families.build_causal_lm is the one place)."""
    import ast

    graph = package_graph()
    room = {m: deps for m, deps in graph.items() if m.startswith("handformer.families")}
    allowed = LESSON_MAY_IMPORT + ("handformer.families", "handformer.replace", "handformer.settings")
    assert room and all(d.startswith(allowed) for deps in room.values() for d in deps), room
    builders = []
    for path in (ROOT / "handformer").rglob("*.py"):
        if path.parts[-2:] in (("models", "causal_lm.py"), ("families", "__init__.py")):
            continue
        source = path.read_text(encoding="utf-8")
        if "CausalLM" not in source:  # a file that never spells the name cannot call it: not parsed
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CausalLM":
                builders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not builders, builders
