"""handformer.see.memory counts the tensors a computation creates, and shows the O(n^2) memory of
the explicit attention path against the fused kernel."""

import torch

from handformer.see.memory import attention_memory, peak_tensor_bytes


def test_counts_what_is_alive_at_the_peak():
    assert peak_tensor_bytes(lambda: torch.ones(1000)) == 4000  # float32
    # ones (4000 B) and ones + 1 (4000 B) are alive together; the sum's 4 bytes come after ones is freed
    assert peak_tensor_bytes(lambda: (torch.ones(1000) + 1).sum()) == 8000
    x = torch.ones(1000)
    assert peak_tensor_bytes(lambda: x.view(10, 100)) == 0  # a view of an input allocates nothing


def test_freed_temporaries_do_not_add_up():
    def chain():
        y = torch.ones(1000)
        for _ in range(5):
            y = y * 2  # the previous y is freed at each step
        return y

    assert peak_tensor_bytes(chain) == 8000


def test_explicit_attention_is_quadratic_and_the_fused_kernel_is_not():
    lengths = (128, 256, 512)
    explicit = attention_memory(lengths, head_dim=16, need_weights=True)
    fused = attention_memory(lengths, head_dim=16, need_weights=False)
    for n, peak in zip(lengths, explicit):
        assert peak >= 2 * n * n * 4  # scores and weights, (n, n) float32 each
    assert all(3.5 < b / a <= 4.0 for a, b in zip(explicit, explicit[1:]))
    assert all(b / a == 2 for a, b in zip(fused, fused[1:]))
    assert fused[-1] < explicit[-1] / 50
