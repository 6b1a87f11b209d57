"""A constructor's argument that is a callable (Megatron's init_method, an activation, a norm-layer
factory): filled with what the learner's file itself gives an argument of that name as a default in
another signature (`ColumnParallelLinear(..., init_method=nn.init.xavier_normal_)`), else with a
neutral one of the kind its name says, noted in the report:

- an init function (`init_method`, `initializer`): a normal draw of std 0.02, in place;
- a norm-layer factory (`norm_layer`, `norm_cls`, `norm_fn`, `norm_factory`): nn.LayerNorm;
- an activation (`act`, `activation`, `act_fn`): the GELU, as a function.

Anything else is not a callable argument here (None): its runner says it cannot fill it.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any

import torch.nn.functional as F
from torch import nn

from handformer.check.core.defaults import quietly, then
from handformer.check.core.own_calls import Taken

INIT_STD = 0.02  # GPT-2's and Megatron's init_method_std
# the kinds of callable a name says: (its pattern, the neutral one, what the report calls it)
KINDS: tuple[tuple[re.Pattern[str], Any, str], ...] = (
    (re.compile(r"(^|_)init(ializer)?(_|$)"), functools.partial(nn.init.normal_, std=INIT_STD),
     "a normal init of std 0.02"),
    (re.compile(r"norm_?(layer|cls|class|fn|type|factory)$"), nn.LayerNorm, "nn.LayerNorm"),
    (re.compile(r"(^|_)act(ivation)?(_fn)?$"), F.gelu, "the GELU"))


def neutral_callable(cls: Any, name: str) -> dict[str, Taken]:
    """{name: the callable} for the argument `name` of `cls`: the file's own default of that name, else
    the neutral one of its kind (see the module's docstring); empty where its name says no callable."""
    kind = next((k for k in KINDS if k[0].search(name.lower())), None)
    if kind is None:
        return {}
    said = (f"{name}: {kind[2]}, a neutral one (the file gives it none)",
            f"{name}：{kind[2]}，中性的取值（文件里没有给它的）")
    return {name: _own_default(cls, name) or Taken(name, kind[1], 0, said=said)}


def _own_default(cls: Any, name: str) -> Taken | None:
    """The callable default of an argument `name` in another signature of the file that defines `cls`."""
    read = (TypeError, ValueError, KeyError)  # no signature, or no argument of that name
    defaults = [quietly(lambda o=o: inspect.signature(o).parameters[name].default, read)
                for o in vars(sys.modules.get(cls.__module__, nn)).values()]
    found = next(filter(_a_callable, defaults), None)
    return then(found, lambda f: Taken(name, f, 0, said=(
        f"{name} = {getattr(f, '__name__', f)}: the default your file gives it in another signature",
        f"{name} = {getattr(f, '__name__', f)}：文件在另一个签名里给它的默认值")))


def _a_callable(value: Any) -> bool:
    return callable(value) and value is not inspect.Parameter.empty
