"""Benchmark: `handformer check` on the public code learners copy, one verdict per component.

Each argument is a local working copy of a public repository (its folder named `owner+name`, as a
mirror's is, or `name`); nothing is downloaded and no file of theirs enters this project. For the
repositories below, their learner-facing files are checked; for any other folder, every `.py` file
outside tests. Each file runs through `python -m handformer check FILE --json` in a child process
(the file's own folder as its working directory), and the table lists each component found with its
verdict: PASS, DIFFERS (a documented convention), FAIL, ERROR or NOT CHECKED (with the reason), then
the share of components checked (every verdict but NOT CHECKED).

    python benchmarks/check_public.py /tmp/pub/karpathy+nanoGPT /tmp/pub/rasbt+LLMs-from-scratch ...
    python benchmarks/check_public.py --json table.json FOLDER ...   # the rows as JSON too
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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
        return [folder / f for f in FILES[repo] if (folder / f).is_file()]
    return sorted(p for p in folder.rglob("*.py") if "test" not in p.as_posix().lower())


def check(path: Path, timeout: float) -> dict:
    """`handformer check PATH --json`, run from the file's folder; the parsed result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run([sys.executable, "-m", "handformer", "check", str(path), "--json"],
                              cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout)
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
        lines.append(f"| {r['repository']} | `{r['file']}` | `{r['component']}`{kind} | {r['verdict']} | {why} |")
    checked = sum(r["verdict"] != "NOT CHECKED" for r in rows)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in dict.fromkeys(r["verdict"] for r in rows)}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    share = 100 * checked / max(len(rows), 1)
    lines.append(f"\n{len(rows)} components: {summary}; checked {checked} of {len(rows)} ({share:.0f} %)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="working copies of public repositories")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for one file's check")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows: list[dict] = []
    for folder in args.folders:
        if not folder.is_dir():
            sys.exit(f"{folder}: not a folder (pass a local working copy of the repository)")
        repo = repository(folder)
        for path in files_of(folder, repo):
            rel = path.relative_to(folder).as_posix()
            print(f"checking {repo} {rel} ...", file=sys.stderr, flush=True)
            rows += rows_of(repo, rel, check(path, args.timeout))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
