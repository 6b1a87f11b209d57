"""Where an attention without an output projection has it: Hugging Face BERT's layout splits the
attention in two, `BertSelfAttention` (W_Q, W_K, W_V, the heads) and `BertSelfOutput` (W_O, dropout,
the residual and the norm), composed by `BertAttention`, whose forward hands the first one's output
to the second. Read from the file's source: which class holds the attention and hands its output,
as is (directly, through one variable, or its first item `outputs[0]`), to a class of the file that
builds an nn.Linear.
"""

from __future__ import annotations

import re

NEVER = "(?!)"  # an alternative that never matches: an empty list of names matches nothing


def projection_elsewhere(source: str, name: str) -> tuple[str, str] | None:
    """(the class that holds `name`, the class of the file it hands name's output to, which builds an
    nn.Linear: the output projection), or None."""
    classes = dict(re.findall(r"^class (\w+)(.*?)(?=^\S|\Z)", source, re.M | re.S))  # name -> body
    for parent, body in classes.items():
        attrs = dict(re.findall(r"self\.(\w+)\s*=\s*(\w+)\(", body))  # self.output = SelfOutput(config)
        held = "|".join([a for a, cls in attrs.items() if cls == name] + [NEVER])
        outputs = "|".join(re.findall(rf"(\w+)\s*=\s*self\.(?:{held})\(", body) + [NEVER])
        given = re.findall(rf"self\.(\w+)\(\s*(?:self\.(?:{held})\(|(?:{outputs})\b)", body)
        sibling = next((attrs[g] for g in given if "Linear(" in classes.get(attrs.get(g, ""), "")), name)
        if sibling != name:
            return parent, sibling
    return None
