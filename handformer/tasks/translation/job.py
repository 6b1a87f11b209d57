"""The translation job: a TOML config's [model], [train], [data] and [decode]
sections, the data they name, the tokenizers trained on it and the batches built from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handformer.config import Seq2SeqConfig, dataclass_from_dict
from handformer.data.batching import Seq2SeqData, encode_pairs
from handformer.data.dates import date_pairs
from handformer.data.lookup import parallel_files
from handformer.data.parallel import ParallelData, read_parallel
from handformer.data.sources import DATASETS
from handformer.data.tokenizer import Tokenizer
from handformer.settings import is_int, is_number
from handformer.training.loop import TrainConfig


@dataclass
class TranslationDataConfig:
    train: str | list[str] = "dates"  # "dates" (embedded task), a TSV path, or [source, target] paths
    val: str | list[str] | None = None  # same forms; with "dates" the held-out split is used
    test: str | list[str] | None = None
    # A public parallel dataset by name (`handformer data list`) in place of train/val/test, found
    # on this machine or downloaded once (data/lookup.py), with its [source, target] languages
    dataset: str = ""
    languages: list[str] | None = None  # with dataset: [source, target], e.g. ["de", "en"]
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

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"[data] {name}={getattr(self, name)!r} is invalid: {fix}")

        for name in ("train", "val", "test"):
            value = getattr(self, name)
            if name != "train" and value is None:
                continue
            if isinstance(value, list):
                if len(value) != 2 or not all(isinstance(v, str) and v for v in value):
                    fail(name, "give a TSV path or exactly two paths [source, target]")
            elif not isinstance(value, str) or not value:
                fail(name, 'give "dates", a TSV path, or [source, target] paths')
        if self.dataset or self.languages is not None:
            self._check_dataset(fail)
        for name in ("n_train", "n_heldout", "vocab_size", "max_tokens"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                fail(name, "it must be a positive integer")
        if not is_int(self.max_length) or self.max_length < 2:
            fail("max_length", "it must be an integer >= 2 (a token and EOS)")
        if self.max_tokens < self.max_length:
            fail("max_tokens", f"a batch must hold at least one example of max_length={self.max_length} "
                 "tokens: raise max_tokens or lower max_length")
        if not is_int(self.seed):
            fail("seed", "it must be an integer")
        for name in ("tokenizer", "target_tokenizer"):
            if getattr(self, name) not in ("bpe", "char") and not (name == "target_tokenizer"
                                                                   and self.target_tokenizer is None):
                fail(name, "choose bpe or char" + (" (or leave it out: same as tokenizer)"
                                                   if name == "target_tokenizer" else ""))

    def _check_dataset(self, fail: Callable[[str, str], None]) -> None:
        """A dataset is a known parallel one, with two of its languages; train is then not given."""
        corpora = [name for name, d in DATASETS.items() if d.splits]
        if self.dataset not in corpora:
            fail("dataset", f"give one of {', '.join(corpora)} (`handformer data list`) with "
                            "languages = [source, target], or files as train/val/test")
        splits = DATASETS[self.dataset].splits
        names = {f.name for f in DATASETS[self.dataset].files}
        if (not isinstance(self.languages, list) or len(self.languages) != 2
                or not all(isinstance(x, str) and p.format(lang=x) in names
                           for x in self.languages for p in splits.values())):
            langs = sorted({f.name.split(".")[-2] for f in DATASETS[self.dataset].files})
            fail("languages", f"give [source, target], two of {', '.join(langs)}")
        if self.train != "dates":
            fail("dataset", f"give a dataset or train files ({self.train!r}), not both")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TranslationDataConfig:
        return dataclass_from_dict(cls, data, "data")

    def split(self, name: str) -> str | list[str] | None:
        """Split `name` (train, val, test): the config's own files when given, else the dataset's
        (downloaded if they are nowhere here)."""
        given = getattr(self, name)
        if not self.dataset or (given is not None and name != "train"):
            return given
        return parallel_files(self.dataset, name, self.languages or [])


def _is_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


@dataclass
class DecodeConfig:
    beam: int = 4  # beam size; 1 = greedy
    length_penalty: float = 0.6  # score / length^length_penalty
    max_len_a: float = 1.5  # output length limit: a * source length + b
    max_len_b: int = 10

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"[decode] {name}={getattr(self, name)!r} is invalid: {fix}")

        if not is_int(self.beam) or self.beam < 1:
            fail("beam", "it must be an integer >= 1 (1 = greedy)")
        if not _is_number(self.length_penalty):
            fail("length_penalty", "it must be a finite number (0 = none; > 0 favours longer outputs, "
                 "< 0 shorter ones)")
        if not _is_number(self.max_len_a) or self.max_len_a < 0:
            fail("max_len_a", "it must be a number >= 0")
        if not is_int(self.max_len_b) or self.max_len_b < 0:
            fail("max_len_b", "it must be an integer >= 0")
        if self.max_len_a == 0 and self.max_len_b == 0:
            fail("max_len_b", "with max_len_a = 0 it must be >= 1, or every output is empty")

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
    if cfg.train == "dates" and not cfg.dataset:
        train, heldout = date_pairs(cfg.n_train, cfg.n_heldout, cfg.seed)
        held = ParallelData(heldout, "the embedded dates task (held-out)")
        return ParallelData(train, "the embedded dates task"), held, held
    return (load_split(cfg.split("train"), cfg.lowercase), load_split(cfg.split("val"), cfg.lowercase),
            load_split(cfg.split("test"), cfg.lowercase))


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
