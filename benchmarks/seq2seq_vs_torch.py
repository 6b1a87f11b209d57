"""Benchmark: handformer's Seq2SeqTransformer vs a reference built from torch.nn.Transformer.

Same config, same embeddings (token embedding * sqrt(d) + sinusoidal positions), same data, same
optimizer (AdamW) and loss (label-smoothed cross-entropy), trained for the same number of steps,
both in this one run and interleaved in rounds so machine noise hits both alike, on the same
number of torch threads (one process). Prints each model's median step time, their ratio
(handformer / reference; target <= 1.0) and final losses.

Like for like: the same dropout in the same places on both sides. `nn.Transformer(dropout=p)`
drops on each sublayer's output, on the attention weights and inside the feed-forward network
(between its two linear layers); handformer has no dropout inside its feed-forward network, so the
reference's is removed, and handformer gets `attention_dropout = p` for the weights. Both then drop
on the embeddings, each sublayer's output and the attention weights. `nn.Transformer` also ends each
stack with a LayerNorm that a post-norm handformer stack does not have; those two norms are removed.

    python benchmarks/seq2seq_vs_torch.py                   # Multi30k de-en batches if present
    python benchmarks/seq2seq_vs_torch.py --data dates      # the embedded task
    python benchmarks/seq2seq_vs_torch.py --dropout 0       # no dropout anywhere, on both sides
    python benchmarks/seq2seq_vs_torch.py --keep-cpu-memory # with the allocator setting of training
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from torch import nn

from handformer import Seq2SeqConfig, Seq2SeqTransformer
from handformer.data.batching import Seq2SeqData, encode_pairs
from handformer.data.dates import date_pairs
from handformer.data.lookup import find_folder
from handformer.data.parallel import read_pair
from handformer.data.tokenizer import Tokenizer
from handformer.nn.positions import sinusoidal_table
from handformer.training.cpu_memory import keep_freed_memory
from handformer.training.losses import token_cross_entropy


class TorchReference(nn.Module):
    """The same architecture from torch.nn building blocks (post-norm, ReLU, tied generator), with
    dropout where handformer has it and nowhere else."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model)
        self.register_buffer("pe", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers,
                                          cfg.n_decoder_layers, cfg.d_ff, cfg.dropout,
                                          batch_first=True)
        for layer in (*self.transformer.encoder.layers, *self.transformer.decoder.layers):
            layer.dropout = nn.Identity()  # inside the FFN: handformer has none there
        # handformer's post-norm stacks end with their last layer's norm, no extra one
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        self.generator.weight = self.tgt_embed.weight
        self.drop = nn.Dropout(cfg.dropout)
        for emb in (self.src_embed, self.tgt_embed):  # as handformer: unit variance after sqrt(D)
            nn.init.normal_(emb.weight, std=cfg.d_model ** -0.5)

    def embed(self, emb: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(emb(ids) * math.sqrt(self.cfg.d_model) + self.pe[: ids.size(1)])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        pad = self.cfg.pad_id
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), dtype=torch.bool)
        h = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt),
                             tgt_mask=causal, src_key_padding_mask=src == pad,
                             tgt_key_padding_mask=tgt == pad, memory_key_padding_mask=src == pad)
        return self.generator(h)


def load_batches(which: str, max_tokens: int, n_batches: int) -> tuple[list, int, int]:
    multi30k = find_folder("multi30k") if which == "multi30k" else None  # on this machine; never downloaded
    if multi30k is not None:
        pairs = read_pair(multi30k / "train.de.gz", multi30k / "train.en.gz").pairs
    else:
        which = "dates"
        pairs = date_pairs(20000, 10)[0]
    tok = Tokenizer.train_bpe([s for p in pairs for s in p], 8000)
    enc = encode_pairs(pairs, tok, tok, 128)
    data = Seq2SeqData(enc, max_tokens, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
    print(f"data: {which}, {len(pairs):,} pairs, vocab {tok.vocab_size}, max_tokens {max_tokens}")
    return data.epoch(0)[:n_batches], tok.vocab_size, tok.pad_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="multi30k", choices=["multi30k", "dates"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3, help="alternate the two models this many times")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="dropout on embeddings, sublayer outputs and attention weights, both sides")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for both")
    parser.add_argument("--keep-cpu-memory", action="store_true",
                        help="tune glibc malloc as `handformer train` does (cpu_memory.py), for both")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads for both, dropout "
          f"{args.dropout} on both")
    if args.keep_cpu_memory:
        print(f"glibc malloc keeps freed memory: {keep_freed_memory()}")

    batches, vocab, pad = load_batches(args.data, args.max_tokens, args.steps)
    cfg = Seq2SeqConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=args.d_model, n_heads=8,
                        d_ff=4 * args.d_model, n_encoder_layers=args.layers,
                        n_decoder_layers=args.layers, dropout=args.dropout,
                        attention_dropout=args.dropout, pad_id=pad, max_positions=256)
    torch.manual_seed(0)
    models = {"handformer": Seq2SeqTransformer(cfg), "torch.nn.Transformer": TorchReference(cfg)}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=5e-4, betas=(0.9, 0.98)) for k, m in models.items()}
    print("parameters: " + ", ".join(f"{k} {sum(p.numel() for p in m.parameters()):,}"
                                       for k, m in models.items()))
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    per_round = math.ceil(args.steps / args.rounds)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else None
    for r in range(args.rounds):
        chunk = batches[r * per_round: (r + 1) * per_round]
        for name, model in models.items():
            model.train()
            for i, b in enumerate(chunk):
                start = time.perf_counter()
                with ctx() if ctx else torch.enable_grad():
                    logits = model(b.src, b.tgt_in)
                    logits = logits.logits if hasattr(logits, "logits") else logits
                    loss = token_cross_entropy(logits, b.tgt_out, pad, 0.1) / b.n_tokens
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optims[name].step()
                optims[name].zero_grad(set_to_none=True)
                elapsed = time.perf_counter() - start
                if not (r == 0 and i < 3):  # warm-up steps excluded
                    times[name].append(elapsed)
                losses[name].append(loss.item())
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in models:
        print(f"{k:>22}: median step {1000 * med[k]:7.1f} ms   final loss (mean of last 10) "
              f"{statistics.mean(losses[k][-10:]):.3f}")
    ratio = med["handformer"] / med["torch.nn.Transformer"]
    print(f"ratio handformer / torch.nn.Transformer step time: {ratio:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
