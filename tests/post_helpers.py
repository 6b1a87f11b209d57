"""Tiny chat runs and data for the post-training tests (SFT, DPO, GRPO): random weights built
from a config, a BPE tokenizer with ChatML's role tokens, nothing downloaded."""

import json
import random
from pathlib import Path

import torch
from tokenizers import AddedToken

from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import save_lm_run

# ChatML, with the assistant's reply and its end token marked for training (as TRL reads them).
CHATML_MARKED = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The same without markers: the assistant's tokens are found by rendering prefixes.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["what is two plus three? five. hello there, user assistant system. spell cat: c a t"] * 20


def chat_tokenizer() -> Tokenizer:
    tok = Tokenizer.train_bpe(CORPUS, 300)
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t in ("<|im_start|>", "<|im_end|>")])
    return tok


def model_config(vocab_size: int, position: str = "rope", **overrides) -> CausalLMConfig:
    base = CausalLMConfig.llama_style() if position == "rope" else CausalLMConfig.gpt2_style()
    fields = {**base.to_dict(), "vocab_size": vocab_size, "d_model": 32, "n_heads": 4, "d_ff": 64,
              "n_layers": 2, "max_positions": 96, "dropout": 0.0, **overrides}
    if position == "rope":
        fields["n_kv_heads"] = 2
    if position == "sinusoidal":
        fields["position"] = "sinusoidal"
    return CausalLMConfig.from_dict(fields)


def make_chat_base(run_dir: Path, template: str = CHATML_MARKED, position: str = "rope", seed: int = 0,
                   **overrides) -> Path:
    """A random-weight run that can chat: ChatML roles in its tokenizer and its template."""
    tok = chat_tokenizer()
    torch.manual_seed(seed)
    model = CausalLM(model_config(tok.vocab_size, position, **overrides))
    end = tok.hf.token_to_id("<|im_end|>")
    save_lm_run(run_dir, model, tok, SpecialTokens(bos_id=None, eos_id=tok.eos_id, pad_id=tok.pad_id,
                                                   eos_ids=[tok.eos_id, end]))
    (run_dir / "chat_template.jinja").write_text(template)
    return run_dir


def sums(n: int, seed: int = 0) -> list[tuple[str, str]]:
    r = random.Random(seed)
    return [(f"what is {a} plus {b}?", str(a + b)) for a, b in ((r.randint(0, 9), r.randint(0, 9))
                                                               for _ in range(n))]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def conversations(n: int, seed: int = 0) -> list[dict]:
    """SFT lines: one or two turns of small sums."""
    out = []
    pairs = sums(2 * n, seed)
    for i in range(n):
        (q1, a1), (q2, a2) = pairs[2 * i], pairs[2 * i + 1]
        messages = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}]
        if i % 2:
            messages += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "answer with a number"})
        out.append({"messages": messages})
    return out


def quiet_sets(*pairs: str) -> list[str]:
    return [arg for pair in ("train.progress=false", "train.device=cpu", *pairs) for arg in ("--set", pair)]


def post_run(run_dir: Path):
    """The tokenizer, template, tokens and renderer of a chat run, as a post-training job sees them."""
    from handformer.generation.chat import stop_ids_for
    from handformer.generation.chat_template import load_chat_template
    from handformer.tasks.lm.run import load_lm
    from handformer.tasks.post.rendering import ConversationRenderer
    from handformer.tasks.post.setup import PostRun

    run = load_lm(run_dir)
    template = load_chat_template(run_dir)
    stops = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    return PostRun(run.tokenizer, template, run.tokens, stops, ConversationRenderer(template, run.tokenizer, stops))


def length_reward(prompts, completions, **columns):
    """A reward for tests, in TRL's form (a completion is text here, a list of messages in TRL's
    conversational data): longer replies are better, up to 6 characters."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [min(len(t), 6) / 6 for t in texts]


def answer_reward(prompts, completions, answer, **columns):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
