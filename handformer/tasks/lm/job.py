"""The language-model job: a TOML config's [model], [train] and [data] sections,
checked on construction, each error naming its section and field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handformer.adapters.lora import LoRAConfig
from handformer.config import CausalLMConfig, dataclass_from_dict
from handformer.data.lookup import text_file
from handformer.data.sources import DATASETS
from handformer.data.text import (
    PYDOC,
)
from handformer.families.gpt2 import GPT2
from handformer.families.llama import LLAMA
from handformer.tasks.lm.finetune import BaseRun, check_lora_targets, model_config_from_base, read_base_run
from handformer.training.loop import TrainConfig


@dataclass
class LMDataConfig:
    path: str = PYDOC  # "pydoc" (the embedded corpus) or a text file or folder (plain or .gz)
    # A public dataset by name instead of `path` (`handformer data list`): found on this machine
    # or downloaded once (data/lookup.py); a `path` given beside it wins
    dataset: str = ""
    tokenizer: str = "char"  # char | bpe, trained on the training split only
    vocab_size: int = 8000  # BPE vocabulary size (char: the characters of the training split)
    block_size: int = 256  # tokens per training window: the context length the model learns
    batch_size: int = 64  # windows per batch
    val_fraction: float = 0.1  # the last fraction of the text held out for validation; 0 = none
    batches_per_epoch: int = 1000  # batches between reseedings of the window sampler
    eval_batches: int = 20  # size of the fixed validation set, in batches; 0 = the whole split
    # A folder of token shards instead of `path`: `handformer prepare`'s output, llm.c .bin shards
    # or nanoGPT's train.bin/val.bin (data/shards.py); its validation shards are the validation set
    shards: str = ""
    sampling: str = "random"  # shards: random windows (nanoGPT) | sequential passes (llm.c)
    # shards without a tokenizer (llm.c, nanoGPT): the vocabulary size when `tokenizer` names no
    # tokenizer.json or run directory; 0 = from the tokenizer
    shard_vocab_size: int = 0

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"[data] {name}={getattr(self, name)!r} is invalid: {fix}")

        if not isinstance(self.path, str) or not self.path:
            fail("path", f'give a text file, a folder, or "{PYDOC}" for the embedded corpus')
        texts = [name for name, d in DATASETS.items() if d.text]
        if not isinstance(self.dataset, str) or self.dataset and self.dataset not in texts:
            fail("dataset", f"give one of {', '.join(texts)} (`handformer data list`), or a file as path")
        if self.dataset and self.path != PYDOC:
            fail("dataset", f"give a dataset or a path ({self.path!r}), not both")
        if self.tokenizer not in ("char", "bpe") and not self.shards:
            fail("tokenizer", "choose char or bpe (with data.shards: also a tokenizer.json or run directory)")
        if not isinstance(self.shards, str):
            fail("shards", "give the folder `handformer prepare` wrote, or one of llm.c or nanoGPT files")
        if self.sampling not in ("random", "sequential"):
            fail("sampling", "choose random (nanoGPT-style windows) or sequential (llm.c-style passes)")
        if (not isinstance(self.shard_vocab_size, int) or isinstance(self.shard_vocab_size, bool)
                or self.shard_vocab_size < 0):
            fail("shard_vocab_size", "it must be an integer >= 0 (0 = the tokenizer's vocabulary)")
        for name in ("vocab_size", "block_size", "batch_size", "batches_per_epoch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                fail(name, "it must be a positive integer")
        if not isinstance(self.eval_batches, int) or self.eval_batches < 0:
            fail("eval_batches", "it must be an integer >= 0 (0 = the whole validation split)")
        if not isinstance(self.val_fraction, (int, float)) or not 0 <= self.val_fraction < 1:
            fail("val_fraction", "it must be in [0, 1) (0 = no validation)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMDataConfig:
        if isinstance(data, dict) and "path" in data and "dataset" in data:
            # --set data.path=FILE on a config that names a dataset: the file replaces it
            data = {k: v for k, v in data.items() if k != "dataset"}
        return dataclass_from_dict(cls, data, "data")

    def text_path(self) -> str:
        """The text to train on: the dataset's file (downloaded if it is nowhere here), else `path`."""
        return str(text_file(self.dataset)) if self.dataset else self.path


MODEL_PRESETS = {GPT2.model_type: CausalLMConfig.gpt2_style, LLAMA.model_type: CausalLMConfig.llama_style}

# Where a language model's usual practice differs from TrainConfig's (the translation paper's)
# defaults; a [train] section overrides them like any other default.
LM_TRAIN_DEFAULTS = {"label_smoothing": 0.0, "schedule": "cosine"}


@dataclass
class LMJob:
    # CausalLMConfig fields, plus a `preset` of MODEL_PRESETS (GPT-2's or Llama's) to start from that style
    # before the
    # other fields apply. vocab_size comes from the tokenizer; max_positions defaults to block_size.
    model: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(**LM_TRAIN_DEFAULTS))
    data: LMDataConfig = field(default_factory=LMDataConfig)
    # Fine-tuning (finetune.py): [train] init_from = "RUN_DIR" starts from that run's weights,
    # model config and tokenizer; [train.lora] then trains low-rank adapters only.
    init_from: str | None = None
    lora: LoRAConfig | None = None
    base: BaseRun | None = field(default=None, repr=False)  # the run init_from names, once read

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMJob:
        """A job from a config dict; every error names the section and field. The model section is
        checked here too (with a placeholder vocabulary), before any text is read."""
        unknown = sorted(set(data) - {"model", "train", "data", "task"})
        if unknown:
            raise ValueError(f"unknown config section(s) {', '.join(unknown)} for a language model; "
                             "valid: model, train, data")
        model = data.get("model", {})
        if not isinstance(model, dict):
            raise ValueError(f"[model] must be a table of settings, got {type(model).__name__}")
        train_section = data.get("train", {})
        if not isinstance(train_section, dict):
            raise ValueError(f"[train] must be a table of settings, got {type(train_section).__name__}")
        train_section = dict(train_section)
        init_from, lora = train_section.pop("init_from", None), train_section.pop("lora", None)
        data_section = data.get("data", {})
        base = None
        if init_from is not None:
            if not isinstance(init_from, str) or not init_from:
                raise ValueError(f"[train] init_from={init_from!r} is invalid: give a run directory")
            base = read_base_run(init_from)
            if isinstance(data_section, dict) and "block_size" not in data_section:
                # the base's own training window, else the default as far as its context allows
                block = base.config.get("data", {}).get("block_size", LMDataConfig.block_size)
                data_section = {**data_section, "block_size": min(block, base.model_cfg.max_positions)}
        job = cls(dict(model), TrainConfig.from_dict({**LM_TRAIN_DEFAULTS, **train_section}),
                  LMDataConfig.from_dict(data_section), init_from,
                  None if lora is None else LoRAConfig.from_dict(lora), base)
        if base is None:
            if lora is not None:
                raise ValueError('[train.lora] needs [train] init_from = "RUN_DIR": adapters train on '
                                 "top of a trained run's weights")
            job.model_config(vocab_size=1)
            return job
        cfg = job.model_config(vocab_size=base.model_cfg.vocab_size)
        if job.train.zero_init_projections:
            raise ValueError("[train] zero_init_projections=true would erase the base run's o_proj and "
                             "down_proj weights; it is for new models: leave it out with init_from")
        if job.lora is not None:
            check_lora_targets(cfg, job.lora)
        return job

    def model_config(self, vocab_size: int) -> CausalLMConfig:
        """The model's config: built from [model] and the tokenizer's size, or, fine-tuning, the
        base run's (vocab_size unused), which the [model] section may restate but not change."""
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if preset is not None and preset not in MODEL_PRESETS:
            raise ValueError(f"[model] preset={preset!r} is invalid: choose "
                             f"{' or '.join(MODEL_PRESETS)}, or leave it out for CausalLMConfig's defaults")
        if self.base is not None:
            if preset is not None:  # the whole model the section describes must be the base's
                described = MODEL_PRESETS[preset]().to_dict()
                del described["vocab_size"]  # from the tokenizer
                described["max_positions"] = self.base.model_cfg.max_positions  # unless restated
                fields = {**{k: (v, preset) for k, v in described.items()},
                          **{k: (v, None) for k, v in fields.items()}}
            else:
                fields = {k: (v, None) for k, v in fields.items()}
            cfg = model_config_from_base(fields, self.base, self.init_from)
            if cfg.max_positions < self.data.block_size:
                raise ValueError(f"[data] block_size={self.data.block_size} is invalid: the run in "
                                 f"[train] init_from has a context of max_positions={cfg.max_positions} "
                                 "tokens; use at most that")
            return cfg
        if "vocab_size" in fields:
            raise ValueError("[model] vocab_size is set from the tokenizer; remove it (for BPE, set "
                             "data.vocab_size instead)")
        fields.setdefault("max_positions", self.data.block_size)
        base = MODEL_PRESETS[preset]() if preset else CausalLMConfig()
        cfg = CausalLMConfig.from_dict({**base.to_dict(), **fields, "vocab_size": vocab_size}, "model")
        if cfg.max_positions < self.data.block_size:
            raise ValueError(f"[model] max_positions={cfg.max_positions} is invalid: it must be at "
                             f"least data.block_size={self.data.block_size}, the length trained on")
        return cfg
