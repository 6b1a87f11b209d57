"""Helpers the subcommands share: --set overrides, tables, stdin input, speculation flags."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse prints the message and exits with code 2)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def non_negative_float(text: str) -> float:
    """An argparse type: a number >= 0 (a temperature; 0 = greedy)."""
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def probability(text: str) -> float:
    """An argparse type: a number in (0, 1] (top-p's probability mass)."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, got {text}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
    return value


def parse_value(text: str) -> Any:
    """'3' -> 3, '0.1' -> 0.1, 'true' -> True, 'none' -> None, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r} (e.g. --set threads=1)")
        key, value = pair.split("=", 1)
        out[key.strip()] = parse_value(value)
    return out


def job_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from handformer.tasks.job_file import apply_overrides, load_job_file

    return apply_overrides(load_job_file(args.config), parse_overrides(args.set))


def print_table(rows: list[tuple[str, ...]], headers: tuple[str, ...], width: int = 48) -> None:
    cut = [tuple(c if len(c) <= width else c[: width - 1] + "…" for c in row) for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cut)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cut:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def device_arg(name: str) -> str:
    """The type of every --device option: a device torch knows and this machine has."""
    if name == "cpu":
        return name
    from handformer.training.loop import pick_device

    try:
        pick_device(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return name


def read_inputs(text: str | None) -> list[str]:
    """TEXT as one input, else one input per stdin line, blank lines kept (the outputs stay aligned
    with the lines they come from). A blank TEXT is an error."""
    if text is not None:
        if not text.strip():
            raise ValueError("TEXT is empty: give some text, or leave TEXT out to read lines from stdin")
        return [text]
    return [line.rstrip("\r\n") for line in sys.stdin]


def unseen_notice(tokenizer: Any) -> Callable[[str], None]:
    """A function of each input that says once, on stderr, which of its characters a character
    tokenizer never saw: each reaches the model as <unk> (the tokenizer's contract), so the
    model reads something other than what was typed."""
    said = False

    def notice(text: str) -> None:
        nonlocal said
        note = None if said else tokenizer.unseen_note(text)
        if note is not None:
            print(f"note: {note}", file=sys.stderr, flush=True)
            said = True
    return notice


def run_task(run_dir: str) -> str | None:
    """The task recorded in a run directory's config.json (None when there is none to read)."""
    path = Path(run_dir) / "config.json"
    try:
        return json.loads(path.read_text()).get("task")
    except (OSError, ValueError, AttributeError):
        return None


def report_import(result: Any, run_dir: str) -> int:
    """What `import-hf` and `import-llama2c` print once a run is written: the summary, any notes,
    and the command to try it."""
    print(f"imported {result.summary()}")
    for note in result.notes:
        print(f"note: {note}")
    print(f'next: handformer generate {run_dir} --prompt "Once upon a time" --temperature 0')
    return 0


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    """--speculate K and --draft RUN_DIR (generate, chat)."""
    p.add_argument("--speculate", type=positive_int, default=None, metavar="K",
                   help="speculative decoding: guess up to K tokens ahead and check them in one forward "
                        "(same tokens when greedy, same distribution when sampling; fewer guesses after "
                        "a rejection); guesses come from the context itself (prompt lookup) unless "
                        "--draft is given")
    p.add_argument("--draft", default=None, metavar="RUN_DIR",
                   help="a smaller run with the same tokenizer that drafts the guesses "
                        "(implies --speculate 7)")


def speculation_from_args(args: argparse.Namespace) -> Any:
    """The Speculation the flags ask for (loading the draft run), or None."""
    if args.speculate is None and args.draft is None:
        return None
    from handformer.generation.sampling import Speculation
    from handformer.tasks.lm.run import load_lm

    draft = None if args.draft is None else load_lm(args.draft, args.device, decoding=True).model
    return Speculation(args.speculate or Speculation.tokens, draft_model=draft)  # K: the dataclass' default
