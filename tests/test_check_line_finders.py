"""The lines that source.locate quotes for a diagnosis whose mistake is a statement commented out (top-p's
shift of its removal mask, a training step's zero_grad): the commented line, and none where no such
line is there. No check is run: the finder reads the lines alone."""

from __future__ import annotations

from handformer.check.core.source import locate

TOP_P = ["def top_p(logits, p):", "    remove = cum > p", "    # remove[..., 1:] = remove[..., :-1].clone()",
         "    return logits.masked_fill(remove, float('-inf'))"]
STEP = ["def train_step(model, optimizer, x, y):", "    # optimizer.zero_grad()", "    loss = model(x, y)",
        "    loss.backward()", "    optimizer.step()"]


def _numbered(lines: list[str]) -> list[tuple[int, str]]:
    return list(enumerate(lines, start=10))


def test_a_statement_commented_out_is_the_line_quoted():
    assert locate("top_p_drops_crossing", _numbered(TOP_P)) == (12, "# remove[..., 1:] = remove[..., :-1].clone()")
    assert locate("train_step_no_zero_grad", _numbered(STEP)) == (11, "# optimizer.zero_grad()")


def test_the_other_finders_comment_is_not_taken():
    """Each finder looks for its own statement: top-p's shift is no zero_grad and the other way round."""
    assert locate("train_step_no_zero_grad", _numbered(TOP_P))[0] != 12
    assert locate("top_p_drops_crossing", _numbered(STEP))[0] != 11
