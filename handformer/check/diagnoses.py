"""The named mistakes `handformer check` can diagnose, each with its fix, in English and Chinese.

A diagnosis is never guessed: `handformer.check.variants` computes what a component would output
*with* the mistake (same weights, same inputs), and a diagnosis is reported only when the learner's
output matches that variant and not the correct computation (or, for dropout and causality, when a
property test shows the fingerprint). `patterns` find the likely line in the learner's source.

Some pairs cannot both be named when planted together: EXCLUSIVE pairs are two ways of writing the
same line (only one can be in the code at once); MASKING pairs hide one another (the output of the
pair equals the output of something else). docs/check.md lists both with the reason.
"""

from __future__ import annotations

from handformer.check.catalog import components, llm, sampling
from handformer.check.catalog.base import Diagnosis

CATALOG: dict[str, Diagnosis] = {d.name: d for chapter in (components, llm, sampling)
                                 for d in chapter.DIAGNOSES}


# Pairs that cannot both be planted (they rewrite the same expression) or whose sum is not
# identifiable (one hides the other); docs/check.md lists them with the reason.
EXCLUSIVE: dict[frozenset[str], str] = {
    frozenset({"no_scaling", "scale_by_dk"}): "both rewrite the divisor of the scores",
    frozenset({"mask_after_softmax", "nan_on_masked_rows"}):
        "after the softmax there are no scores to fill with -inf",
    frozenset({"rmsnorm_no_sqrt", "norm_eps_outside_sqrt"}):
        "without the square root, eps is neither inside nor outside it",
    frozenset({"gated_act_after_product", "gated_activation_wrong_branch"}):
        "after the product there is no branch to put the activation on",
    frozenset({"temperature_multiplied", "temperature_after_softmax"}):
        "both rewrite the one line of the temperature",
    frozenset({"top_p_drops_crossing", "top_p_extra_at_equality"}):
        "two rules for the same comparison (cum > p is the other form of dropping the crossing token)",
    frozenset({"top_p_drops_crossing", "top_p_empty_set"}):
        "the plants rewrite the same rule; written together (cum > p with no guard) both are named",
    frozenset({"top_p_extra_at_equality", "top_p_empty_set"}):
        "the plants rewrite the same rule; written together (a shifted cum > p with no guard) both are "
        "named",
}
MASKING: dict[frozenset[str], str] = {}
