"""Benchmark: what one decoding step of a tiny model's layer costs in handformer's modules, against the
same layer written as one Python function of raw torch calls (where the tiny model's time goes).

The layer is the first block of the 5-layer, 64-wide Llama of benchmarks/decode_limit.py after
`fuse_projections` (one Q/K/V and one gate/up matrix), one new token at cache length 64. The raw
function reads the same weights and writes the same cache slots, with no nn.Module calls, no cache
object and no checks: a floor for code that keeps torch's eager operators. Both give the same output
(checked). Medians of --rounds interleaved rounds of --calls calls each; the CPU may be shared.

    python benchmarks/decode_layer_floor.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_limit import SHAPES  # noqa: E402

from handformer.inference.fuse import fuse_projections  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.nn.masks import AttentionMask  # noqa: E402
from handformer.nn.positions import rotate_half  # noqa: E402


def layer_weights(block) -> dict:  # noqa: ANN001
    """The tensors and sizes of a fused pre-norm block, read out of its modules once."""
    attn, ffn = block.self_attn, block.ffn
    return {"H": attn.n_heads, "Hkv": attn.n_kv_heads, "Dh": attn.head_dim, "eps": block.attn_norm.eps,
            "attn_norm": block.attn_norm.weight, "qkv": attn.qkv_proj.weight, "o": attn.o_proj.weight,
            "ffn_norm": block.ffn_norm.weight, "gate_up": ffn.gate_up_proj.weight,
            "down": ffn.down_proj.weight}


def raw_layer(w: dict, x, cos, sin, keys, values, start: int):  # noqa: ANN001, ANN201
    """The block's decoding step for (1, 1, D) x, as plain torch calls on its weights `w`."""
    H, Hkv, Dh, eps = w["H"], w["Hkv"], w["Dh"], w["eps"]
    h = w["attn_norm"] * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))
    qkv = F.linear(h, w["qkv"]).view(1, 1, H + 2 * Hkv, Dh).transpose(1, 2)  # (1, H + 2 Hkv, 1, Dh)
    qk = qkv[:, :H + Hkv] * cos + rotate_half(qkv[:, :H + Hkv]) * sin
    q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + Hkv:]
    keys[:, :, start:start + 1] = k
    values[:, :, start:start + 1] = v
    out = F.scaled_dot_product_attention(q, keys[:, :, :start + 1], values[:, :, :start + 1], enable_gqa=True)
    x = x + F.linear(out.transpose(1, 2).reshape(1, 1, H * Dh), w["o"])  # (1, 1, D)
    h = w["ffn_norm"] * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))
    gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)  # (1, 1, F) each
    return x + F.linear(F.silu(gate) * up, w["down"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = fuse_projections(CausalLM(SHAPES["tiny"]()).eval())
    block, start = model.layers[0], 64
    with torch.inference_mode():
        cache = model.new_cache(128)
        model(torch.randint(0, model.cfg.vocab_size, (1, start)), cache=cache)
        x = torch.randn(1, 1, model.cfg.d_model)
        cos, sin = model.rotary(torch.tensor([[start]]))  # (1, 1, 1, Dh) each
        keys, values = cache.keys[0].clone(), cache.values[0].clone()

        def modules():
            cache.truncate(start)
            return block(x, AttentionMask(), rope=(cos, sin), cache=cache.layer(0))[0]

        weights = layer_weights(block)

        def raw():
            return raw_layer(weights, x, cos, sin, keys, values, start)

        torch.testing.assert_close(raw(), modules(), rtol=0, atol=1e-6)
        times = {"modules": [], "raw": []}
        for _ in range(args.rounds):
            for name, fn in (("modules", modules), ("raw", raw)):
                begin = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[name].append((time.perf_counter() - begin) / args.calls)
    mod, flat = statistics.median(times["modules"]), statistics.median(times["raw"])
    print(f"tiny Llama, one fused layer, one token at cache length {start}, 1 thread, medians of "
          f"{args.rounds} rounds: handformer's modules {mod * 1e6:.1f} us, raw torch calls "
          f"{flat * 1e6:.1f} us ({mod / flat:.2f}x)")


if __name__ == "__main__":
    main()
