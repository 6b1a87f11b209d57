"""The translation job: from a config to a trained encoder-decoder run directory, and back from a
run directory to translations and BLEU. Glue between data, tokenizers, model, loop and decoding.

A run directory holds:
    config.json              model, train, data and decode sections
    tokenizer.json           source tokenizer (or the joint one)
    tokenizer.target.json    target tokenizer, when source and target vocabularies are separate
    model.safetensors        best weights by validation loss
    checkpoint.safetensors   everything needed to resume
    metrics.jsonl            one JSON object per logged step
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from handformer import distributed
from handformer.checkpoint import load_weights
from handformer.config import Seq2SeqConfig, dataclass_from_dict
from handformer.data.batching import Seq2SeqBatch, Seq2SeqData, encode_pairs
from handformer.data.dates import date_pairs
from handformer.data.parallel import ParallelData, read_parallel
from handformer.decoding import DecodeLimits, beam_search, greedy_decode
from handformer.io import atomic_write_text
from handformer.losses import token_cross_entropy
from handformer.seq2seq import Seq2SeqTransformer
from handformer.tokenizer import Tokenizer
from handformer.train import TrainConfig, TrainResult, train_new_model


@dataclass
class TranslationDataConfig:
    train: str | list[str] = "dates"  # "dates" (embedded task), a TSV path, or [source, target] paths
    val: str | list[str] | None = None  # same forms; with "dates" the held-out split is used
    test: str | list[str] | None = None
    n_train: int = 20000  # embedded task only: training pairs
    n_heldout: int = 500  # embedded task only: held-out pairs (val = test)
    tokenizer: str = "bpe"  # bpe | char (source, or both when joint)
    target_tokenizer: str | None = None  # bpe | char | None = same as tokenizer
    joint_vocab: bool = True  # one vocabulary for source and target (allows shared embeddings)
    vocab_size: int = 8000  # BPE vocabulary size (per side when not joint)
    lowercase: bool = False  # lowercase all text before tokenizing
    max_length: int = 128  # tokens per side (EOS included); longer examples are cut and counted
    max_tokens: int = 4096  # padded tokens per batch
    seed: int = 0  # the embedded task's seed

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TranslationDataConfig:
        return dataclass_from_dict(cls, data, "data")


@dataclass
class DecodeConfig:
    beam: int = 4  # beam size; 1 = greedy
    length_penalty: float = 0.6  # score / length^length_penalty
    max_len_a: float = 1.5  # output length limit: a * source length + b
    max_len_b: int = 10

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeConfig:
        return dataclass_from_dict(cls, data, "decode")


@dataclass
class TranslationJob:
    model: dict[str, Any] = field(default_factory=dict)  # Seq2SeqConfig fields (vocab sizes are filled in)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: TranslationDataConfig = field(default_factory=TranslationDataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TranslationJob:
        unknown = sorted(set(data) - {"model", "train", "data", "decode", "task"})
        if unknown:
            raise ValueError(f"unknown config section(s) {', '.join(unknown)}; "
                             "valid: model, train, data, decode")
        return cls(dict(data.get("model", {})), TrainConfig.from_dict(data.get("train", {})),
                   TranslationDataConfig.from_dict(data.get("data", {})),
                   DecodeConfig.from_dict(data.get("decode", {})))


def _prep(text: str, lowercase: bool) -> str:
    return text.lower() if lowercase else text


def load_split(spec: str | list[str] | None, lowercase: bool) -> ParallelData | None:
    if spec is None:
        return None
    data = read_parallel(spec)
    if lowercase:
        data.pairs = [(s.lower(), t.lower()) for s, t in data.pairs]
    return data


def load_pairs(cfg: TranslationDataConfig) -> tuple[ParallelData, ParallelData | None, ParallelData | None]:
    """(train, val, test) pairs for a data config."""
    if cfg.train == "dates":
        train, heldout = date_pairs(cfg.n_train, cfg.n_heldout, cfg.seed)
        held = ParallelData(heldout, "the embedded dates task (held-out)")
        return ParallelData(train, "the embedded dates task"), held, held
    return (load_split(cfg.train, cfg.lowercase), load_split(cfg.val, cfg.lowercase),
            load_split(cfg.test, cfg.lowercase))


def build_tokenizers(cfg: TranslationDataConfig, pairs: list[tuple[str, str]]) -> tuple[Tokenizer, Tokenizer]:
    """Train tokenizers on the training pairs only."""
    src_texts = [s for s, _ in pairs]
    tgt_texts = [t for _, t in pairs]
    tgt_kind = cfg.target_tokenizer or cfg.tokenizer
    if cfg.joint_vocab:
        if tgt_kind != cfg.tokenizer:
            raise ValueError("[data] joint_vocab=true needs the same tokenizer kind for both sides; "
                             "set joint_vocab=false to mix kinds")
        tok = Tokenizer.train(cfg.tokenizer, src_texts + tgt_texts, cfg.vocab_size)
        return tok, tok
    return (Tokenizer.train(cfg.tokenizer, src_texts, cfg.vocab_size),
            Tokenizer.train(tgt_kind, tgt_texts, cfg.vocab_size))


def seq2seq_loss(model: torch.nn.Module, batch: Seq2SeqBatch, label_smoothing: float) -> torch.Tensor:
    pad_id = model_pad_id(model)
    real = batch.tgt_out != pad_id  # (B, T): logits only where there is a target to score
    logits = model(batch.src, batch.tgt_in, logits_at=real).logits  # (N, V)
    return token_cross_entropy(logits, batch.tgt_out[real], pad_id, label_smoothing)


def model_pad_id(model: torch.nn.Module) -> int:
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return getattr(model, "module", model).cfg.pad_id  # DistributedDataParallel's wrapper


def model_config(job: TranslationJob, src_tok: Tokenizer, tgt_tok: Tokenizer) -> Seq2SeqConfig:
    """The job's [model] fields plus what the tokenizers fix (vocabulary sizes, pad id)."""
    fields = {**job.model, "src_vocab_size": src_tok.vocab_size,
              "tgt_vocab_size": tgt_tok.vocab_size, "pad_id": src_tok.pad_id}
    return Seq2SeqConfig.from_dict(fields, "model")  # names unknown fields (ValueError)


def batched_pairs(job: TranslationJob, pairs: list[tuple[str, str]], src_tok: Tokenizer,
                  tgt_tok: Tokenizer, max_len: int, shuffle: bool) -> Seq2SeqData:
    """Encoded pairs (cut to max_len, counted in `.encoded.truncated`) in token-budget batches;
    shuffled batches follow the job's seed."""
    encoded = encode_pairs(pairs, src_tok, tgt_tok, max_len)
    return Seq2SeqData(encoded, job.data.max_tokens, src_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id,
                       shuffle=shuffle, seed=job.train.seed)


def run_train(job: TranslationJob, run_dir: str | os.PathLike, resume: bool = False,
              log=print) -> tuple[Seq2SeqTransformer, TrainResult]:
    """Train (or resume) a translation run in `run_dir`."""
    run_dir = Path(run_dir)
    main = distributed.env_rank() == 0  # under torchrun, rank 0 alone logs and writes files
    log = log if main else distributed.quiet
    train_pairs, val_pairs, _ = load_pairs(job.data)
    log(train_pairs.report())
    if val_pairs is not None:
        log(f"validation: {val_pairs.report()}")
    if resume:
        src_tok, tgt_tok = load_tokenizers(run_dir)
    else:
        src_tok, tgt_tok = build_tokenizers(job.data, train_pairs.pairs)
    model_cfg = model_config(job, src_tok, tgt_tok)
    if not resume and main:
        run_dir.mkdir(parents=True, exist_ok=True)
        src_tok.save(run_dir / "tokenizer.json")
        if tgt_tok is not src_tok:
            tgt_tok.save(run_dir / "tokenizer.target.json")
        save_run_config(run_dir, model_cfg, job)

    max_len = min(job.data.max_length, model_cfg.max_positions)
    train_data = batched_pairs(job, train_pairs.pairs, src_tok, tgt_tok, max_len, shuffle=True)
    if train_data.encoded.truncated:
        log(f"truncated {train_data.encoded.truncated:,} training pairs longer than {max_len} tokens "
            "(EOS kept)")
    val_batches = None
    if val_pairs is not None:
        val_batches = batched_pairs(job, val_pairs.pairs, src_tok, tgt_tok, max_len, shuffle=False).epoch(0)

    return train_new_model(lambda: Seq2SeqTransformer(model_cfg), job.train, train_data, val_batches,
                           seq2seq_loss, run_dir, resume=resume, log=log)


def save_run_config(run_dir: Path, model_cfg: Seq2SeqConfig, job: TranslationJob) -> None:
    data = {"task": "translation", "model": model_cfg.to_dict(), "train": asdict(job.train),
            "data": asdict(job.data), "decode": asdict(job.decode)}
    atomic_write_text(run_dir / "config.json", json.dumps(data, indent=2) + "\n")


def check_run_dir(run_dir: str | os.PathLike) -> Path:
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json); train one with "
                                "`handformer train` or `handformer demo`")
    if not (run_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run_dir} has no model.safetensors yet (training has not reached "
                                "its first evaluation)")
    return run_dir


def load_tokenizers(run_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    src = Tokenizer.load(run_dir / "tokenizer.json")
    tgt_path = run_dir / "tokenizer.target.json"
    return src, (Tokenizer.load(tgt_path) if tgt_path.exists() else src)


@dataclass
class Translator:
    """A trained run directory, ready to translate."""

    model: Seq2SeqTransformer
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    job: TranslationJob
    device: torch.device

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> Translator:
        run_dir = check_run_dir(run_dir)
        config = json.loads((run_dir / "config.json").read_text())
        if config.get("task") != "translation":
            raise ValueError(f"{run_dir} holds a {config.get('task')!r} run, not a translation run")
        model_cfg = Seq2SeqConfig.from_dict(config["model"], "model")
        job = TranslationJob.from_dict({k: v for k, v in config.items() if k != "model"})
        model = Seq2SeqTransformer(model_cfg)
        load_weights(model, run_dir / "model.safetensors")
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
        for ids in self.src_tok.encode_batch([_prep(t, self.job.data.lowercase) for t in texts]):
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

