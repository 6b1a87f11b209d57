"""Helpers the runners share (one home for a repeated pattern): a mask handed with an input in the
input's dtype (fingerprint.mask_like, the attention's and the layers' runners), and how far apart two
tensors are (ppo.apart, PPO's and GRPO's runners)."""

from __future__ import annotations

import math

import torch

from handformer.check.core.fingerprint import mask_like
from handformer.check.runners.ppo import apart


def test_an_additive_mask_takes_the_inputs_dtype_and_any_other_is_kept():
    x = torch.zeros(2, 3, dtype=torch.float32)
    additive, keep = torch.zeros(3, 3, dtype=torch.float64), torch.ones(3, 3, dtype=torch.bool)
    assert mask_like(additive, x).dtype == torch.float32
    assert mask_like(keep, x) is keep and mask_like(None, x) is None


def test_two_tensors_apart_by_their_largest_difference_and_two_shapes_by_inf():
    assert apart(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0])) == 0.5
    assert apart(torch.zeros(2), torch.zeros(3)) == math.inf
