"""Training losses, LoRA and logits processors as kinds of their own, each in two styles of fixture:
a LoRA layer (Raschka's update-only LoRALayer and LinearWithLoRA, a peft-like LoraLinear that is an
nn.Linear with merge/unmerge, tests/fixtures/learners_lora); distillation (RepDistiller's DistillKL
class, mdistiller's kd_loss with hard labels, a masked token-level reverse KL,
tests/fixtures/learners_distill); a language model's loss parts (a torchtune-like chunked
cross-entropy, ST-MoE's router z-loss with its own coefficient, the causal shift, a perplexity,
tests/fixtures/learners_lm_losses); OpenAI's frequency and presence penalties, no-repeat-ngram and
min-length as functions (tests/fixtures/learners_penalties). Each correct file passes whole; each
planted copy FAILs, quoting its line where a line holds the mistake."""

import pytest
from check_results import FIXTURES, checked, component, planted_copy, statuses

from handformer.check.core.report import exit_code

# (fixture, component, the line as written, the line planted, quoted: the planted line is quoted,
# or the catalogue name expected first)
PLANTS = {
    "lora_unmerge_unscaled": ("learners_lora", "LoraLinear", "self.weight -= self.delta_weight()",
                              "self.weight -= self.lora_B @ self.lora_A", True),
    "lora_scaling_inverted": ("learners_lora", "LoraLinear", "self.scaling = lora_alpha / r",
                              "self.scaling = r / lora_alpha", True),
    "lora_update_unscaled": ("learners_lora", "LoRALayer", "x = self.alpha * (x @ self.A @ self.B)",
                             "x = x @ self.A @ self.B", False),
    "kd_no_t_squared": ("learners_distill", "DistillKL",
                        'loss = F.kl_div(p_s, p_t, reduction="sum") * (self.T ** 2) / y_s.shape[0]',
                        'loss = F.kl_div(p_s, p_t, reduction="sum") / y_s.shape[0]', True),
    "kd_teacher_over_batch": ("learners_distill", "kd_loss",
                              "pred_teacher = F.softmax(logits_teacher / temperature, dim=1)",
                              "pred_teacher = F.softmax(logits_teacher / temperature, dim=0)", "softmax_wrong_dim"),
    "kl_mask_ignored": ("learners_distill", "reverse_kl_loss", "return (per_token * mask).sum() / mask.sum()",
                        "return per_token.mean()", True),
    "chunked_counts_ignored": ("learners_lm_losses", "chunked_ce_loss",
                               "n_valid = (labels != ignore_index).sum()", "n_valid = labels.numel()",
                               "loss_counts_padding"),
    "z_not_squared": ("learners_lm_losses", "router_z_loss", "return 1e-3 * (log_z ** 2).mean()",
                      "return 1e-3 * log_z.mean()", True),
    "shift_same_side": ("learners_lm_losses", "shift_logits_and_labels", "return logits[:, :-1, :], labels[:, 1:]",
                        "return logits[:, :-1, :], labels[:, :-1]", True),
    "pad_id_zero": ("learners_lm_losses", "masked_cross_entropy", "keep = targets != pad_id",
                    "keep = targets.ne(0)", "mask_pad_id"),
    "presence_counted": ("learners_penalties", "apply_penalties",
                         "logits = logits - presence_penalty * (counts > 0).float()",
                         "logits = logits - presence_penalty * counts", True),
    "ngram_whole_tail": ("learners_penalties", "no_repeat_ngram",
                         "prefix = row[len(row) - (ngram_size - 1):] if ngram_size > 1 else []",
                         "prefix = row[len(row) - ngram_size:] if ngram_size > 1 else []", False),
    "min_length_one_long": ("learners_penalties", "enforce_min_length", "if cur_len < min_length:",
                            "if cur_len <= min_length:", True),
}
KINDS = {"learners_lora": {"LoRALayer": "pass", "LinearWithLoRA": "pass", "LoraLinear": "pass"},
         "learners_distill": {"DistillKL": "pass", "kd_loss": "pass", "reverse_kl_loss": "pass"},
         "learners_lm_losses": {"chunked_ce_loss": "pass", "router_z_loss": "pass", "masked_cross_entropy": "pass",
                                "shift_logits_and_labels": "pass", "compute_perplexity": "pass"},
         "learners_penalties": {"apply_penalties": "pass", "no_repeat_ngram": "pass", "enforce_min_length": "pass"}}


@pytest.fixture(scope="module", params=sorted(KINDS))
def correct(request):
    return request.param, checked(request.param)


@pytest.fixture(scope="module", params=sorted(PLANTS))
def planted(request, tmp_path_factory):
    folder, name, written, plant, quoted = PLANTS[request.param]
    copy = planted_copy(FIXTURES / folder / "correct.py", tmp_path_factory.mktemp(request.param), request.param,
                        (written, plant))
    return component(copy, name), plant.strip(), quoted


def test_each_correct_file_passes_whole(correct):
    folder, result = correct
    assert statuses(result) == KINDS[folder]
    assert exit_code(result) == 0


def test_each_plant_fails_quoting_its_line(planted):
    comp, plant, quoted = planted
    assert comp.status == "fail"
    if quoted is True:
        assert plant in [f.code for f in comp.findings]
    elif quoted:
        assert (comp.findings[0].name, comp.findings[0].code) == (quoted, plant)
