"""The lines quoted for two sampling filters' mistakes (Hugging Face's processors): top-p with its
shift right commented out quotes the commented line; a top-k that compares with `<=` against the k-th
value quotes that comparison, not an argument check above it."""

from handformer.check.core.source import locate

TOP_P = """def top_p(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    # sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
"""
TOP_K = """class TopK:
    def __init__(self, top_k):
        if top_k <= 0:
            raise ValueError(top_k)
        self.top_k = top_k

    def __call__(self, input_ids, scores):
        indices_to_remove = scores <= torch.topk(scores, self.top_k)[0][..., -1, None]
        return scores.masked_fill(indices_to_remove, -float("inf"))
"""


def numbered(source):
    return list(enumerate(source.splitlines(), start=1))


def test_the_commented_shift_is_quoted():
    assert locate("top_p_drops_crossing", numbered(TOP_P))[0] == 5


def test_the_comparison_with_the_kth_value_is_quoted():
    assert locate("top_k_off_by_one", numbered(TOP_K))[0] == 8
