"""What handformer computes, recorded so that a change of form can be shown to change nothing.

`collect()` builds every model preset and every imported family (tiny sizes, weights drawn from a
seeded generator over handformer's own state dict, so no library's initialisation enters), runs
them on fixed inputs and records: greedy tokens (one prompt, and a left-padded batch, with and
without the KV cache), seeded samples, a logits checksum (sum and largest magnitude, at every
position), attention-weight sums, the encoder-decoder's greedy and beam outputs, and the first 20
training losses of configs/tiny_lm.toml and configs/tiny_seq2seq.toml. The bad-input messages of
tests/test_faults.py are recorded by that test itself (HANDFORMER_WRITE_GOLDEN=1) in the same file.

    python tests/golden/behaviour.py          # rewrite tests/golden/behaviour.json (models, losses)
    HANDFORMER_WRITE_GOLDEN=1 python -m pytest -q tests/test_faults.py   # then the messages

tests/test_behaviour.py recomputes `collect()` and compares it with the committed file: tokens
equal, checksums within 1e-5 (relative), losses within 1e-6.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from handformer.data.lookup import find_folder

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("behaviour.json")
STORIES = find_folder("stories260K")  # through the data lookup; None when it is not on this machine


def _fill(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter from one seeded generator, in state-dict order: norm gains around their
    identity value, everything else N(0, 0.3) (large enough that greedy tokens vary)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(0.2 * noise + (1.0 if "norm" in name and name.endswith("weight")
                                   and getattr(model.cfg, "norm", "") != "rmsnorm_offset" else 0.0)
                    if "norm" in name else 0.3 * noise)
    return model.eval()


def _checksum(t: torch.Tensor) -> list[float]:
    t = t.double()
    return [float(t.sum()), float(t.abs().max())]


def _causal_lm_cases() -> dict[str, Any]:
    from handformer.config import CausalLMConfig, Llama3RopeScaling, MoEConfig

    tiny = dict(vocab_size=61, d_model=32, n_heads=4, d_ff=48, n_layers=2, max_positions=64, dropout=0.0)
    cases = {
        "gpt2": CausalLMConfig.gpt2_style(**tiny),
        "llama": CausalLMConfig.llama_style(**{**tiny, "n_kv_heads": 2}),
        "llama_window": CausalLMConfig.llama_style(**{**tiny, "n_kv_heads": 2}, sliding_window=5),
        "default_sinusoidal_post": CausalLMConfig(**tiny, position="sinusoidal", norm_placement="post"),
        "no_positions_geglu": CausalLMConfig(**tiny, position="none", activation="geglu", norm="rmsnorm"),
        "gemma_like": CausalLMConfig.llama_style(**{**tiny, "n_kv_heads": 1}, head_dim=12,
                                                 norm="rmsnorm_offset", activation="geglu_tanh",
                                                 scale_embeddings=True, tie_embeddings=True),
        "qwen_like": CausalLMConfig.llama_style(**tiny, qkv_bias=True, rope_theta=1e6),
        "llama3_scaling": CausalLMConfig.llama_style(**{**tiny, "max_positions": 128}, rope_theta=5e5,
                                                     rope_scaling=Llama3RopeScaling(original_max_positions=16)),
        "llama_moe": CausalLMConfig.llama_style(**{**tiny, "n_kv_heads": 2},
                                                moe=MoEConfig(n_experts=4, top_k=2, d_expert=24)),
    }
    return cases


def _lm_record(model, seed: int) -> dict[str, Any]:
    from handformer.generation.generate import generate

    g = torch.Generator().manual_seed(seed)
    V = model.cfg.vocab_size
    ids = torch.randint(3, V, (2, 11), generator=g)
    with torch.no_grad():
        out = model(ids, need_weights=True)
        mask = torch.ones(2, 11, dtype=torch.long)
        mask[1, :4] = 0
        padded = model(ids, attention_mask=mask)
    prompts = [ids[0, :7].tolist(), ids[1, :3].tolist(), ids[1, :9].tolist()]
    return {
        "logits": _checksum(out.logits),
        "logits_left_padded": _checksum(padded.logits[1, 4:]),
        "attention": [None if w is None else _checksum(w) for w in out.attentions],  # None: linear attention
        "greedy": generate(model, prompts[:1], 20, temperature=0.0),
        "greedy_batch": generate(model, prompts, 20, temperature=0.0),
        "greedy_batch_uncached": generate(model, prompts, 20, temperature=0.0, use_cache=False),
        "sampled": generate(model, prompts, 12, temperature=0.9, top_k=20, top_p=0.9, seed=seed),
        "stopped": generate(model, prompts, 12, temperature=1.0, seed=seed + 1, stop_tokens=[5, 6, 7]),
    }


def _families() -> dict[str, Any]:
    """Hugging Face configs of every family import-hf reads, as handformer maps them."""
    import transformers

    size = dict(vocab_size=67, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    rope = {"rope_type": "default", "rope_theta": 1e4}
    return {
        "gpt2": transformers.GPT2Config(vocab_size=67, n_positions=64, n_embd=32, n_layer=2, n_head=4),
        "llama": transformers.LlamaConfig(**size, rope_parameters=rope),
        "llama3": transformers.LlamaConfig(**{**size, "max_position_embeddings": 128}, tie_word_embeddings=True,
                                           rope_parameters={"rope_type": "llama3", "rope_theta": 5e5,
                                                            "factor": 8.0, "low_freq_factor": 1.0,
                                                            "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 16}),
        "smollm": transformers.LlamaConfig(**{**size, "hidden_size": 36, "num_attention_heads": 6,
                                              "num_key_value_heads": 3}, tie_word_embeddings=True,
                                           rope_parameters=rope),
        "qwen2": transformers.Qwen2Config(**size, tie_word_embeddings=True, use_sliding_window=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        "mistral_window": transformers.MistralConfig(**size, sliding_window=5, rope_parameters=rope),
        "gemma": transformers.GemmaConfig(**{**size, "num_key_value_heads": 1}, head_dim=12,
                                          hidden_act="gelu", rope_parameters=rope),
        "phi3": transformers.Phi3Config(**size, sliding_window=5, tie_word_embeddings=False,
                                        rope_parameters=rope),
        # today's families
        "qwen3_window": transformers.Qwen3Config(**{**size, "num_hidden_layers": 3}, head_dim=12,
                                                 use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                                 rope_parameters=rope),
        "gemma2": transformers.Gemma2Config(**{**size, "num_hidden_layers": 3}, head_dim=8, sliding_window=5,
                                            query_pre_attn_scalar=12, rope_parameters=rope),
        "gemma3_text": transformers.Gemma3TextConfig(
            **{**size, "num_hidden_layers": 3, "num_key_value_heads": 1}, head_dim=32, sliding_window=5,
            sliding_window_pattern=3, query_pre_attn_scalar=32,
            rope_parameters={"sliding_attention": rope, "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                           "rope_theta": 1e6}}),
        "smollm3": transformers.SmolLM3Config(**{**size, "num_hidden_layers": 4}, rope_parameters=rope),
        "olmo2": transformers.Olmo2Config(**size, rope_parameters=rope),
        "phi3_longrope": transformers.Phi3Config(
            **size, tie_word_embeddings=True, original_max_position_embeddings=16, partial_rotary_factor=0.75,
            rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0, 1.2, 1.4], "long_factor": [2.0, 3.0, 4.0]}),
        "mixtral": transformers.MixtralConfig(**size, num_local_experts=4, num_experts_per_tok=2, rope_parameters=rope),
        "qwen3_moe": transformers.Qwen3MoeConfig(**size, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                                 norm_topk_prob=True, rope_parameters=rope),
        "qwen2_moe": transformers.Qwen2MoeConfig(**size, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                                 shared_expert_intermediate_size=32, rope_parameters=rope),
        "olmoe": transformers.OlmoeConfig(**size, num_experts=4, num_experts_per_tok=2, rope_parameters=rope),
        "starcoder2": transformers.Starcoder2Config(**size, sliding_window=5, rope_parameters=rope),
        # the open families of 2025-26
        "granite": transformers.GraniteConfig(**size, embedding_multiplier=12.0, attention_multiplier=0.03125,
                                              residual_multiplier=0.22, logits_scaling=1.5, rope_parameters=rope),
        "gpt_oss": transformers.GptOssConfig(
            **{**size, "num_hidden_layers": 3}, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=5, swiglu_limit=1.5,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16}),
        "seed_oss": transformers.SeedOssConfig(**size, head_dim=8, attention_bias=True, attention_out_bias=False,
                                               mlp_bias=False, rope_parameters=rope),
        "olmo3": transformers.Olmo3Config(**{**size, "num_hidden_layers": 4}, sliding_window=5, rope_parameters={
            kind: {"rope_type": "default", "rope_theta": 5e5} for kind in ("sliding_attention", "full_attention")}),
        "hunyuan_v1_dense": transformers.HunYuanDenseV1Config(
            **size, head_dim=8, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 1000.0,
                                                 "factor": 1.0}),
        "ernie4_5": transformers.Ernie4_5Config(**size, head_dim=8, use_bias=True, rope_parameters=rope),
        "deepseek_v3": transformers.DeepseekV3Config(
            **{**size, "num_key_value_heads": 4, "num_hidden_layers": 3}, moe_intermediate_size=12,
            first_k_dense_replace=1, n_routed_experts=6, n_group=3, topk_group=2, num_experts_per_tok=2,
            n_shared_experts=1, kv_lora_rank=10, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
            v_head_dim=5, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 3.0,
                                           "original_max_position_embeddings": 16, "mscale": 0.707,
                                           "mscale_all_dim": 1.0}),
        "glm4": transformers.Glm4Config(**size, head_dim=12, attention_bias=True,
                                        rope_parameters={**rope, "partial_rotary_factor": 0.5}),
        "exaone4": transformers.Exaone4Config(**{**size, "num_hidden_layers": 4}, head_dim=12, sliding_window=5,
                                              sliding_window_pattern=4, rope_parameters=rope),
        "apertus": transformers.ApertusConfig(**size, head_dim=8, rope_parameters={
            "rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        "qwen3_5_text": transformers.Qwen3_5TextConfig(
            **{**size, "num_hidden_layers": 3, "num_key_value_heads": 1}, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=6, linear_value_head_dim=8, linear_conv_kernel_dim=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            rope_parameters={**rope, "partial_rotary_factor": 0.25}),
        "ministral3": transformers.Ministral3Config(
            **size, head_dim=8, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                 "original_max_position_embeddings": 8,
                                                 "llama_4_scaling_beta": 0.1}),
    }


def _seq2seq_record(seed: int, **overrides: Any) -> dict[str, Any]:
    from handformer.config import Seq2SeqConfig
    from handformer.generation.decoding import DecodeLimits, beam_search, greedy_decode
    from handformer.models.seq2seq import Seq2SeqTransformer

    cfg = Seq2SeqConfig(**{**dict(src_vocab_size=41, tgt_vocab_size=43, d_model=32, n_heads=4, d_ff=48,
                                  n_encoder_layers=2, n_decoder_layers=2, max_positions=64, dropout=0.0),
                           **overrides})
    torch.manual_seed(seed)
    model = _fill(Seq2SeqTransformer(cfg), seed)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 41, (3, 9), generator=g)
    src[1, 6:] = 0  # right padding
    src[2, 4:] = 0
    tgt = torch.randint(3, 43, (3, 7), generator=g)
    tgt[2, 5:] = 0
    with torch.no_grad():
        out = model(src, tgt, need_weights=True)
    limits = DecodeLimits(bos_id=1, eos_id=2, pad_id=0, max_len_a=1.0, max_len_b=4)
    return {
        "logits": _checksum(out.logits),
        "encoder_attention": [_checksum(w) for w in out.encoder_attentions],
        "decoder_attention": [_checksum(w) for w in out.decoder_attentions],
        "cross_attention": [_checksum(w) for w in out.cross_attentions],
        "greedy": greedy_decode(model, src, limits).tolist(),
        "greedy_uncached": greedy_decode(model, src, limits, use_cache=False).tolist(),
        "beam4": beam_search(model, src, limits, beam_size=4),
        "beam3_penalty": beam_search(model, src, limits, beam_size=3, length_penalty=1.5),
    }


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT_TEXT = "the quick brown fox jumps over the lazy dog. Hello, who are you? I am a model!"


def _callers() -> dict[str, Any]:
    """What the other decoding callers give on a seeded tiny model: a chat of three turns (one
    generator for the conversation), the playground's step-by-step Generation (its tokens and the
    logits it shows) and serve's continuous batching (rows of different prompts, options and
    seeds that join at different steps)."""
    import threading

    from tokenizers import AddedToken

    from handformer.config import CausalLMConfig
    from handformer.data.special_tokens import SpecialTokens
    from handformer.data.tokenizer import Tokenizer
    from handformer.generation.chat import ChatSession
    from handformer.generation.chat_template import ChatTemplate
    from handformer.generation.engine import SamplingOptions
    from handformer.models.causal_lm import CausalLM
    from handformer.serve.engine import BatchEngine, Sequence
    from handformer.serve.playground_lookups import Generation
    from handformer.tasks.lm.run import LMRun

    tok = Tokenizer.train_char([CHAT_TEXT])
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok = Tokenizer(tok.hf)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                     n_layers=2, max_positions=256)
    model = _fill(CausalLM(cfg), 300)
    end = tok.hf.token_to_id("<|im_end|>")
    result: dict[str, Any] = {}
    chat = ChatSession(model, tok, ChatTemplate(CHATML, {"eos_token": "<|im_end|>"}), [end],
                       sampling=SamplingOptions(temperature=0.9, top_k=12, seed=5), max_new_tokens=12)
    result["chat"] = [chat.send(text) for text in ("Hello", "who are you?", "I am a fox")]
    result["chat_processed"] = chat.processed
    run = LMRun(model, tok, SpecialTokens(eos_ids=[end]), {})
    gen = Generation(run, tok.encode("the lazy dog"), 16, SamplingOptions(temperature=0.8, top_p=0.9, seed=11))
    shown = []
    while not gen.done:
        token, logits = gen.step()
        shown.append(_checksum(logits))
    result["playground"] = {"tokens": gen.new, "logits": shown, "finish": gen.finish_reason}

    class Sink:
        def __init__(self) -> None:
            self.tokens, self.logprobs, self.reason, self.ended = [], [], None, threading.Event()

        def token(self, token_id, logprob, top, is_stop_token) -> bool:
            self.tokens.append(token_id)
            self.logprobs.append(None if logprob is None else [logprob, top])
            return False

        def finish(self, reason: str) -> None:
            self.reason = reason
            self.ended.set()

        def fail(self, message: str, status: int = 500) -> None:
            self.reason = "failed: " + message
            self.ended.set()

    prompts = ["the", "quick brown", "Hello, who are", "I", "a lazy dog jumps", "model"]
    seqs = [Sequence(tok.encode(p), 6 + 3 * i, SamplingOptions((0.0, 1.0, 0.7)[i % 3], (None, 8)[i % 2],
                                                                (None, None, 0.9)[i % 3], 40 + i,
                                                                2 if i % 2 else None),
                     frozenset({end}), Sink()) for i, p in enumerate(prompts)]
    engine = BatchEngine(model, threading.Lock(), max_batch=4)
    for seq in seqs[:3]:
        engine.submit(seq)
    engine.start()
    seqs[0].sink.ended.wait(30)
    for seq in seqs[3:]:
        engine.submit(seq)
    for seq in seqs:
        seq.sink.ended.wait(30)
    engine.stop()
    result["serve"] = [{"tokens": q.sink.tokens, "logprobs": q.sink.logprobs, "finish": q.sink.reason}
                       for q in seqs]
    return result


def _train_losses(config: str) -> list[float]:
    from handformer.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        args = ["train", "--config", str(ROOT / "configs" / config), "--out", str(Path(tmp) / "run"),
                "--set", "train.steps=20", "--set", "train.log_every=1", "--set", "train.eval_every=20",
                "--set", "train.progress=false", "--set", "train.device=cpu"]
        code = main(args)
        if code != 0:
            raise RuntimeError(f"training {config} failed with exit code {code}")
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in records if "train_loss" in r]


def collect() -> dict[str, Any]:
    """Everything recorded but the fault messages (see the module docstring)."""
    from handformer.convert.hf_weights import config_from_hf
    from handformer.families import build_causal_lm
    from handformer.models.causal_lm import CausalLM

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result: dict[str, Any] = {"presets": {}, "families": {}, "seq2seq": {}}
        for i, (name, cfg) in enumerate(_causal_lm_cases().items()):
            torch.manual_seed(i)
            result["presets"][name] = _lm_record(_fill(build_causal_lm(cfg), 100 + i), i)
        for i, (name, hf_cfg) in enumerate(_families().items()):
            cfg = config_from_hf(hf_cfg.to_dict())
            torch.manual_seed(i)
            result["families"][name] = _lm_record(_fill(build_causal_lm(cfg), 200 + i), i)
        if STORIES is not None:
            from handformer.convert.hf_import import model_from_state
            from handformer.convert.llama2c_weights import read_llama2c

            header, state = read_llama2c(STORIES / "stories260K.bin")
            model = CausalLM(header.config())  # on the CPU: model_from_state's is on the meta device
            model.load_state_dict(model_from_state(header.config(), state).state_dict())
            result["families"]["llama2c_stories260K"] = _lm_record(model.eval(), 7)
        result["callers"] = _callers()
        result["seq2seq"]["paper_post_norm"] = _seq2seq_record(0)
        result["seq2seq"]["pre_norm_learned_shared"] = _seq2seq_record(
            1, norm_placement="pre", position="learned", src_vocab_size=43, share_embeddings=True)
        result["seq2seq"]["rmsnorm_swiglu_gqa"] = _seq2seq_record(
            2, norm="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False, tie_output=False)
        result["training"] = {"tiny_lm": _train_losses("tiny_lm.toml"),
                              "tiny_seq2seq": _train_losses("tiny_seq2seq.toml"),
                              "tiny_moe": _train_losses("tiny_moe.toml")}
        return result
    finally:
        torch.set_num_threads(before)


def read() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def write(section: str, value: Any) -> None:
    """Replace one top-level section of the golden file, keeping the others."""
    data = read() if GOLDEN.is_file() else {}
    data[section] = value
    text = json.dumps(data, indent=1, sort_keys=True)
    # Lists of numbers on one line each: a diff of the file reads as changed records.
    text = re.sub(r"\[[^\[\]{}]*\]", lambda m: " ".join(m.group(0).split()), text)
    GOLDEN.write_text(text + "\n")


if __name__ == "__main__":
    recorded = collect()
    for key, value in recorded.items():
        write(key, value)
    print(f"wrote {GOLDEN.relative_to(ROOT)} ({', '.join(recorded)})", file=sys.stderr)
