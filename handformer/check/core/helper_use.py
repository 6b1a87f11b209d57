"""A mask helper's convention, read from what its own file does with the mask it returns.

A helper that returns True at the padded positions (WeNet's `make_pad_mask`, torch.nn's
key_padding_mask) and one that returns True at the tokens (the tutorials') are both right: which one a
file means is said by its use. The result filled where it holds (`masked_fill(helper(...), -inf)`,
`key_padding_mask=helper(...)`) is True = masked; filled where it does not (`masked_fill(~helper(...),
...)`, `helper(...) == 0`) is True = keep. A result first held in a name is read by that name's use,
turned over where the file inverts it as it holds it (`masks = ~make_pad_mask(lengths)`, then read as
a keep mask: the helper's own True is the padding); a name the file never reads either way takes the
way the file reads its masks (`mask.eq(0)` before a fill: keep). None where nothing says.
"""

from __future__ import annotations

import re

from handformer.check.core.conventions import RESHAPED, file_masks_where_true, masks_where_true

# a convention read of the name that holds the result, as the helper's own: turned where it was inverted (~)
TURNED = {("keep", "~"): "masked", ("masked", "~"): "keep"}
# a call of the helper, then a view or cast of its result; {n}: the helper's name, escaped
CALL = r"\b{n}\((?:[^()]|\([^()]*\))*\)(?:{r})*"
# the uses that say the result's convention at the call, the first that speaks
AT_CALL = ((r"masked_fill_?\(\s*~\s*{c}|logical_not\(\s*{c}|{c}\s*(?:==\s*0|\.eq\(\s*0\s*\))", "keep"),
           (r"masked_fill_?\(\s*{c}\s*,|key_padding_mask\s*=\s*{c}|torch\.where\(\s*{c}\s*,", "masked"))


def helper_use(source: str, name: str) -> str | None:
    """The convention ('keep' or 'masked') the file's use of helper `name`'s result says; None where
    nothing says."""
    call = CALL.format(n=re.escape(name), r=RESHAPED)
    said = next((p for pattern, p in AT_CALL if re.search(pattern.format(c=call), source)), None)
    held = re.search(rf"^[ \t]*(\w+)\s*=\s*(~?)\s*{call}", source, re.M)
    if said or not held:
        return said
    read = name_use(source, held[1]) or file_use(source)
    return TURNED.get((read, held[2]), read)


def name_use(source: str, m: str) -> str | None:
    """How the file reads the mask it holds in name `m`: filled where True ('masked'), compared with
    0 or inverted ('keep'), or None."""
    e = re.escape(m)
    keep = re.search(rf"\b{e}\b(?:{RESHAPED})*\s*(?:==\s*0|\.eq\(\s*0\s*\))|~\s*{e}\b|logical_not\(\s*{e}\b",
                     source)
    return "masked" if masks_where_true(source, m) else "keep" if keep else None


# a file's own reading of its masks as keeps: a mask compared with 0, or inverted as it is filled
KEEP_FILE = re.compile(rf"\w*mask\w*(?:{RESHAPED})*\s*(?:==\s*0|\.eq\(\s*0\s*\))|masked_fill_?\(\s*~")


def file_use(source: str) -> str | None:
    """How the file reads its masks in general: filled where True ('masked'), read as keeps, or None."""
    return "masked" if file_masks_where_true(source) else "keep" if KEEP_FILE.search(source) else None
