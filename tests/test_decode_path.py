"""The decode path's shortcuts compute what the plain path computes.

`last_only=True` (what `generate` asks for) gives the last position's logits of a full forward,
with and without padding and a cache, and the cache ends up the same.
"""

import pytest
import torch

from handformer.config import CausalLMConfig
from handformer.models.causal_lm import CausalLM

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@torch.no_grad()
def test_last_only_equals_the_last_row_of_all_logits(style):
    build = CausalLMConfig.gpt2_style if style == "gpt2" else CausalLMConfig.llama_style
    torch.manual_seed(0)
    model = CausalLM(build(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2 if style == "llama" else None,
                           d_ff=64, n_layers=2, max_positions=32)).eval()
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    full = model(ids, mask).logits  # (B, T, V)
    last = model(ids, mask, last_only=True).logits  # (B, 1, V)
    assert last.shape == (2, 1, 50)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-6)

    cache_a, cache_b = model.new_cache(16), model.new_cache(16)
    model(ids[:, :6], mask[:, :6], cache=cache_a)
    model(ids[:, :6], mask[:, :6], cache=cache_b, last_only=True)
    step_a = model(ids[:, 6:], mask, cache=cache_a).logits[:, -1:]
    step_b = model(ids[:, 6:], mask, cache=cache_b, last_only=True).logits
    torch.testing.assert_close(step_b, step_a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(step_b, full[:, -1:], atol=1e-5, rtol=1e-5)
