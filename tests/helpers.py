"""Helpers shared by test modules (imported as `helpers`: pytest puts this folder on sys.path)."""

import dataclasses
import importlib
import os
import shutil
from pathlib import Path

import pytest

# Set by .ci/run: a missing reference library, browser or font fails the suite instead of skipping
# the tests that need it (locally they are skipped, and pytest's summary counts the skips).
REQUIRE_ENV = "HANDFORMER_REQUIRE_REFERENCES"


# Debian's /usr/bin/chromium is a shell script that adds extension flags (--enable-remote-extensions,
# --load-extension) before it runs /usr/lib/chromium/chromium: the binary itself starts 1.5-3 s sooner
CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", "/usr/bin/chromium", shutil.which("chromium") or "")
                 if p and Path(p).is_file()), None)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def references_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def missing(reason: str) -> None:
    """A test's reference is missing: fail under HANDFORMER_REQUIRE_REFERENCES=1, else skip the module."""
    if references_required():
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set: references are required)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def dataset_file(name: str, file: str = ""):
    """A public dataset's file (or, with no file, its folder) through handformer's lookup
    ($HANDFORMER_DATA, the user's cache, ../shared/data beside the clone; never a download), or
    fail/skip (see `missing`) saying how to get it."""
    from handformer.data.lookup import ENV, find, find_folder

    found = find(name, file) if file else find_folder(name)
    if found is None:
        missing(f"the {name} dataset is not on this machine: run `handformer data get {name}`, or set "
                f"{ENV} to a folder holding {name}/ (docs/data.md)")
    return found


def require_module(name: str, install: str):
    """Import a reference library, or fail/skip (see `missing`) saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing(f"{name} is not importable ({err}); {install}")


def randomize_hf(model, scale: float):
    """Hugging Face's init leaves norms at 1 and biases at 0, which would hide a swapped mapping:
    norm gains become 1 + N(0, 0.2), norm biases N(0, 0.2), every other tensor N(0, scale)."""
    import torch  # here, so that importing helpers stays cheap for test_references_required

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or ".ln_" in name):
                p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith("weight") else 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.eval()


def make_translation_run(run_dir, layers: int = 2, max_len_b: int = 6):
    """A random (untrained) encoder-decoder run: `layers` encoder and decoder layers, 2 heads."""
    import torch

    from handformer.config import Seq2SeqConfig
    from handformer.data.tokenizer import Tokenizer
    from handformer.models.seq2seq import Seq2SeqTransformer
    from handformer.tasks.translation.job import TranslationJob
    from handformer.tasks.translation.train import save_run_config
    from handformer.training.checkpoint import save_weights

    tok = Tokenizer.train_char(["the first of may, twenty twenty", "2020-05-01"])
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16,
                        n_heads=2, d_ff=32, n_encoder_layers=layers, n_decoder_layers=layers,
                        max_positions=64, dropout=0.0, pad_id=tok.pad_id)
    run_dir.mkdir(parents=True)
    save_weights(Seq2SeqTransformer(cfg), run_dir / "model.safetensors")
    tok.save(run_dir / "tokenizer.json")
    save_run_config(run_dir, cfg, TranslationJob.from_dict(
        {"decode": {"beam": 1, "max_len_a": 0.0, "max_len_b": max_len_b}}))
    return run_dir


def kill_9_after_first_checkpoint(train_args, out_dir) -> None:
    """Run `handformer train *train_args --out out_dir` in a child process (one thread) and `kill -9`
    it as soon as its first checkpoint.safetensors exists; fails if it could not be killed so."""
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "handformer", *train_args, "--out", str(out_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (out_dir / "checkpoint.safetensors").exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        returncode = proc.wait(timeout=60)
        proc.stderr.close()
    assert returncode == -signal.SIGKILL


def bare_packages(*packages: str) -> str:
    """Python source for a child process: PACKAGES (dotted names, "handformer" first) registered as
    bare packages of this checkout's folders, so that the child imports one module of them without
    running their __init__ files (the package root's models import torch: seconds of a child's
    start on a loaded 2-core machine, for a module that needs none of it)."""
    root = Path(__file__).resolve().parent.parent
    lines = ["import sys, types"]
    for name in packages:
        folder = root.joinpath(*name.split("."))
        lines.append(f"sys.modules[{name!r}] = types.ModuleType({name!r}); "
                     f"sys.modules[{name!r}].__path__ = [{str(folder)!r}]")
    return "\n".join(lines) + "\n"


def scaled_seq2seq(seed: int, *, vocab: int, scale: float, n_decoder_layers: int, max_positions: int,
                   dropout: float = 0.0, norm_placement: str = "post"):
    """A random 1-encoder-layer, 16-wide encoder-decoder (eval mode) with its matrices scaled by
    `scale`, so next-token distributions are far from flat (decoding tests)."""
    import torch

    from handformer.config import Seq2SeqConfig
    from handformer.models.seq2seq import Seq2SeqTransformer

    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=n_decoder_layers, dropout=dropout,
                        max_positions=max_positions, norm_placement=norm_placement)
    model = Seq2SeqTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model.eval()


def random_sources(seed: int, lengths: list[int], vocab: int, pad: int = 0, eos: int = 2, first: int = 3):
    """(B, S) right-padded sources of the given real lengths (EOS included), content ids in
    [first, vocab)."""
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    src = torch.full((len(lengths), max(lengths)), pad)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(first, vocab, (n - 1,), generator=g)
        src[i, n - 1] = eos
    return src


def spawn_ranks(fn, *args, world: int = 2) -> None:
    """Run fn(rank, port, *args) in `world` processes forked from this one. The rendezvous store is
    served from this process on a port the system picks (port 0) and held open while they run, so no
    other program (or another pytest worker) can take the port between choosing it and using it. The
    ranks join with `join_ranks`. Forked, not spawned: a spawned rank imports torch and the test
    module again (2-3 s a rank on the 2-core machine); a forked one starts with them, and takes one
    torch thread before any work (as a DataLoader worker does), so no OpenMP pool crosses the fork."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    try:
        mp.start_processes(fn, args=(store.port, *args), nprocs=world, join=True, start_method="fork")
    finally:
        del store


def join_ranks(rank: int, port: int, world: int = 2) -> None:
    """In a rank started by `spawn_ranks`: one torch thread, then join the gloo group through the
    parent's store."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # for code that reads them
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


@dataclasses.dataclass
class NoSettings:
    """The settings of an experiment that has none (module-level: a spawned worker unpickles it)."""


def trial_telling_where_it_ran(variant: str, seed: int, settings: NoSettings):
    """An experiment's trial that trains nothing: its metrics are the process it ran in and that
    process's torch thread count (module-level: a spawned worker unpickles it)."""
    import torch

    from handformer.experiments.runner import Trial

    return Trial(variant, seed, {"pid": float(os.getpid()), "threads": float(torch.get_num_threads())},
                 {"train": [(1, 1.0), (2, 0.5)]})



def statuses(result) -> dict[str, str]:
    """A check result's components, name -> status."""
    return {c.name: c.status for c in result.components}


def component(result, name: str):
    """The component of a check result called `name`."""
    return next(c for c in result.components if c.name == name)


def assert_failed_at(result, name: str, line: str) -> None:
    """A FAIL that names `name` (when given; else quotes the planted `line`)."""
    from handformer.check.core.report import format_report

    found = [f for c in result.components if c.status == "fail" for f in c.findings]
    named = name in {f.name for f in found} if name else any(line in (f.code or "") for f in found)
    assert found and named, format_report(result)


def planted_copy(folder: Path, name: str, source: Path, *edits: tuple[str, str]) -> str:
    """`source` with each (old, new) edit made at old's first occurrence (each old must occur), written
    to folder/<name>.py: a planted mistake's file; its path."""
    text = source.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, (name, old)
        text = text.replace(old, new, 1)
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return str(path)
