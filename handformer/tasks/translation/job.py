"""The translation job: a TOML config's [model], [train], [data] and [decode]
sections, the data they name, the tokenizers trained on it and the batches built from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handformer.config import Seq2SeqConfig, dataclass_from_dict
from handformer.data.batching import Seq2SeqData, encode_pairs
from handformer.data.dates import date_pairs
from handformer.data.parallel import ParallelData, read_parallel
from handformer.data.tokenizer import Tokenizer
from handformer.training.loop import TrainConfig


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


def prep_text(text: str, lowercase: bool) -> str:
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
