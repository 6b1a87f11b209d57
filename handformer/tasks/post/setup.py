"""What every post-training run shares: the base run's tokenizer, chat template and special tokens,
the run directory written before training, and the models it trains and compares with.

A post-trained run is a language-model run like any other (task "lm": `handformer chat`, `serve`,
`generate` and `export-hf` load it through its pipeline), holding:

    config.json          the base's model, tokens and provenance ("init_from", "lora" as in
                         fine-tuning) and "post_training": {"task": "sft" | "dpo" | "grpo",
                         "settings": the [dpo] / [grpo] section}
    tokenizer.json       the base run's
    chat_template.jinja  the template it learned to chat in (the base's, or [data] chat_template)
    tokenizer_config.json  the special-token text the template uses (bos_token, eos_token)
    model.safetensors | adapters.safetensors, checkpoint.safetensors, metrics.jsonl
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import (
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    ChatTemplate,
    load_chat_template,
)
from handformer.io import atomic_write_bytes, atomic_write_text
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm import finetune
from handformer.tasks.lm.run import write_lm_run_config
from handformer.tasks.post.job import PostJob
from handformer.tasks.post.rendering import ConversationRenderer
from handformer.training import distributed


@dataclass
class PostRun:
    tokenizer: Tokenizer
    template: ChatTemplate
    tokens: SpecialTokens
    stop_ids: list[int]  # what ends a reply (and an assistant's turn)
    renderer: ConversationRenderer

    @property
    def pad_id(self) -> int:
        ids = (self.tokens.pad_id, self.tokenizer.pad_id, self.tokens.eos_id, 0)
        return next(i for i in ids if i is not None)


def core(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def template_tokens(tokenizer: Tokenizer, tokens: SpecialTokens) -> dict[str, str]:
    """bos_token and eos_token as a template names them, from the run's ids."""
    out = {}
    for name, token_id in (("bos_token", tokens.bos_id), ("eos_token", tokens.eos_id)):
        text = None if token_id is None else tokenizer.hf.id_to_token(token_id)
        if text is not None:
            out[name] = text
    return out


def chat_template_for(template_file: str, source: Path, tokenizer: Tokenizer, tokens: SpecialTokens,
                      ) -> ChatTemplate:
    """`template_file` ([data] chat_template) when given, else the template of `source` (the base,
    or the run itself when resuming); a clear error when there is none."""
    if template_file:
        path = Path(template_file)
        if not path.is_file():
            raise FileNotFoundError(f"[data] chat_template={template_file!r}: no such file")
        base = load_chat_template(source)
        specials = base.special_tokens if base is not None else template_tokens(tokenizer, tokens)
        return ChatTemplate(path.read_text(encoding="utf-8"), specials, str(path))
    template = load_chat_template(source)
    if template is None:
        raise ValueError(f"{source} has no chat template (chat_template.jinja, or a chat_template in "
                         "tokenizer_config.json): write one for the roles the data uses and set "
                         "[data] chat_template = \"FILE.jinja\"")
    return template


def prepare_run(job: PostJob, run_dir: Path, resume: bool, log=print) -> PostRun:
    """The tokenizer, template and tokens of the run (the base's, or the run's own when resuming),
    and, for a new run, its directory written (rank 0) before any training."""
    source = run_dir if resume else job.base.path
    tokenizer = Tokenizer.load(source / "tokenizer.json")
    config = json.loads((source / "config.json").read_text())
    tokens = SpecialTokens.from_dict(config.get("tokens", {}))
    # a resumed run reads the template it copied, not [data] chat_template again
    template = chat_template_for("" if resume else job.data.chat_template, source, tokenizer, tokens)
    stop_ids = stop_ids_for(tokenizer, tokens.eos_ids, template)
    if not stop_ids:
        raise ValueError(f"{source / 'config.json'} lists no EOS ids and the vocabulary has no end-of-turn "
                         "token, so an assistant's reply would never end; add one to the tokenizer")
    renderer = ConversationRenderer(template, tokenizer, stop_ids,
                                    train_on_prompt=job.task == "sft" and job.data.train_on_prompt)
    if not resume and distributed.env_rank() == 0:
        write_run(job, run_dir, tokenizer, template, tokens)
    log(f"{job.task} from {job.base.path}{' with LoRA adapters' if job.lora else ''}; chat template "
        f"{template.origin}")
    return PostRun(tokenizer, template, tokens, stop_ids, renderer)


def write_run(job: PostJob, run_dir: Path, tokenizer: Tokenizer, template: ChatTemplate,
              tokens: SpecialTokens) -> None:
    """The run directory before training: tokenizer, chat template, config.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / "tokenizer.json")
    atomic_write_text(run_dir / TEMPLATE_FILE, template.source)
    base_config = job.base.path / TOKENIZER_CONFIG
    if base_config.is_file():
        data = json.loads(base_config.read_text(encoding="utf-8"))
        data.pop("chat_template", None)  # chat_template.jinja holds the one the run learned
        atomic_write_bytes(run_dir / TOKENIZER_CONFIG, (json.dumps(data, indent=2) + "\n").encode())
    else:
        atomic_write_text(run_dir / TOKENIZER_CONFIG, json.dumps(template.special_tokens, indent=2) + "\n")
    train = {**asdict(job.train), "init_from": str(job.base.path)}
    provenance = finetune.provenance(job.base, run_dir, lora=job.lora is not None)
    sections: dict[str, Any] = {"train": train, "data": asdict(job.data), "init_from": provenance,
                                "post_training": {"task": job.task, "settings": job.settings}}
    if job.lora is not None:
        train["lora"] = sections["lora"] = asdict(job.lora)
    write_lm_run_config(run_dir, job.model_cfg, tokens, **sections)


def weights_file(job: PostJob) -> str:
    return finetune.ADAPTERS_FILE if job.lora else "model.safetensors"


def base_dir(job: PostJob, run_dir: Path, resume: bool) -> Path:
    """The base run's directory: as the job names it, or, resuming, as the run recorded it (found
    next to the run or where it was, its weights' hash checked)."""
    if not resume:
        return job.base.path
    return finetune.verified_base(run_dir, json.loads((run_dir / "config.json").read_text()))


def builder(job: PostJob, run_dir: Path, resume: bool):
    """What the loop builds: the base's weights (plus fresh adapters with LoRA). Resuming a full
    run needs no base weights (the checkpoint has them all); resuming LoRA needs its base."""
    if resume and job.lora is None:
        return functools.partial(CausalLM, job.model_cfg)
    return functools.partial(finetune.base_model, job.model_cfg, base_dir(job, run_dir, resume), job.lora)


def reference_model(job: PostJob, base: Path, device: torch.device | str = "cpu") -> CausalLM:
    """The frozen reference (DPO, GRPO's KL term): the base run's weights, in eval mode."""
    model = finetune.base_model(job.model_cfg, base, None).to(device).eval()
    model.requires_grad_(False)
    return model


def split_lines(job: PostJob, read) -> tuple[list, list]:
    """(training, validation) records: [data] val_path's, or the last val_fraction of path's."""
    records = read(job.data.path)
    if job.data.val_path:
        return records, read(job.data.val_path)
    n_val = int(len(records) * job.data.val_fraction)
    if job.data.val_fraction and not n_val:
        n_val = 1 if len(records) > 1 else 0
    return (records[:len(records) - n_val], records[len(records) - n_val:]) if n_val else (records, [])


__all__ = ["PostRun", "base_dir", "builder", "core", "prepare_run", "reference_model", "split_lines",
           "weights_file"]
