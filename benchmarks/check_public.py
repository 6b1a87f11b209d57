"""Benchmark: `handformer check` on the public code learners copy, one verdict per component.

Each argument is a local working copy of a public repository (its folder named `owner+name`, as a
mirror's is, or `name`); nothing is downloaded and no file of theirs enters this project. For the
repositories below, their learner-facing files are checked; for any other folder, every `.py` file
outside tests. Each file runs through `python -m handformer check FILE --json` in a child process
(the repository's root as its working directory and on its import path, as its README runs it), and
the table lists each component found with its verdict: PASS, DIFFERS (a documented convention),
FAIL, ERROR or NOT CHECKED (with the reason), then the share of components checked (every verdict
but NOT CHECKED).

A notebook (`.ipynb`) or a d2l chapter (`.md`) is not Python: its code cells (for d2l, the
PyTorch tab: cells marked `#@tab pytorch` or `#@tab all`; IPython lines such as `%matplotlib` or
`!pip` left out) are written, in order, to a temporary `.py` outside this project, which is checked
and deleted; the table names the notebook or chapter. The book's own `d2l` package (in the
repository) imports torchvision at its top for its image chapters; where torchvision is not
installed, a temporary folder on the import path holds a stand-in for it when a chapter is checked
(any name it is asked for is an empty module), which the attention chapters never call; Meta's
layers import fairscale, whose stand-in there is what fairscale is with one process (its parallel
layers nn.Linear and nn.Embedding). A file the copy holds empty (a snapshot that left its largest
files out) is skipped.

    python benchmarks/check_public.py /tmp/pub/karpathy+nanoGPT /tmp/pub/rasbt+LLMs-from-scratch ...
    python benchmarks/check_public.py --json table.json FOLDER ...   # the rows as JSON too
    python benchmarks/check_public.py --rows a.json b.json            # saved runs as one table
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# repository -> its files a learner reads and copies (paths inside the repository)
FILES = {
    "karpathy/nanoGPT": ["model.py"],
    "karpathy/ng-video-lecture": ["bigram.py", "gpt.py"],
    "rasbt/LLMs-from-scratch": ["pkg/llms_from_scratch/ch03.py", "pkg/llms_from_scratch/ch04.py",
                                "pkg/llms_from_scratch/ch05.py", "pkg/llms_from_scratch/llama3.py",
                                "pkg/llms_from_scratch/qwen3.py"],
    "meta-llama/llama": ["llama/model.py", "llama/generation.py"],
    "jingyaogong/minimind": ["model/model_minimind.py"],
    "karpathy/minGPT": ["mingpt/model.py"],
    "meta-llama/llama3": ["llama/model.py", "llama/generation.py"],
    "harvardnlp/annotated-transformer": ["the_annotated_transformer.py", "AnnotatedTransformer.ipynb"],
    "d2l-ai/d2l-zh": [f"chapter_attention-mechanisms/{c}.md" for c in (
        "attention-scoring-functions", "multihead-attention", "self-attention-and-positional-encoding",
        "transformer")],
    "hyunwoongko/transformer": [f"models/{f}.py" for f in (
        "layers/scale_dot_product_attention", "layers/multi_head_attention", "layers/layer_norm",
        "layers/position_wise_feed_forward", "embedding/positional_encoding", "blocks/encoder_layer",
        "blocks/decoder_layer", "model/transformer")],
    "jadore801120/attention-is-all-you-need-pytorch": [f"transformer/{f}.py" for f in (
        "Modules", "SubLayers", "Layers", "Models")],
    "bentrevett/pytorch-seq2seq": ["legacy/6 - Attention is All You Need.ipynb"],
    "pytorch-labs/gpt-fast": ["model.py"],
    "karpathy/llama2.c": ["model.py"],
    "karpathy/build-nanogpt": ["train_gpt2.py"],
    "karpathy/nanochat": ["nanochat/gpt.py"],
    "hkproj/pytorch-llama": ["model.py"],
    "hkproj/pytorch-transformer": ["model.py"],
    "datawhalechina/tiny-universe": ["content/TinyTransformer/tiny_transformer.py",
                                     "content/TinyLLM/code/model.py"],
    "datawhalechina/happy-llm": ["docs/chapter2/code/transformer.py", "docs/chapter5/code/k_model.py"],
    "rasbt/reasoning-from-scratch": ["reasoning_from_scratch/qwen3.py"],
    "google/gemma_pytorch": ["gemma/model.py"],
    "openai/gpt-oss": ["gpt_oss/torch/model.py"],
    "deepseek-ai/DeepSeek-V3": ["inference/model.py"],
    "karpathy/minbpe": ["minbpe/base.py", "minbpe/basic.py", "minbpe/regex.py"],
}
VERDICT = {"pass": "PASS", "differs": "DIFFERS", "fail": "FAIL", "error": "ERROR", "todo": "NOT IMPLEMENTED",
           "not_checked": "NOT CHECKED"}


def repository(folder: Path) -> str:
    """owner/name from a folder named owner+name; else the name of the known repository it ends with."""
    name = folder.resolve().name
    if "+" in name:
        return name.replace("+", "/", 1)
    return next((repo for repo in FILES if repo.split("/")[1] == name), name)


def files_of(folder: Path, repo: str) -> list[Path]:
    if repo in FILES:
        return [folder / f for f in FILES[repo] if (folder / f).is_file() and (folder / f).stat().st_size]
    return sorted(p for p in folder.rglob("*.py") if "test" not in p.as_posix().lower())


def code_cells(path: Path) -> str:
    """The Python of a notebook's code cells, or of a d2l chapter's PyTorch cells, in order; IPython
    lines (`%...`, `!...`) left out."""
    if path.suffix == ".ipynb":
        cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                 if c["cell_type"] == "code"]
    else:  # d2l: ```{.python .input} cells; the PyTorch tab is `#@tab pytorch` (or all)
        cells, text = [], path.read_text(encoding="utf-8")
        for cell in re.findall(r"```\{\.python \.input[^}]*\}\n(.*?)```", text, re.S):
            tab = re.match(r"\s*#@tab ([^\n]*)", cell)
            if tab and re.search(r"\b(pytorch|all)\b", tab.group(1)):
                cells.append(cell)
    keep = [line for cell in cells for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(keep) + "\n"


_LINEAR = ("class {0}(nn.Linear):\n"
           "    def __init__(self, in_features, out_features, bias=True, *args, **kwargs):\n"
           "        super().__init__(in_features, out_features, bias=bias)\n\n\n")
# the packages a repository imports that are not installed here, as stand-ins (module path -> source):
# torchvision (d2l's package imports it at its top for its image chapters; any name is an empty module),
# fairscale (Meta's layers: with one process its parallel layers are nn.Linear and nn.Embedding),
# triton (DeepSeek's kernels, which its bf16 layers never call: only their decorators run at import)
STAND_INS = {
    "torchvision": '"""A stand-in: any name is an empty module."""\nimport types\n\n\n'
                   "def __getattr__(name):\n    return types.ModuleType(f'torchvision.{name}')\n",
    "fairscale": '"""A stand-in for fairscale with one process."""\n',
    "fairscale.nn": "", "fairscale.nn.model_parallel": "",
    "fairscale.nn.model_parallel.initialize": "def get_model_parallel_world_size():\n    return 1\n\n\n"
                                              "def get_model_parallel_rank():\n    return 0\n\n\n"
                                              "def model_parallel_is_initialized():\n    return True\n\n\n"
                                              "def initialize_model_parallel(*args, **kwargs):\n    pass\n",
    "triton": '"""A stand-in: its decorators leave a function as it is (nothing runs it without a GPU)."""\n'
              "def jit(fn=None, **kwargs):\n    return fn if fn is not None else (lambda f: f)\n\n\n"
              "def autotune(*args, **kwargs):\n    return lambda fn: fn\n\n\n"
              "def cdiv(a, b):\n    return -(-a // b)\n\n\n"
              "class Config:\n    def __init__(self, *args, **kwargs):\n"
              "        self.args, self.kwargs = args, kwargs\n",
    "triton.language": "def __getattr__(name):\n    return object\n",
    "fairscale.nn.model_parallel.layers": "from torch import nn\n\n\n"
    + _LINEAR.format("ColumnParallelLinear") + _LINEAR.format("RowParallelLinear")
    + "class ParallelEmbedding(nn.Embedding):\n"
    "    def __init__(self, num_embeddings, embedding_dim, *args, **kwargs):\n"
    "        super().__init__(num_embeddings, embedding_dim)\n\n\n"
    "VocabParallelEmbedding = ParallelEmbedding\n",
}


def stand_ins(folder: Path, tops: set[str]) -> None:
    """Write the stand-in of each package in `tops` (of STAND_INS) that is not installed into `folder`."""
    missing = {top for top in tops if importlib.util.find_spec(top) is None}
    for name, source in STAND_INS.items():
        if name.split(".")[0] not in missing:
            continue
        parts = name.split(".")
        package = any(other.startswith(name + ".") for other in STAND_INS)
        path = folder.joinpath(*parts, "__init__.py") if package else folder.joinpath(*parts[:-1],
                                                                                       parts[-1] + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")


def _imports(folder: Path, top: str) -> bool:
    """Whether a Python file of `folder` imports the package `top`."""
    pattern = re.compile(rf"^\s*(import|from)\s+{top}\b", re.M)
    return any(pattern.search(f.read_text(encoding="utf-8", errors="replace")) for f in folder.glob("*.py"))


def check(path: Path, timeout: float, root: Path | None = None) -> dict:
    """`handformer check PATH --json`, run from the repository's root with the stand-ins on the
    import path (a notebook or chapter as its code cells, in a temporary file outside the project);
    the parsed result."""
    root = root or path.parent
    with tempfile.TemporaryDirectory(prefix="check-public-") as tmp:
        # torchvision for d2l's chapters alone, triton for a folder that imports it (DeepSeek's kernel.py):
        # a stand-in of either would break transformers' import (minimind's PreTrainedModel)
        wanted = {"fairscale", *(["torchvision"] if path.suffix == ".md" else []),
                  *(["triton"] if _imports(path.parent, "triton") else [])}
        stand_ins(Path(tmp), wanted)
        if path.suffix in (".ipynb", ".md"):
            try:
                cells = code_cells(path)
            except (ValueError, KeyError) as err:  # a broken notebook
                return {"error": {"message": f"not a readable notebook ({type(err).__name__}: {err})"},
                        "components": []}
            path = Path(tmp) / (re.sub(r"\W+", "_", path.stem).strip("_") + ".py")
            path.write_text(cells, encoding="utf-8")
        return _run(path, timeout, root, [str(ROOT), tmp, str(root)])


def _run(path: Path, timeout: float, root: Path, paths: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "LANG": "C.UTF-8"}
    try:
        # 60 s a step: a busy machine imports transformers (minimind's file) slower than check's 20 s
        command = [sys.executable, "-m", "handformer", "check", str(path), "--json", "--time-limit", "60"]
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": {"message": f"over {timeout:g} s"}, "components": []}
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"error": {"message": (done.stderr.strip().splitlines() or ["no output"])[-1]},
                "components": []}


def reason(comp: dict) -> str:
    """Why a component is NOT CHECKED, FAIL or ERROR, in one short line."""
    if comp.get("findings"):
        return ", ".join(f["name"] for f in comp["findings"])
    err = comp.get("error") or {}
    if err:
        return err.get("message", "").splitlines()[0][:110]
    failed = [c["name"]["en"] for c in comp.get("checks", []) if not c["ok"]]
    return "; ".join(failed)[:110]


def rows_of(repo: str, rel: str, result: dict) -> list[dict]:
    if not result.get("components"):
        why = (result.get("error") or {}).get("message", "nothing found").splitlines()[0][:110]
        return [{"repository": repo, "file": rel, "component": "(the file)", "kind": "",
                 "verdict": "NOT CHECKED", "why": why}]
    rows = []
    for comp in result["components"]:
        verdict = VERDICT.get(comp["status"], comp["status"])
        rows.append({"repository": repo, "file": rel, "component": comp["name"], "kind": comp["kind"],
                     "verdict": verdict, "why": "" if verdict in ("PASS", "DIFFERS") else reason(comp)})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| repository | file | component (kind) | verdict | why |", "|---|---|---|---|---|"]
    for r in rows:
        kind = f" ({r['kind']})" if r["kind"] else ""
        why = r["why"].replace("|", "/")
        component = f"`{r['component']}`{kind}"
        lines.append(f"| {r['repository']} | `{r['file']}` | {component} | {r['verdict']} | {why} |")
    checked = sum(r["verdict"] != "NOT CHECKED" for r in rows)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in dict.fromkeys(r["verdict"] for r in rows)}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    share = 100 * checked / max(len(rows), 1)
    lines.append(f"\n{len(rows)} components: {summary}; checked {checked} of {len(rows)} ({share:.0f} %)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="working copies of public repositories")
    parser.add_argument("--rows", nargs="+", type=Path, default=[],
                        help="rows saved with --json, joined into one table")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for one file's check")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows: list[dict] = [row for saved in args.rows for row in json.loads(saved.read_text())]
    for folder in args.folders:
        if not folder.is_dir():
            sys.exit(f"{folder}: not a folder (pass a local working copy of the repository)")
        repo = repository(folder)
        for path in files_of(folder, repo):
            rel = path.relative_to(folder).as_posix()
            print(f"checking {repo} {rel} ...", file=sys.stderr, flush=True)
            rows += rows_of(repo, rel, check(path, args.timeout, folder.resolve()))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
