"""The argument names the runners fill, one table per runner: a learner's free function is found by
them (signatures.py) before any runner is imported, so the tables, and the helpers that read a
signature's names, sit below both."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

# an attention's inputs by their names (a layer that takes them apart too: Persson's
# TransformerBlock.forward(value, key, query, mask))
INPUT_ROLES = {"q": "q", "query": "q", "queries": "q", "k": "k", "key": "k", "keys": "k", "v": "v",
               "value": "v", "values": "v"}

# beam.py
# a sublayer handed the stream it adds its output to (BLOOM's attention(x, residual, alibi, mask) and
# MLP(x, residual)): handed a zero, it is the sublayer alone
RESIDUAL_NAMES = ("residual", "residual_stream", "skip")
BEAM_NAMES = {
    "model": ("model", "net", "transformer", "m"),
    "src": ("src", "source", "x", "src_ids", "src_seq", "input_ids"),
    "src_mask": ("src_mask", "mask", "source_mask", "src_key_padding_mask"),
    "max_len": ("max_len", "max_length", "maxlen", "max_steps", "max_tgt_len", "length", "max_new_tokens"),
    "start": ("start_symbol", "bos", "bos_idx", "bos_id", "start_idx", "sos_idx", "start_token", "sos",
              "start_id", "bos_token_id", "start",
              # Hugging Face's encoder-decoders (T5, Marian, Whisper) name the first decoder token so
              "decoder_start_token_id", "decoder_start_id"),
    "end": ("end_symbol", "eos", "eos_idx", "eos_id", "end_idx", "end_token", "eos_token_id", "end", "stop"),
    "beam": ("beam_size", "beam_width", "k", "num_beams", "beam", "n_beams", "width", "beams"),
    "alpha": ("alpha", "length_penalty", "lp", "len_penalty", "length_alpha", "penalty"),
    # a diverse beam search's groups and the penalty between them (Hugging Face's num_beam_groups,
    # diversity_penalty): handed one group and no penalty, it is the plain beam search
    "groups": ("num_beam_groups", "beam_groups", "num_groups", "n_groups", "groups", "n_beam_groups",
               "num_diverse_groups"),
    "diversity": ("diversity_penalty", "diversity_strength", "diversity_rate", "diversity",
                  "hamming_penalty", "diversity_lambda", "lambda_diversity"),
}

# a beam search's settings that have a value making it handformer's search (Hugging Face's
# _generate_beam_search(input_ids, max_length, num_beams, eos_token_id, pad_token_id, early_stopping,
# num_return_sequences)): role -> (its names, that value); beam.py fills them and says so
BEAM_SETTINGS: dict[str, tuple[tuple[str, ...], Any]] = {
    "pad": (("pad_token_id", "pad_id", "pad_idx", "pad_token", "pad", "padding_idx", "pad_symbol"), 0),
    "returns": (("num_return_sequences", "num_return", "n_return", "n_best", "nbest", "num_hyps",
                 "num_outputs"), 1),
    # False: it searches on while a live hypothesis may still beat the worst finished one
    "early": (("early_stopping", "early_stop"), False),
    "sample": (("do_sample", "sample", "sampling", "use_sampling"), False),
}

# decoding.py
DECODING_NAMES = {
    "model": ("model", "net", "transformer", "m"),
    "src": ("src", "source", "x", "src_ids", "src_seq", "input_ids"),
    "src_mask": ("src_mask", "mask", "source_mask", "src_key_padding_mask"),
    "max_len": ("max_len", "max_length", "maxlen", "max_steps", "max_new_tokens", "max_tgt_len", "length"),
    "start": ("start_symbol", "bos", "bos_idx", "bos_id", "start_idx", "sos_idx", "start_token", "sos",
              "start_id", "bos_token_id", "start",
              # Hugging Face's encoder-decoders (T5, Marian, Whisper) name the first decoder token so
              "decoder_start_token_id", "decoder_start_id"),
    "end": ("end_symbol", "eos", "eos_idx", "eos_id", "end_idx", "end_token", "eos_token_id", "end", "stop"),
}

# generate_loop.py
MODEL_NAMES = ("model", "self", "net", "m", "lm", "gpt")
PROMPT_NAMES = ("idx", "input_ids", "prompt", "prompt_ids", "tokens", "context", "ids", "x", "input",
                "prompt_tokens", "start_ids", "inputs", "prompts")
# a chat loop's tokenizer and the conversation it encodes (Qwen's chat(model, tokenizer, messages))
TOKENIZER_NAMES = ("tokenizer", "tok", "enc", "encoder", "tokeniser")
MESSAGE_NAMES = ("messages", "conversation", "history", "dialog", "chat", "msgs")
COUNT_NAMES = ("max_new_tokens", "max_tokens", "n_new", "num_tokens", "new_tokens", "steps", "max_steps",
               "length", "max_length", "n", "num_new_tokens", "max_gen_len", "n_tokens")
# a generation loop's end-of-sequence id
EOS_NAMES = ("eos", "eos_id", "eos_token", "eos_token_id", "eos_idx", "end_token", "end_id", "stop_token",
             "end_symbol", "stop_id")
# a generation loop's switch for its model's KV cache, on where it has no default (the cached path is
# the one a mask or position offset gets wrong; the model's own check runs it uncached)
CACHE_SWITCH_NAMES = ("use_cache", "use_kv_cache", "cached", "with_cache")
# a generation loop's attention mask (1 = real token, 0 = pad) and padding id
MASK_ARG_NAMES = ("attention_mask", "attn_mask", "padding_mask", "pad_mask", "mask")
PAD_NAMES = ("pad_token_id", "pad_id", "pad_idx", "pad_token", "pad", "padding_idx")
CONTEXT_NAMES = ("context_size", "block_size", "context_length", "max_seq_len", "max_context", "ctx_len",
                 "window", "context_window", "ctx", "max_ctx", "context_len", "max_context_length")
# a generation loop's switch of its model's KV cache, set where it has no default (the cached path is
# the one to check: the uncached one is the model's own forward, checked with the model)
CACHE_SWITCH_NAMES = ("use_cache", "use_kv_cache", "with_cache", "kv_cache_enabled")

# train_step.py
STEP_MODEL_NAMES = ("model", "net", "transformer", "m")
OPTIMIZER_NAMES = ("optimizer", "opt", "optim")
# a step handed its optimizers as a list it steps in turn (the speedrun's Adam and Muon): handed [optimizer]
OPTIMIZER_LIST_NAMES = ("optimizers", "opts", "optims", "optimizer_list")
SCHEDULER_NAMES = ("scheduler", "lr_scheduler", "sched", "schedule", "lr_sched", "scheduler_fn")
SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler", "loss_scaler", "gradscaler")
CRITERION_NAMES = ("criterion", "loss_fn", "loss_func", "loss_compute", "compute_loss", "loss_function",
                   "criteria")
# a DPO step's frozen reference model beside its policy (dpo_step.py)
REFERENCE_MODEL_NAMES = ("ref", "ref_model", "reference", "reference_model", "ref_policy", "ref_net",
                         "pi_ref", "reference_net")
BATCH_NAMES = ("batch", "data", "sample", "b", "example")
LOADER_NAMES = ("loader", "data_loader", "dataloader", "batches", "data_iter", "train_loader", "iterator",
                "train_dataloader", "train_iter",
                "dataset", "train_data", "data")
ACCUM_NAMES = ("accum_steps", "accumulation_steps", "grad_accum_steps", "gradient_accumulation_steps",
               "accum_iter", "accumulate", "n_accum", "grad_accum", "micro_batches", "accum")
CLIP_NAMES = ("grad_clip", "clip_norm", "max_grad_norm", "clip", "gradient_clip", "clip_grad",
              "grad_clip_norm", "max_norm", "clip_grad_norm", "grad_norm_clip", "clip_value")
SRC_NAMES = ("src", "source", "x", "src_ids", "inputs", "input_ids", "src_tokens")
# the decoder's input handed apart from the target it is scored on (fairseq's prev_output_tokens): the
# target shifted right, so the target handed beside it is already the next tokens
DECODER_INPUT_NAMES = ("prev_output_tokens", "decoder_input", "decoder_input_ids", "tgt_input", "tgt_in",
                       "trg_input", "dec_input")
TGT_NAMES = ("tgt", "trg", "target", "y", "tgt_ids", "targets", "labels")

# lm_train_step.py: a decoder-only model's step takes the windows x and y (y is x moved on by one)
X_NAMES = ("x", "xb", "idx", "inputs", "input_ids", "tokens", "src")
Y_NAMES = ("y", "yb", "targets", "target", "labels", "tgt")
LR_NAMES = ("lr", "learning_rate", "lr_now", "step_lr", "rate")

# schedule.py: the step, and the settings a schedule reads (as arguments or module globals)
SCHEDULE_STEP_NAMES = (
    "step",
    "it",
    "iteration",
    "step_num",
    "current_step",
    "s",
    "n",
    "t",
    "num_step",
    "global_step",
    "epoch",
    "iter",
    "steps",
    "i",
    "iter_num",
    "num_updates",  # fairseq's update count (its schedulers' step_update(num_updates))
    "update_num",
)
# a one-cycle schedule's (torch's OneCycleLR): its warmup as a fraction of the run, its peak's divisors
ONE_CYCLE_ARGS: dict[str, tuple[str, ...]] = {
    "fraction": ("pct_start", "warmup_pct", "pct_warmup", "warmup_frac", "warmup_fraction", "pct"),
    "div": ("div_factor", "div", "initial_div"), "final_div": ("final_div_factor", "final_div")}
SCHEDULE_ARGS: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "model_size", "dim", "hidden_size", "d", "n_embd", "model_dim", "size", "d_embed"),
    "factor": ("factor", "scale", "lr_factor", "multiplier", "lr_mult", "k", "lr_mul", "lr_multiplier",
               "lr_scale"),
    "warmup": (
        "warmup",
        "warmup_steps",
        "warmup_iters",
        "n_warmup_steps",
        "warmup_step",
        "num_warmup_steps",
        "warmup_iterations",
        "warm_up",
        "warmup_updates",
        "w",
        "warmup_t",  # timm's, with t_initial
        "t_w",  # CS336's handout: get_lr_cosine_schedule(t, alpha_max, alpha_min, T_w, T_c)
    ),
    "max_lr": (
        "max_learning_rate",
        "max_lr",
        "lr_max",
        "learning_rate",
        "lr",
        "peak_lr",
        "base_lr",
        "alpha_max",
        "max_learning_rate",
    ),
    # a floor given as a fraction of the peak is the floor itself: check's peak is 1
    "min_lr": ("min_learning_rate", "min_lr", "lr_min", "final_lr", "alpha_min", "end_lr", "min_lr_ratio",
               "min_lr_factor", "final_lr_ratio", "lr_min_ratio", "min_ratio",
               # a decay's end named for where it ends (Hugging Face's polynomial lr_end, torch's eta_min)
               "lr_end", "end_learning_rate", "final_learning_rate", "lr_final", "eta_min"),
    # where an inverse square root schedule's warmup starts (fairseq's warmup_init_lr)
    "init_lr": ("warmup_init_lr", "init_lr", "initial_lr", "warmup_start_lr", "start_lr"),
    # a warmup-stable-decay schedule's stage at the peak (MiniCPM's, Hugging Face's get_wsd_schedule)
    "stable": ("stable_steps", "num_stable_steps", "stable_iters", "stable_iterations", "stable",
               "constant_steps", "hold_steps", "plateau_steps"),
    # its decay's length (the run's end is `total`; decay_steps is both where a cosine takes it as its end)
    "decay": ("decay_steps", "num_decay_steps", "decay_iters", "decay_iterations", "cooldown_steps",
              "num_cooldown_steps", "decay_len"),
    "total": (
        "cosine_cycle_iters",
        "total_steps",
        "max_steps",
        "lr_decay_iters",
        "decay_steps",
        "num_training_steps",
        "total_iters",
        "max_iters",
        "num_steps",
        "t_max",
        "cycle_steps",
        "training_steps",
        "decay_iters",
        "total",
        "t_initial",
        "t_c",  # CS336's handout's cosine annealing end
    ),
}

# sampling.py
TEMPERATURE_NAMES = ("temperature", "temp", "t", "tau", "temperatures")
# a loop's switch from greedy to sampling, off by default (minGPT's generate(..., do_sample=False))
SAMPLE_SWITCH_NAMES = ("do_sample", "sample", "sampling", "use_sampling", "stochastic")
K_NAMES = ("k", "top_k", "topk")
P_NAMES = ("p", "top_p", "topp", "nucleus")
MIN_P_NAMES = ("min_p", "minp", "p_min", "min_prob", "min_p_ratio")
# the truncation samplers of Hewitt et al. (epsilon and eta: Hugging Face's EpsilonLogitsWarper(epsilon),
# EtaLogitsWarper(epsilon)) and KoboldAI's top-a
EPSILON_NAMES = ("epsilon", "epsilon_cutoff", "eps_cutoff")
ETA_NAMES = ("epsilon", "eta_cutoff")
TOP_A_NAMES = ("top_a", "topa")
# locally typical sampling (Meister et al., 2022; Hugging Face's TypicalLogitsWarper(mass))
TYPICAL_NAMES = ("typical_p", "mass", "typical_mass", "typical")
GENERATOR_NAMES = ("generator", "rng", "gen")
LOGITS_NAMES = ("logits", "scores", "x", "logit", "z", "inputs", "input")
PROBS_NAMES = ("probs", "probabilities", "prob", "p_dist", "dist", "distribution")


def call_parameters(fn: Any, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """fn's parameters that a call names: not *args or **kwargs, nor those in `skip` ("self" of a
    function taken from a class)."""
    return [p for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in skip]


def readable_parameters(fn: Any) -> list[inspect.Parameter]:
    """All of fn's parameters (a class's: its constructor's, `self` left out); none when Python cannot
    read its signature (a class or function of C, or no callable at all)."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def input_roles(names: list[str]) -> list[str]:
    """The attention inputs the leading names stand for (INPUT_ROLES), up to the first that is none."""
    return list(itertools.takewhile(bool, (INPUT_ROLES.get(n.lower(), "") for n in names)))


def named(names: list[str], aliases: tuple[str, ...]) -> str | None:
    """The first of the argument names that is one of the aliases (whatever its case), or None."""
    return next((n for n in names if n.lower() in aliases), None)


def named_each(names: list[str], table: dict[str, tuple[str, ...]]) -> dict[str, str | None]:
    """Each role of `table` (role -> its aliases) -> the argument name that takes it (`named`), or None."""
    return {role: named(names, aliases) for role, aliases in table.items()}


def by_name(roles: dict[str, str | None], values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a call: each role's value under the name that takes it (roles no
    argument takes left out)."""
    return {name: values[role] for role, name in roles.items() if name}


def names_of(params: list[inspect.Parameter]) -> tuple[list[str], list[str]]:
    """The parameters' names, and those of the ones without a default (a call must fill them)."""
    return [p.name for p in params], [p.name for p in params if p.default is p.empty]
