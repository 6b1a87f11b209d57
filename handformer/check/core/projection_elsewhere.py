"""Where an attention without an output projection has it: Hugging Face BERT's layout splits the
attention in two, `BertSelfAttention` (W_Q, W_K, W_V, the heads) and `BertSelfOutput` (W_O, dropout,
the residual and the norm), composed by `BertAttention`, whose forward hands the first one's output
to the second. Read from the file's source: which class holds the attention and hands its output,
as is (directly, through one variable, or its first item `outputs[0]`), to a class of the file that
builds an nn.Linear, or to an nn.Linear the holder builds itself (CS224n's minBERT: the layer's
`add_norm(x, attn_out, self.attention_dense, ...)` applies W_O).
"""

from __future__ import annotations

import re

NEVER = "(?!)"  # an alternative that never matches: an empty list of names matches nothing
LINEAR = re.compile(r"self\.(\w+)\s*=\s*(?:torch\.)?(?:nn\.)?Linear\(")


def projection_elsewhere(source: str, name: str) -> tuple[str, str] | None:
    """(the class that holds `name`, the class of the file it hands name's output to, which builds an
    nn.Linear: the output projection, or the holder's own nn.Linear attribute), or None."""
    classes = dict(re.findall(r"^class (\w+)(.*?)(?=^\S|\Z)", source, re.M | re.S))  # name -> body
    for parent, body in classes.items():
        attrs = dict(re.findall(r"self\.(\w+)\s*=\s*(\w+)\(", body))  # self.output = SelfOutput(config)
        held = "|".join([a for a, cls in attrs.items() if cls == name] + [NEVER])
        outputs = "|".join(re.findall(rf"(\w+)\s*=\s*self\.(?:{held})\(", body) + [NEVER])
        given = re.findall(rf"self\.(\w+)\(\s*(?:self\.(?:{held})\(|(?:{outputs})\b)", body)
        sibling = next((attrs[g] for g in given if "Linear(" in classes.get(attrs.get(g, ""), "")), name)
        if sibling != name:
            return parent, sibling
        own = _own_linear(body, held, outputs)
        if own:
            return parent, f"self.{own}"
    return None


def _own_linear(body: str, held: str, outputs: str) -> str | None:
    """The holder's own nn.Linear attribute named on a line of its code with the attention's call or
    output (`self.o(out)`, `self.add_norm(x, self.attn(x), self.o, ...)`), or None."""
    linears = "|".join(LINEAR.findall(body) + [NEVER])
    given = re.compile(rf"self\.(?:{held})\(|\b(?:{outputs})\b(?!\s*=[^=])")  # not where it is assigned
    lines = filter(given.search, body.splitlines())
    return next((m.group(1) for line in lines if (m := re.search(rf"self\.({linears})\b", line))), None)
