"""The kind a function found by its name is checked as, by what it takes and does (discovery.refine's
rules for functions): each rule on a function written for it, and a function no rule holds for keeps
the kind its name gave. No check is run: the rules are read alone."""

from __future__ import annotations

import torch

from handformer.check.core.discovery import refine


def perplexity(model, loader):  # an evaluation loop, not a function of logits
    return 0.0


def lm_shift(logits, labels):
    return logits[:, :-1], labels[:, 1:]


def train_step(params, grads, m, v, beta1=0.9, beta2=0.999, lr=1e-3):
    m = beta1 * m + (1 - beta1) * grads
    v = beta2 * v + (1 - beta2) * grads ** 2
    return params - lr * m / (v.sqrt() + 1e-8)


def dpo_train_step(policy, ref_model, optimizer, batch):
    return policy, ref_model, optimizer, batch


def lm_train_step(model, optimizer, x, y):
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    return loss


def compute_advantages(rewards, group_size):
    return rewards.view(-1, group_size)


def compute_gae(rewards, values, gamma, lam):
    return rewards - values


def make_masks(q_len):
    return torch.tril(torch.ones(q_len, q_len, dtype=torch.bool))


def make_pad_mask(ids, pad_id):
    return ids != pad_id


def greedy_decode(decoder, audio_features, sot_sequence, eot):
    return decoder, audio_features, sot_sequence, eot


CASES = [("perplexity", perplexity, ""), ("lm_shift", lm_shift, "lm_shift"),
         ("train_step", train_step, "adam_step"), ("lm_train_step", train_step, "adam_step"),
         ("train_step", dpo_train_step, "dpo_step"), ("train_step", lm_train_step, "lm_train_step"),
         ("gae", compute_advantages, "group_advantages"), ("gae", compute_gae, "gae"),
         ("mask_helper", make_masks, "causal_mask"), ("mask_helper", make_pad_mask, "mask_helper"),
         ("greedy_decode", greedy_decode, "memory_greedy"), ("generate", greedy_decode, "memory_greedy")]


def test_each_rule_for_a_function_gives_its_kind():
    got = [(kind, fn.__name__, refine(kind, fn)) for kind, fn, _ in CASES]
    assert got == [(kind, fn.__name__, want) for kind, fn, want in CASES]


def test_a_train_step_no_rule_holds_for_stays_a_train_step():
    def train_step(model, batch):
        return model(batch)

    assert refine("train_step", train_step) == "train_step"
