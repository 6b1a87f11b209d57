"""The sizes the learner's components are built with (small, so every check runs in milliseconds).

Shape legend: D d_model, H heads, F FFN width.
"""

from __future__ import annotations

D, H, F_WIDTH, DROPOUT, MAX_LEN = 16, 4, 40, 0.1, 64
SIZES = {"d_model": D, "n_heads": H, "d_ff": F_WIDTH, "dropout": DROPOUT, "max_len": MAX_LEN}
# the (B, H, T, S, Dh) an attention function is searched with: its head width not d_model / H, so a
# function that reads d_k from a module-level name is handed that name at the width of its inputs; B,
# H, T, Dh and B * H all distinct, so a size read from the wrong axis (query.size(1)) shows
SDPA_SIZES = (2, H, 5, 5, 6)
SRC_VOCAB, TGT_VOCAB = 23, 29  # an encoder-decoder model's vocabularies: two sizes, so a swap shows



def is_number(value: object, kinds: type | tuple[type, ...] = (int, float)) -> bool:
    """A number that can stand for a size or a setting: of `kinds`, and not a bool (True is an int)."""
    return isinstance(value, kinds) and not isinstance(value, bool)


__all__ = ["D", "DROPOUT", "F_WIDTH", "H", "MAX_LEN", "SDPA_SIZES", "SIZES", "SRC_VOCAB", "TGT_VOCAB",
           "is_number"]
