"""Post-training jobs: `task = "sft" | "dpo" | "grpo"` in a TOML config, checked on construction,
each error naming its section and field.

    task = "sft"
    [train]   TrainConfig fields, and init_from = "RUN_DIR" (required: post-training starts from
              a run) with an optional [train.lora] table, as in fine-tuning
    [data]    PostDataConfig: the JSONL file, its format, the chat template, block and batch size
    [dpo]     DPOConfig (task = "dpo")
    [grpo]    GRPOConfig (task = "grpo")
    [model]   may restate the base run's model; only dropout and attention_dropout may change

The base run is any language-model run handformer loads (trained here, fine-tuned, imported with
import-hf, import-llama2c or import-gguf); LoRA runs are merged first, quantized runs refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handformer.adapters.lora import LoRAConfig
from handformer.config import CausalLMConfig, dataclass_from_dict
from handformer.generation.sampling import SamplingOptions
from handformer.settings import is_int
from handformer.tasks.lm.finetune import BaseRun, check_lora_targets, model_config_from_base, read_base_run
from handformer.tasks.lm.job import LM_TRAIN_DEFAULTS
from handformer.tasks.post.records import FORMATS
from handformer.training.loop import TrainConfig

POST_TASKS = ("sft", "dpo", "grpo")
# [data] fields that only one task reads: giving them to another is a mistake worth naming.
ONLY_FOR = {"format": "sft", "packing": "sft", "train_on_prompt": "sft"}


def _fail(section: str, obj: Any, name: str, fix: str) -> None:
    raise ValueError(f"[{section}] {name}={getattr(obj, name)!r} is invalid: {fix}")


def _positive_int(section: str, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not is_int(value) or value <= 0:
            _fail(section, obj, name, "it must be a positive integer")


@dataclass
class PostDataConfig:
    path: str = ""  # the JSONL file to learn from (records.py has the formats)
    val_path: str = ""  # held-out JSONL file; "" = the last val_fraction of `path`'s lines
    val_fraction: float = 0.05  # 0 = no validation
    format: str = "messages"  # sft: messages | prompt_completion
    # A .jinja chat template for a base run that has none (it is copied into the run, so the run
    # chats with it); "" = the base run's own template
    chat_template: str = ""
    block_size: int = 0  # most positions a conversation (prompt + reply) takes; 0 = the base's context
    batch_size: int = 8  # sft: windows (packed) or conversations; dpo: pairs; grpo: prompts
    packing: bool = True  # sft: several conversations a window (document mask) | one a row, padded
    overlong: str = "truncate"  # a conversation over block_size: truncate (keep its start) | drop
    train_on_prompt: bool = False  # sft: learn every token, not only the assistant's
    eval_batches: int = 0  # validation batches per evaluation; 0 = all

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            _fail("data", self, "path", "give the JSONL file to train on")
        if self.format not in FORMATS:
            _fail("data", self, "format", f"choose {' or '.join(FORMATS)}")
        if self.overlong not in ("truncate", "drop"):
            _fail("data", self, "overlong", "choose truncate (keep the start) or drop")
        if not isinstance(self.val_fraction, (int, float)) or not 0 <= self.val_fraction < 1:
            _fail("data", self, "val_fraction", "it must be in [0, 1) (0 = no validation)")
        _positive_int("data", self, "batch_size")
        for name in ("block_size", "eval_batches"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                _fail("data", self, name, "it must be an integer >= 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any], task: str) -> PostDataConfig:
        for name, owner in ONLY_FOR.items():  # set to other than its default (a run's config.json has all)
            default = getattr(cls, name)
            if isinstance(data, dict) and data.get(name, default) != default and task != owner:
                raise ValueError(f"[data] {name} is a setting of task = \"{owner}\", not of \"{task}\"; "
                                 "remove it")
        return dataclass_from_dict(cls, data, "data")


@dataclass
class DPOConfig:
    beta: float = 0.1  # how far from the reference the policy may move (sigmoid); IPO's tau
    loss_type: str = "sigmoid"  # sigmoid (the DPO paper) | ipo (IPO, length-normalized as TRL does)
    # the reference model's log-probabilities: computed once before training and kept in
    # reference_logprobs.safetensors (cached) | computed at every step by a frozen copy (live)
    reference: str = "cached"
    # weight of the chosen replies' negative log-likelihood per token added to the loss (TRL:
    # loss_type ["sigmoid", "sft"], loss_weights [1, sft_weight]; 0: none): keeps the chosen
    # replies likely while the margin grows
    sft_weight: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.beta, (int, float)) or isinstance(self.beta, bool) or not self.beta > 0:
            _fail("dpo", self, "beta", "it must be a number > 0")
        weight = self.sft_weight
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
            _fail("dpo", self, "sft_weight", "it must be a number >= 0 (0: off)")
        if self.loss_type not in ("sigmoid", "ipo"):
            _fail("dpo", self, "loss_type", "choose sigmoid or ipo")
        if self.reference not in ("cached", "live"):
            _fail("dpo", self, "reference", "choose cached (computed once, kept in a file) or live")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DPOConfig:
        return dataclass_from_dict(cls, data, "dpo")


GRPO_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class GRPOConfig:
    reward: str = ""  # "module:function" of the reward (rewards.py); its code runs in this process
    reward_timeout: float = 10.0  # seconds one call of the reward may take
    group_size: int = 8  # completions sampled per prompt (TRL's num_generations)
    max_new_tokens: int = 64  # tokens a completion may have (TRL's max_completion_length)
    temperature: float = 1.0  # sampling of the completions
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1 = no top-p filter
    loss_type: str = "dapo"  # how the per-token loss is averaged (TRL's loss_type; its default)
    scale_rewards: str = "group"  # divide advantages by the std of the group | batch | none
    beta: float = 0.0  # weight of the KL term to the reference model (0: no reference needed)
    epsilon: float = 0.2  # the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
    epsilon_high: float = 0.0  # 0 = epsilon
    iterations: int = 1  # optimizer steps on each batch of rollouts (TRL's num_iterations)

    def __post_init__(self) -> None:
        if not isinstance(self.reward, str) or ":" not in self.reward:
            _fail("grpo", self, "reward", 'name the reward function as "module:function" (e.g. '
                  '"my_rewards:exact_answer", a module on the Python path)')
        if not isinstance(self.reward_timeout, (int, float)) or not self.reward_timeout > 0:
            _fail("grpo", self, "reward_timeout", "it must be a number of seconds > 0")
        _positive_int("grpo", self, "max_new_tokens", "iterations")
        if not is_int(self.group_size) or self.group_size < 2:
            _fail("grpo", self, "group_size", "it must be an integer >= 2 (advantages compare a group)")
        if not isinstance(self.temperature, (int, float)) or not self.temperature > 0:
            _fail("grpo", self, "temperature", "it must be > 0 (completions are sampled)")
        if not is_int(self.top_k) or self.top_k < 0:
            _fail("grpo", self, "top_k", "it must be an integer >= 0 (0 = off)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            _fail("grpo", self, "top_p", "it must be in (0, 1] (1 = off)")
        if self.loss_type not in GRPO_LOSSES:
            _fail("grpo", self, "loss_type", f"choose one of {', '.join(GRPO_LOSSES)}")
        if self.scale_rewards not in SCALE_REWARDS:
            _fail("grpo", self, "scale_rewards", f"choose one of {', '.join(SCALE_REWARDS)}")
        for name in ("beta", "epsilon", "epsilon_high"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                _fail("grpo", self, name, "it must be a number >= 0")

    @property
    def clip_high(self) -> float:
        return self.epsilon_high or self.epsilon

    def sampling(self, seed: int) -> SamplingOptions:
        """How the completions are sampled: one value for the engine (top_k 0 and top_p 1 are off)."""
        top_p = self.top_p if self.top_p < 1 else None
        return SamplingOptions(self.temperature, self.top_k or None, top_p, seed)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        return dataclass_from_dict(cls, data, "grpo")


@dataclass
class PostJob:
    task: str  # sft | dpo | grpo
    train: TrainConfig
    data: PostDataConfig
    init_from: str
    base: BaseRun = field(repr=False)
    model_cfg: CausalLMConfig = field(repr=False)
    lora: LoRAConfig | None = None
    dpo: DPOConfig | None = None
    grpo: GRPOConfig | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PostJob:
        """A job from a config dict (its "task" one of POST_TASKS); every error names the section
        and field, and the base run is read (config only) before any data."""
        task = data.get("task")
        if task not in POST_TASKS:
            raise ValueError(f"task={task!r} is not a post-training task; choose {', '.join(POST_TASKS)}")
        sections = {"model", "train", "data", "task"} | ({task} - {"sft"})
        unknown = sorted(set(data) - sections)
        if unknown:
            raise ValueError(f"unknown config section(s) {', '.join(unknown)} for task = \"{task}\"; valid: "
                             f"{', '.join(sorted(sections - {'task'}))}")
        train = dict(data.get("train", {})) if isinstance(data.get("train", {}), dict) else None
        if train is None:
            raise ValueError("[train] must be a table of settings")
        init_from, lora = train.pop("init_from", None), train.pop("lora", None)
        if not isinstance(init_from, str) or not init_from:
            raise ValueError(f'[train] init_from is required for task = "{task}": give the run to start '
                             'from (init_from = "RUN_DIR", or `handformer train --init-from RUN_DIR`)')
        base = read_base_run(init_from)
        model = data.get("model", {})
        if not isinstance(model, dict):
            raise ValueError(f"[model] must be a table of settings, got {type(model).__name__}")
        model_cfg = model_config_from_base({k: (v, None) for k, v in model.items()}, base, init_from)
        job = cls(task, TrainConfig.from_dict({**LM_TRAIN_DEFAULTS, **train}),
                  PostDataConfig.from_dict(data.get("data", {}), task), init_from, base, model_cfg,
                  None if lora is None else LoRAConfig.from_dict(lora),
                  DPOConfig.from_dict(data.get("dpo", {})) if task == "dpo" else None,
                  GRPOConfig.from_dict(data.get("grpo", {})) if task == "grpo" else None)
        if job.data.block_size > model_cfg.max_positions:
            raise ValueError(f"[data] block_size={job.data.block_size} is invalid: the run in [train] "
                             f"init_from has a context of max_positions={model_cfg.max_positions} tokens; "
                             "use at most that")
        if job.lora is not None:
            check_lora_targets(model_cfg, job.lora)
        return job

    @property
    def block_size(self) -> int:
        return self.data.block_size or self.model_cfg.max_positions

    @property
    def settings(self) -> dict[str, Any]:
        """The objective's section as config.json records it."""
        from dataclasses import asdict

        objective = self.dpo or self.grpo
        return {} if objective is None else asdict(objective)


__all__ = ["POST_TASKS", "DPOConfig", "GRPOConfig", "PostDataConfig", "PostJob"]
