"""A trained translation run directory, loaded to translate (greedy or beam) and to
show its attention maps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from handformer.config import Seq2SeqConfig
from handformer.data.tokenizer import Tokenizer
from handformer.generation.decoding import DecodeLimits, beam_search, greedy_decode
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.tasks.run_config import RunDir, weights_fix
from handformer.tasks.translation.job import TranslationJob, prep_text
from handformer.training.checkpoint import load_weights


def check_run_dir(run_dir: str | os.PathLike | RunDir) -> RunDir:
    """The run directory read (once: a `RunDir` already read is kept), once it has weights to load."""
    run = RunDir.read(run_dir)
    if not (run.path / "model.safetensors").exists():
        raise FileNotFoundError(f"{run.path} has no model.safetensors yet (training has not reached "
                                f"its first evaluation); if it stopped, {weights_fix(run.path)}")
    return run


def load_tokenizers(run_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    tgt_path = run_dir / "tokenizer.target.json"
    try:
        src = Tokenizer.load(run_dir / "tokenizer.json")
        return src, (Tokenizer.load(tgt_path) if tgt_path.exists() else src)
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"{err}; train the run again: its tokenizers are written as training starts, "
                        "and the weights know the ids of those tokenizers only") from None


@dataclass
class Translator:
    """A trained run directory, ready to translate."""

    model: Seq2SeqTransformer
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    job: TranslationJob
    device: torch.device

    @classmethod
    def load(cls, run_dir: str | os.PathLike | RunDir, device: str = "cpu") -> Translator:
        """The run in `run_dir` (a path, or a `RunDir` already read), ready to translate."""
        run = check_run_dir(run_dir)
        run_dir, config = run.path, run.config
        if config.get("task") != "translation":
            raise ValueError(f"{run_dir} holds a {config.get('task')!r} run, not a translation run; "
                             "continue text with `handformer generate` (or `chat`), or give a run "
                             "trained with task = \"translation\" (`handformer demo` makes one)")
        model_cfg = run.model_config(Seq2SeqConfig)
        try:
            job = TranslationJob.from_dict({k: v for k, v in config.items() if k != "model"})
        except ValueError as err:
            raise ValueError(f"{run_dir / 'config.json'}: {err}") from None
        model = Seq2SeqTransformer(model_cfg)
        load_weights(model, run_dir / "model.safetensors", weights_fix(run_dir))
        src_tok, tgt_tok = load_tokenizers(run_dir)
        dev = torch.device(device)
        return cls(model.to(dev).eval(), src_tok, tgt_tok, job, dev)

    def limits(self) -> DecodeLimits:
        d = self.job.decode
        return DecodeLimits(self.tgt_tok.bos_id, self.tgt_tok.eos_id, self.src_tok.pad_id,
                            d.max_len_a, d.max_len_b)

    def encode_sources(self, texts: list[str]) -> list[list[int]]:
        max_len = min(self.job.data.max_length, self.model.cfg.max_positions)
        out = []
        for ids in self.src_tok.encode_batch([prep_text(t, self.job.data.lowercase) for t in texts]):
            out.append(ids[: max_len - 1] + [self.src_tok.eos_id])
        return out

    def translate_ids(self, texts: list[str], beam: int | None = None, batch_size: int = 64,
                      ) -> tuple[list[list[int]], list[list[int]]]:
        """(source ids, output ids) per text, in input order."""
        beam = self.job.decode.beam if beam is None else beam
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        src_ids = self.encode_sources(texts)
        order = sorted(range(len(texts)), key=lambda i: len(src_ids[i]))
        outputs: list[list[int]] = [[] for _ in texts]
        limits = self.limits()
        for start in range(0, len(order), batch_size):
            chunk = order[start: start + batch_size]
            S = max(len(src_ids[i]) for i in chunk)
            src = torch.full((len(chunk), S), self.src_tok.pad_id, dtype=torch.long)
            for row, i in enumerate(chunk):
                src[row, : len(src_ids[i])] = torch.tensor(src_ids[i])
            src = src.to(self.device)
            if beam == 1:
                hyps = greedy_decode(self.model, src, limits).tolist()
            else:
                hyps = beam_search(self.model, src, limits, beam, self.job.decode.length_penalty)
            for row, i in enumerate(chunk):
                outputs[i] = hyps[row]
        return src_ids, outputs

    def translate(self, texts: list[str], beam: int | None = None) -> list[str]:
        _, outputs = self.translate_ids(texts, beam)
        return [self.tgt_tok.decode(ids) for ids in outputs]


def attention_maps(translator: Translator, text: str, output_ids: list[int] | None = None,
                   ) -> dict[str, object]:
    """Teacher-force the model's own translation of `text` and return every attention map.

    Returns source tokens, target tokens (BOS + output, the decoder's inputs), output tokens (what
    each decoder position predicted: output + EOS) and per-layer weights:
    encoder (H, S, S), decoder self (H, T, T), cross (H, T, S).
    """
    src_ids = translator.encode_sources([text])[0]
    if output_ids is None:
        output_ids = translator.translate_ids([text], beam=1)[1][0]
    tgt_in = [translator.tgt_tok.bos_id] + [i for i in output_ids if i != translator.tgt_tok.eos_id]
    src = torch.tensor([src_ids], device=translator.device)  # (1, S)
    tgt = torch.tensor([tgt_in], device=translator.device)  # (1, T)
    with torch.no_grad():
        out = translator.model(src, tgt, need_weights=True)
    return {
        "source_tokens": translator.src_tok.tokens(src_ids),
        "target_tokens": translator.tgt_tok.tokens(tgt_in),  # decoder inputs: BOS + output
        "output_tokens": translator.tgt_tok.tokens(tgt_in[1:] + [translator.tgt_tok.eos_id]),
        "encoder": [w[0].float().cpu().numpy() for w in out.encoder_attentions],
        "decoder": [w[0].float().cpu().numpy() for w in out.decoder_attentions],
        "cross": [w[0].float().cpu().numpy() for w in out.cross_attentions],
    }
