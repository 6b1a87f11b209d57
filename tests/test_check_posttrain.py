"""Post-training pieces in a style of their own (tests/fixtures/learners_posttrain): a sequence
log-probability that takes a loss mask beside the labels and averages over it, a Lion optimizer as a
plain class with a helper update, and a small classifier MLP that is no FFN sublayer. The correct file
passes whole; each planted copy FAILs quoting its line."""

import pytest
import torch
from check_results import FIXTURES, checked, component, planted_copy, statuses

from handformer.check.core.report import exit_code
from handformer.check.runners.lion import takes_lion

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


def test_lion_under_other_names_passes():
    assert statuses(checked("learners_posttrain", "sign_optimizers")) == {"Lion": "pass"}


class SophiaLike(torch.optim.Optimizer):
    """Betas, no eps, a sign in its update, and a setting of its own (rho): another rule than Lion's."""

    def __init__(self, params, lr=1e-4, betas=(0.965, 0.99), rho=0.04, weight_decay=0.1):
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay))

    def step(self):
        for p in self.param_groups[0]["params"]:
            p.add_(p.grad.sign(), alpha=-self.param_groups[0]["lr"])


def test_a_sign_rule_with_a_setting_of_its_own_is_not_taken_for_lion():
    assert takes_lion(SophiaLike) is False
