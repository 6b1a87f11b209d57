"""The runs a server serves: each command-line spec (`RUN_DIR` or `NAME=RUN_DIR`) becomes one
model id, loaded once at start-up and shared by every request (never copied per request)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from handformer.tasks.lm.run import LMRun
from handformer.tasks.translation.translator import Translator


@dataclass
class ServedModel:
    id: str  # the model id of the API: the run directory's name, or NAME from NAME=RUN_DIR
    run_dir: Path
    task: str  # "lm" or "translation", from the run's config.json
    lm: LMRun | None = None  # set when task == "lm"
    translator: Translator | None = None  # set when task == "translation"
    # Held around every forward pass on this model (the batching engine's steps, the playground's
    # look-ups), so two threads never run the same model at once.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """`RUN_DIR` -> (the directory's name, RUN_DIR); `NAME=RUN_DIR` -> (NAME, RUN_DIR)."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = "", spec
    run_dir = Path(path)
    name = name or run_dir.resolve().name
    if not name.strip() or not path:
        raise ValueError(f"model spec {spec!r} is empty on one side; give RUN_DIR or NAME=RUN_DIR")
    return name, run_dir


def load_served_models(specs: list[str], device: str = "cpu") -> dict[str, ServedModel]:
    """Load every run once; a model id given twice is an error naming both specs."""
    from handformer.inference.prepare import prepare_for_decoding
    from handformer.tasks.lm.run import load_lm
    from handformer.tasks.run_config import RunDir

    if not specs:
        raise ValueError("give at least one run directory to serve")
    seen: dict[str, str] = {}
    models: dict[str, ServedModel] = {}
    for spec in specs:
        name, run_dir = parse_model_spec(spec)
        if name in seen:
            raise ValueError(f"model id {name!r} is given twice ({seen[name]!r} and {spec!r}); "
                             "name one of them with NAME=RUN_DIR")
        seen[name] = spec
        run = RunDir.read(run_dir)  # read once, here and by load_lm
        task = run.task
        if task == "lm":  # loaded through its pipeline, prepared for decoding (tasks/lm/pipeline.py)
            served = ServedModel(name, run_dir, task, lm=load_lm(run, device, decoding=True))
        else:
            served = ServedModel(name, run_dir, task, translator=Translator.load(run, device))
            prepare_for_decoding(served.translator.model)
        models[name] = served
    return models


__all__ = ["ServedModel", "load_served_models", "parse_model_spec"]
