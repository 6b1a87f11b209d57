"""Post-training pieces in a style of their own (tests/fixtures/learners_posttrain): a sequence
log-probability that takes a loss mask beside the labels and averages over it, a Lion optimizer as a
plain class with a helper update, and a small classifier MLP that is no FFN sublayer. The correct file
passes whole; each planted copy FAILs quoting its line."""

import pytest
from check_results import FIXTURES, checked, component, planted_copy, statuses

from handformer.check.core.report import exit_code

SOURCE = FIXTURES / "learners_posttrain" / "correct.py"
INTERPOLATION = "update = exp_avg.clone().lerp_(grad, 1.0 - beta1).sign_()"
SUMMED = "return (token_logps * mask).sum(-1) / mask.sum(-1)"


@pytest.fixture(scope="module")
def correct():
    return checked("learners_posttrain")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("posttrain")
    lion = (INTERPOLATION, INTERPOLATION.replace("beta1", "beta2"))  # the momentum's rate in the sign
    mask = (SUMMED, "return token_logps.sum(-1) / mask.sum(-1)")  # the prompt counted too
    return {"lion": planted_copy(SOURCE, folder, "lion_beta2", lion),
            "mask": planted_copy(SOURCE, folder, "mask_ignored", mask)}


def test_the_correct_file_passes_whole_and_the_classifier_mlp_is_no_ffn(correct):
    assert statuses(correct) == {"get_logps": "pass", "LionOptimizer": "pass"}
    assert exit_code(correct) == 0


@pytest.mark.parametrize(("plant", "name", "quoted"), [
    ("lion", "LionOptimizer", INTERPOLATION.replace("beta1", "beta2")),
    ("mask", "get_logps", "return token_logps.sum(-1) / mask.sum(-1)")])
def test_each_plant_fails_quoting_its_line(planted, plant, name, quoted):
    comp = component(planted[plant], name)
    assert comp.status == "fail"
    assert [f.code.strip() for f in comp.findings] == [quoted]


def test_lion_under_other_names_passes_and_another_sign_rule_is_not_checked():
    result = checked("learners_posttrain", "sign_optimizers")
    assert statuses(result) == {"Lion": "pass", "SophiaLike": "not_checked"}
