"""The named mistakes `handformer check` can diagnose, each with its fix, in English and Chinese.

A diagnosis is never guessed: `handformer.check.reference.variants` computes what a component would output
*with* the mistake (same weights, same inputs), and a diagnosis is reported only when the learner's
output matches that variant and not the correct computation (or, for dropout and causality, when a
property test shows the fingerprint). `patterns` find the likely line in the learner's source.

Some pairs cannot both be named when planted together: EXCLUSIVE pairs are two ways of writing the
same line (only one can be in the code at once); MASKING pairs hide one another (the output of the
pair equals the output of something else). docs/check.md lists both with the reason.
"""

from __future__ import annotations

from handformer.check.catalog import assembly, cache, components, llm, sampling, tokenizer, training
from handformer.check.catalog.base import DEPARTS, UNLOCATED, Diagnosis, d

CHAPTERS = (components, llm, sampling, training, assembly, tokenizer, cache)
CATALOG: dict[str, Diagnosis] = {d.name: d for chapter in CHAPTERS for d in chapter.DIAGNOSES}
# what a FAIL no catalogued mistake explains reports: the line where it first parts from the reference
DEPARTURE = d(DEPARTS, "no known mistake reproduces it: this is the first line where your computation parts "
              "from the reference", "没有任何已知错误能复现它：这是你的计算第一次与参考分开的那一行",
              "make this line compute the reference's step (the difference above says how yours differs)",
              "让这一行算出参考的那一步（上面的差别说明了你的结果差在哪里）")


# what a FAIL reports where neither a mistake nor a departure was found (core/unlocated.py)
NOT_LOCATED = d(UNLOCATED, "no known mistake reproduces it and check could not single out the line where it "
                "departs: this is where the component is defined",
                "没有任何已知错误能复现它，检查程序也找不出计算从哪一行开始不同：这里是这个组件定义的地方",
                "compare each line of it with the reference's step (the failed check above says what "
                "differs)", "把它的每一行和参考的那一步对照（上面未通过的检查说明了哪里不同）")
# a finding's name: a catalogued mistake, the departure, or neither located
FINDINGS = {**CATALOG, DEPARTS: DEPARTURE, UNLOCATED: NOT_LOCATED}


def diagnosis(name: str) -> Diagnosis:
    """A finding's diagnosis: a catalogued mistake, or the departure."""
    return FINDINGS[name]


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
    frozenset({"top_p_drops_crossing", "top_p_empty_set"}):
        "the plants rewrite the same rule; written together (cum > p with no guard) both are named",
    frozenset({"greedy_no_stop_at_eos", "greedy_eos_not_emitted"}): "both rewrite the lines that end the "
        "loop at EOS",
    frozenset({"loss_counts_padding", "loss_mean_over_batch"}): "both rewrite the one line that divides the "
        "loss",
    frozenset({"beam_no_stop_at_eos", "beam_eos_not_emitted"}): "both rewrite the lines that finish a "
        "hypothesis at EOS",
    frozenset({"beam_no_stop_at_eos", "beam_finished_extended"}): "both rewrite the branch that keeps an "
        "ended hypothesis out of the beam",
    frozenset({"bpe_decode_per_token", "bpe_decode_strict"}): "both rewrite the line that decodes the bytes",
    frozenset({"beam_length_penalty_per_step", "beam_scores_not_accumulated"}): "both rewrite the line that "
        "scores a candidate",
}
MASKING: dict[frozenset[str], str] = {
    frozenset({"kv_cache_not_advanced", "rope_no_offset"}): "a cache that never moves on starts every call "
        "at position 0, which is what a missing offset does: only the cache is named",
    frozenset({"ffn_no_down_projection", "residual_from_normed"}): "without the down projection the block "
        "cannot run (its FFN returns d_ff features), so nothing else in it can be seen",
    frozenset({"ffn_no_down_projection", "shared_norm"}): "the same: the block cannot run",
    frozenset({"ffn_no_down_projection", "dropout_on_residual"}): "the same: the block cannot run",
    frozenset({"norm_no_gain", "shared_norm"}): "without their gains the two norms compute the same, so "
        "which one is used cannot be seen",
    frozenset({"causal_mask_not_cropped", "mask_hides_queries"}): "the forward cannot run on fewer tokens "
        "than the block size, so the padding mask is never applied",
    frozenset({"causal_mask_not_cropped", "no_scaling"}): "the same: the forward cannot run, so its scores "
        "are never seen",
    **{frozenset({"causal_mask_not_cropped", other}): "the same: the forward cannot run, so nothing else "
       "in it is seen" for other in ("kv_swapped", "softmax_wrong_dim", "concat_no_transpose",
                                     "no_output_projection", "no_residual", "causal_off_by_one")},
    frozenset({"mask_repeat_order", "decoder_masks_swapped"}): "d2l's valid_lens.repeat(num_heads) raises on "
        "the decoder's (B, T) valid lengths, so the decoder never runs",
    frozenset({"mask_repeat_order", "causal_off_by_one"}): "the same: the decoder never runs",
    frozenset({"loss_log_zero", "smoothing_on_pad"}): "the NaN of log(0) is the whole loss, so nothing "
        "else in it can be seen",
    frozenset({"bpe_overlapping_specials", "bpe_special_token_split"}): "with the special tokens ignored, "
        "which one wins cannot be seen",
    frozenset({"temperature_after_softmax", "sampling_from_logits"}): "after the softmax the logits are "
        "probabilities: sampling from them is right",
    frozenset({"sampling_softmax_wrong_dim", "sampling_from_logits"}): "sampling from the logits uses no "
        "softmax at all",
    frozenset({"generate_not_appended", "generate_no_crop"}): "the context never grows, so it never needs "
        "cropping",
    frozenset({"generate_no_crop", "generate_does_not_stop"}): "the model refuses the overlong context "
        "before the loop runs past max_new_tokens",
    frozenset({"sampling_from_logits", "generate_not_appended"}): "the loop's sampling step raises at the "
        "first token, so the loop never runs",
    frozenset({"sampling_from_logits", "generate_no_crop"}): "the same: the loop never runs",
    frozenset({"sampling_from_logits", "generate_does_not_stop"}): "the same: the loop never runs",
    frozenset({"beam_no_stop_at_eos", "beam_shortest_returned"}): "no hypothesis ever finishes, so there is "
        "no first finished one to return",
    frozenset({"beam_finished_extended", "beam_shortest_returned"}): "the first hypothesis to finish is the "
        "same whether or not finished ones are extended",
    frozenset({"beam_shortest_returned", "beam_length_penalty_per_step"}): "returning the first finished "
        "hypothesis, the search never compares scores, so how they are divided cannot be seen",
    frozenset({"beam_scores_not_accumulated", "beam_shortest_returned"}): "with the scores not summed, "
        "returning the first finished hypothesis answers as Hugging Face's layout does with the scores not "
        "summed (its copies of the start all live): only the scores are named",
    frozenset({"beam_finished_extended", "beam_length_penalty_per_step"}): "with the penalty compounded "
        "the extended hypotheses give the same answers as a search where EOS never ends one",
    **{frozenset({"beam_batched_differs", other}): "with this mistake both sentences of the batch get the "
       "same answer whichever source the search sees, so a search of the wrong sentence cannot be seen"
       for other in ("beam_shortest_returned", "beam_length_penalty_per_step", "beam_one_not_greedy")},
    frozenset({"causal_mask_missing", "causal_off_by_one"}): "without the mask its diagonal cannot be seen",
    **{frozenset({"beam_one_not_greedy", other}): "scoring the first position instead of the last, the "
       "search follows none of the scenarios' paths, so nothing else in it can be seen"
       for other in ("beam_no_stop_at_eos", "beam_eos_not_emitted", "beam_finished_extended",
                     "beam_shortest_returned", "beam_length_penalty_per_step",
                     "beam_scores_not_accumulated")},
}
