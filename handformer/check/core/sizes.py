"""The sizes the learner's components are built with (small, so every check runs in milliseconds).

Shape legend: D d_model, H heads, F FFN width.
"""

from __future__ import annotations

D, H, F_WIDTH, DROPOUT, MAX_LEN = 16, 4, 40, 0.1, 64
SIZES = {"d_model": D, "n_heads": H, "d_ff": F_WIDTH, "dropout": DROPOUT, "max_len": MAX_LEN}



def is_number(value: object, kinds: type | tuple[type, ...] = (int, float)) -> bool:
    """A number that can stand for a size or a setting: of `kinds`, and not a bool (True is an int)."""
    return isinstance(value, kinds) and not isinstance(value, bool)


__all__ = ["D", "DROPOUT", "F_WIDTH", "H", "MAX_LEN", "SIZES", "is_number"]
