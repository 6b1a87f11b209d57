"""The runner of BERT's masked-language-model masking (Devlin et al. 2019, section 3.1; Hugging Face's
`DataCollatorForLanguageModeling.torch_mask_tokens`, RoBERTa's dynamic masking): a function of a
batch of token ids that picks about 15% of the positions, never a special token, sets the labels to
the original token there and to -100 elsewhere, and replaces the picked tokens with [MASK] 80% of the
time, a random token 10% and leaves them 10%.

The function is called on 64 rows of 256 tokens (vocabulary 100, each row opened by [CLS] and closed by
[SEP], a quarter of the rows padded) with the probability 0.15, its settings handed by name or as a
config or tokenizer stand-in that notes what the code reads. Judged by counts, far from chance: the
picked share (where the code takes its probability: one of its own is its choice), the labels, the
unpicked inputs untouched, the specials the code reads never picked, and the shares of [MASK], random
and kept tokens, 80/10/10 or every picked token [MASK].

Shape legend: B rows, T tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.collators import as_bound
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill
from handformer.check.core.result import Check, ComponentResult, text

B, T, V, P, IGNORE = 64, 256, 100, 0.15, -100
NONE_ZH = {"none": "无"}  # no special token read, said in Chinese
IDS = {"pad": 1, "cls": 0, "sep": 2, "mask": 3}
# each setting's names (lower case), by what it is
NAMES = {"mask": ("mask_token_id", "mask_id", "mask_idx", "mask_token", "mask_index"),
         "pad": ("pad_token_id", "pad_id", "pad_idx", "pad_token", "padding_idx"),
         "cls": ("cls_token_id", "cls_id", "bos_token_id", "bos_id", "cls_idx"),
         "sep": ("sep_token_id", "sep_id", "eos_token_id", "eos_id", "sep_idx"),
         "vocab": ("vocab_size", "n_vocab", "num_tokens", "vocab_len"),
         "p": ("mlm_probability", "mlm_prob", "mask_prob", "mask_probability", "probability", "masking_prob",
               "p_mask", "prob")}
VALUES = {name: {**IDS, "vocab": V, "p": P}[kind] for kind, names in NAMES.items() for name in names}
HOLDERS = ("config", "cfg", "tokenizer", "tok", "args", "conf", "settings", "vocab")
# a collator's switches: Hugging Face's DataCollatorForLanguageModeling(tokenizer, mlm=True, ...)
VALUES |= {"mlm": True}
# (what the picked tokens become, the shares of [MASK], random and kept tokens, how it is said)
SPLITS = (((0.8, 0.1, 0.1), ("80% [MASK], 10% random, 10% kept (BERT's)",
                             "80% [MASK]、10% 随机、10% 不变（BERT 的）")),
          ((1.0, 0.0, 0.0), ("every picked token [MASK]", "被选中的 token 全部换成 [MASK]")))
TAKES = ("a masking function takes the token ids, its settings by name (mask_token_id, vocab_size, "
         "pad_token_id, mlm_probability) or in a config or tokenizer, and returns the inputs and the labels",
         "掩码函数接收 token id，设置按名字传（mask_token_id、vocab_size、pad_token_id、mlm_probability），"
         "或放在 config、tokenizer 里，返回输入和标签")


class Settings:
    """A config or tokenizer stand-in: every setting of VALUES, noting those the code reads."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name.lower() not in VALUES:
            raise DiscoveryError(f"the config check hands the masking function has no {name!r}; {TAKES[0]}",
                                 zh=f"check 传给掩码函数的 config 没有 {name!r}；{TAKES[1]}")
        self.read.add(name.lower())
        return VALUES[name.lower()]

    def __len__(self) -> int:  # len(tokenizer), the vocabulary Hugging Face's collator draws from
        return V

    def convert_tokens_to_ids(self, token: Any) -> Any:  # the stand-in's tokens are their ids
        return token


def batch() -> Tensor:
    """(B, T) token ids 4..V-1, [CLS] first and [SEP] last, the last quarter of the rows padded from T/2."""
    ids = torch.randint(4, V, (B, T), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = IDS["cls"], IDS["sep"]
    ids[3 * B // 4:, T // 2:] = IDS["pad"]
    return ids


def check_mlm_masking(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    ids, settings = batch(), Settings()
    fn = as_bound(comp, ctx, lambda name: _value(name, settings), TAKES)
    args = _arguments(fn, settings)
    torch.manual_seed(0)
    inputs, labels = _outputs(comp, ctx.learner.call("forward", fn, ids.clone(), **args))
    specials = _specials(args, settings)
    plain = ~torch.isin(ids, torch.tensor(sorted(specials.values()), dtype=torch.long))  # (B, T)
    handed = bool(({n.lower() for n in args} | settings.read) & set(NAMES["p"]))
    res.checks += _checks(ids, inputs, labels, plain, ", ".join(sorted(specials)) or "none")[not handed:]
    picked = (labels != IGNORE) & plain
    res.checks.append(_split_check(res, inputs[picked], ids[picked]))
    return finish(res)


def _checks(ids: Tensor, inputs: Tensor, labels: Tensor, plain: Tensor, specials: str) -> list[Check]:
    """The picked share (judged where the probability was handed to the code), the labels, the
    unpicked inputs and the specials, each with what was found."""
    picked = labels != IGNORE  # (B, T)
    share = picked[plain].float().mean().item()
    wrong_labels = int((labels[picked] != ids[picked]).sum())
    touched = int((inputs[~picked] != ids[~picked]).sum())
    special = int(picked[~plain].sum())
    return [_check(f"about {P:.0%} of the non-special positions picked", f"约 {P:.0%} 的非特殊位置被选中",
                   abs(share - P) < 0.03, f"{share:.1%}"),
            _check("the labels are the original tokens where picked", "被选中的位置，标签是原来的 token",
                   wrong_labels == 0, f"{wrong_labels} differ", f"{wrong_labels} 个不同"),
            _check("the inputs are untouched where not picked", "没被选中的位置，输入不变",
                   touched == 0, f"{touched} changed", f"{touched} 个变了"),
            _check(f"no special token the code reads ({specials}) is picked",
                   f"代码读到的特殊 token（{NONE_ZH.get(specials, specials)}）没有被选中", special == 0,
                   f"{special} picked",
                   f"{special} 个被选中")]


def _arguments(fn: Any, settings: Settings) -> dict[str, Any]:
    """The function's settings by name: a setting of VALUES, a config or tokenizer (the stand-in), the
    special-tokens mask of the batch; a required one that is none of them cannot be filled."""
    params = call_parameters(fn)[1:]
    args = {p.name: _value(p.name, settings) for p in params}
    args = {n: v for n, v in args.items() if v is not None}
    unknown = [p.name for p in params if p.default is p.empty and p.name not in args]
    cannot_fill(fn.__name__, unknown, (), [fn.__name__], "", TAKES)
    return args


def _value(name: str, settings: Settings) -> Any:
    """What a setting named `name` is handed: its value, the stand-in, the batch's special-tokens
    mask; None where none is known."""
    if name == "special_tokens_mask":
        return torch.isin(batch(), torch.tensor([IDS["pad"], IDS["cls"], IDS["sep"]]))
    return VALUES.get(name.lower(), settings if name.lower() in HOLDERS else None)


def _specials(args: dict[str, Any], settings: Settings) -> dict[str, int]:
    """The special tokens the code reads (by an argument, from the stand-in, or all of them in the
    special-tokens mask handed to it), by what they are."""
    read = {n.lower() for n in args} | settings.read
    return {kind: IDS[kind] for kind in ("pad", "cls", "sep")
            if read & set(NAMES[kind]) or "special_tokens_mask" in read}


def _outputs(comp: Component, out: Any) -> tuple[Tensor, Tensor]:
    """(inputs, labels) from what the function returns: a dict, or the (B, T) tensors of a tuple, the
    labels the one holding -100."""
    if isinstance(out, dict):
        out = (out.get("input_ids", out.get("inputs")), out.get("labels"))
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else ()) if isinstance(t, Tensor)
               and t.shape == (B, T)]
    labels = [t for t in tensors if bool((t == IGNORE).any())][:1]
    inputs = [t for t in tensors if not any(t is x for x in labels)][:1]
    if not (labels and inputs):
        raise DiscoveryError(
            f"{comp.name}: found no inputs and labels with {IGNORE} where no loss is taken in what it "
            f"returns; {TAKES[0]}",
            zh=f"{comp.name}：返回值里找不到输入和用 {IGNORE} 标出不算损失位置的标签；{TAKES[1]}")
    return inputs[0], labels[0]


def _check(en: str, zh: str, ok: bool, seen: str, seen_zh: str = "") -> Check:
    return Check(text(en, zh), ok, text(f"found {seen}", f"实际 {seen_zh or seen}"))


def _mask_id(new: Tensor, old: Tensor) -> int:
    """The id the code writes for [MASK]: the commonest among the picked tokens it changed (the one it
    was handed, or a constant of its own vocabulary: BERT's 103), far above any random token's share."""
    changed = new[new != old]
    return int(changed.mode().values) if len(changed) else IDS["mask"]


def _split_check(res: ComponentResult, new: Tensor, old: Tensor) -> Check:
    """The picked tokens' shares of [MASK], random and kept tokens against 80/10/10 or all [MASK]."""
    masked = (new == _mask_id(new, old)).float().mean().item() if len(new) else 0.0
    kept = (new == old).float().mean().item() if len(new) else 0.0
    shares = (masked, 1 - masked - kept, kept)
    fits = [said for split, said in SPLITS if all(abs(a - b) < 0.05 for a, b in zip(shares, split))]
    res.convention = text(*fits[0]) if fits else None
    random = max(shares[1], 0.0)
    return _check("the picked tokens are 80% [MASK], 10% random, 10% kept (or every one [MASK])",
                  "被选中的 token：80% 换成 [MASK]，10% 换成随机 token，10% 不变（或者全部换成 [MASK]）",
                  bool(fits), f"{masked:.0%} [MASK], {random:.0%} random, {kept:.0%} kept",
                  f"{masked:.0%} [MASK]、{random:.0%} 随机、{kept:.0%} 不变")

