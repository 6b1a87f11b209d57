"""Benchmark: handformer's LoRA (handformer/adapters/lora.py) vs transformers + peft, side by side.

The same Llama-style base model is built twice: Hugging Face's LlamaForCausalLM (random init,
seeded) and handformer's CausalLM holding the same weights (handformer.convert.hf_weights). The
same LoRA config is put on both (peft's `get_peft_model` and handformer's `add_lora`), and
peft's initial A matrices are copied into handformer's adapters (B starts at zero in both), so both
start from the same model with the same adapters. Both are trained in the same loop on the same
batches: character windows of tiny Shakespeare (random ids when the file is absent), AdamW (fused)
on the trainable parameters only, gradient clipping at 1.0, cross-entropy on the logits.

Rounds are interleaved (handformer, peft, then peft, handformer, ...), each model continuing its
own training, so both see the machine's load alike; each step is timed and the median over all
timed steps is reported. Printed: trainable parameters, the median step time of each and their
ratio (target: handformer <= 1.0x peft's), and the losses of both after every round (equal within
fp32 noise: the two are the same computation).

    python benchmarks/lora_vs_peft.py                               # defaults below
    python benchmarks/lora_vs_peft.py --targets all-linear --rank 16
    python benchmarks/lora_vs_peft.py --threads 1   # on a shared machine

Needs `transformers` and `peft` (dev dependencies of handformer). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.adapters.lora import LoRAConfig, LoRALinear, add_lora  # noqa: E402
from handformer.convert.hf_weights import model_from_hf  # noqa: E402
from handformer.data.lookup import find  # noqa: E402


def batches(args: argparse.Namespace, n: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int, str]:
    """n batches of (x, y) windows and the vocabulary size."""
    gen = torch.Generator().manual_seed(args.seed)
    shakespeare = find("tinyshakespeare", "input.txt")  # on this machine (docs/data.md); never downloaded
    if shakespeare is not None:
        text = shakespeare.read_text()
        chars = sorted(set(text))
        ids = torch.tensor([chars.index(c) for c in text[:200_000]])
        vocab, source = len(chars), f"tiny Shakespeare characters ({len(chars)} symbols)"
    else:
        vocab, source = 96, "random ids (tiny Shakespeare not found)"
        ids = torch.randint(0, vocab, (200_000,), generator=gen)
    out = []
    for _ in range(n):
        starts = torch.randint(0, len(ids) - args.block - 1, (args.batch,), generator=gen)
        chunk = torch.stack([ids[s:s + args.block + 1] for s in starts.tolist()])  # (B, T + 1)
        out.append((chunk[:, :-1], chunk[:, 1:]))
    return out, vocab, source


def build(args: argparse.Namespace, vocab: int):
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=args.d_model, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, intermediate_size=args.d_ff, num_hidden_layers=args.layers,
        max_position_embeddings=args.block, tie_word_embeddings=False, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    ours = model_from_hf(hf.config.to_dict(), hf.state_dict())
    targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
    theirs = peft.get_peft_model(hf, peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                                     target_modules=targets))
    add_lora(ours, LoRAConfig(rank=args.rank, alpha=args.alpha, targets=targets))
    with torch.no_grad():  # the same initial adapters: peft's A (Kaiming), B = 0 in both
        for name, layer in theirs.named_modules():
            if isinstance(layer, peft.tuners.lora.Linear):
                ours_name = name.removeprefix("base_model.model.model.").replace(".mlp.", ".ffn.")
                mine = ours.get_submodule(ours_name)
                assert isinstance(mine, LoRALinear)
                mine.lora_A.copy_(layer.lora_A["default"].weight)
                mine.lora_B.copy_(layer.lora_B["default"].weight)
    return theirs, ours


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=688)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="q_proj,v_proj", help='comma-separated names, or "all-linear"')
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the first round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one per core); "
                   "1 on a machine busy with other jobs (see lora_threads_under_load.py)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    data, vocab, source = batches(args, args.warmup + args.steps * args.rounds)
    theirs, ours = build(args, vocab)
    models = {"handformer": ours, "peft": theirs}
    logits_of = {"handformer": lambda x: ours(x).logits, "peft": lambda x: theirs(input_ids=x).logits}
    params = {k: [q for q in m.parameters() if q.requires_grad] for k, m in models.items()}
    optims = {k: torch.optim.AdamW(v, lr=args.lr, weight_decay=0.0, fused=True) for k, v in params.items()}
    trainable = {k: sum(q.numel() for q in v) for k, v in params.items()}
    total = sum(q.numel() for q in ours.parameters())
    print(f"Llama-style base: d_model {args.d_model}, {args.layers} layers, {args.heads} heads "
          f"({args.kv_heads} kv), d_ff {args.d_ff}, vocab {vocab}: {total:,} parameters; LoRA rank "
          f"{args.rank}, alpha {args.alpha}, targets {args.targets}: trainable {trainable['handformer']:,} "
          f"(handformer) vs {trainable['peft']:,} (peft)")
    print(f"data: {source}; batch {args.batch} x {args.block} tokens; {torch.get_num_threads()} threads")

    def step(name: str, x: torch.Tensor, y: torch.Tensor) -> float:
        logits = logits_of[name](x)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params[name], 1.0, foreach=True)
        optims[name].step()
        optims[name].zero_grad(set_to_none=True)
        return loss.item()

    for model in models.values():
        model.train()
    for x, y in data[: args.warmup]:  # warm-up (allocator, kernels), the same steps for both
        for name in models:
            step(name, x, y)
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        round_data = data[args.warmup + r * args.steps: args.warmup + (r + 1) * args.steps]
        for name in order:
            for x, y in round_data:
                start = time.perf_counter()
                loss = step(name, x, y)
                times[name].append(time.perf_counter() - start)
            losses[name].append(loss)
        ms = {k: 1e3 * statistics.median(v[-args.steps:]) for k, v in times.items()}
        print(f"round {r + 1}: median step handformer {ms['handformer']:.1f} ms, peft {ms['peft']:.1f} ms; "
              f"loss after {args.warmup + (r + 1) * args.steps} steps: {losses['handformer'][-1]:.5f} vs "
              f"{losses['peft'][-1]:.5f}")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian step over {len(times['peft'])} timed steps each: handformer "
          f"{1e3 * med['handformer']:.1f} ms, peft {1e3 * med['peft']:.1f} ms: ratio "
          f"{med['handformer'] / med['peft']:.2f}x (target <= 1.0)")
    gap = max(abs(a - b) for a, b in zip(losses["handformer"], losses["peft"]))
    print(f"loss after {args.warmup + args.rounds * args.steps} steps: handformer "
          f"{losses['handformer'][-1]:.5f}, peft {losses['peft'][-1]:.5f} "
          f"(largest gap after a round: {gap:.2e})")


if __name__ == "__main__":
    main()
