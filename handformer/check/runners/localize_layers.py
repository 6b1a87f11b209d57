"""Where a layer that FAILs parts from the reference: the learner's encoder layer, decoder layer or
block built once more as its runner built it, run traced on its own forward and its parts, and
compared with every reading of its weights (FFN mapping, activation, placement, rotary layout)
(localize_kinds.localize_layer). Kept apart from localize_kinds so that the layers' and the
pieces' graders import the localization one way."""

from typing import Any

from handformer.check.core.fingerprint import dropout_off
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import localize_layer, note_departure
from handformer.check.core.result import ComponentResult
from handformer.check.runners.layers import KINDS, Layer, causal_without_its_mask_, layer_settings


def note_layer_departure(comp: Any, ctx: Any, res: ComponentResult) -> None:
    """A layer that FAILs: where it parts from the reference, said when no mistake is named (its
    runner's search found no reading), else the line a named one is quoted at (the layer is built
    once more, as the runner built it)."""
    if comp.kind not in KINDS or res.status != "fail":
        return

    def localize() -> Departure | None:
        layer = Layer(comp, ctx, KINDS[comp.kind])
        causal_without_its_mask_(layer)  # driven as its runner drove it
        return localize_layer(layer, [layer.weights(*setting) for setting in layer_settings(layer)])

    with dropout_off():
        note_departure(res, localize)
