"""Where a layer that FAILs parts from the reference: the learner's encoder layer, decoder layer or
block built once more as its runner built it, run traced on its own forward and its parts, and
compared with every reading of its weights (FFN mapping, activation, placement, rotary layout)
(localize_kinds.localize_layer). Kept apart from localize_kinds so that the layers' and the
pieces' graders import the localization one way."""

import itertools
from typing import Any

from handformer.check.core.fingerprint import dropout_off
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import localize_layer, note_departure
from handformer.check.core.result import ComponentResult
from handformer.check.core.weights import is_gated
from handformer.check.reference import variants as V
from handformer.check.runners.layers import Layer
from handformer.check.runners.pieces import FFN_ACTIVATIONS


def layer_readings(layer: Any, expected: str) -> list[V.LayerWeights]:
    """Every reading of the layer's weights the search tries: FFN mapping, activation, placement,
    rotary layout."""
    gated = is_gated(layer.ffn_candidates[0])
    placements = (expected, "pre" if expected == "post" else "post")
    return [layer.weights(slots, act, placement, rope) for slots, act, placement, rope in itertools.product(
        layer.ffn_candidates, FFN_ACTIVATIONS[gated], placements, layer.ropes)]


LAYER_KINDS = {"encoder_layer": (False, False, "post"), "decoder_layer": (True, False, "post"),
               "block": (False, True, "pre")}  # kind -> (decoder, causal block, the expected placement)


def note_layer_departure(comp: Any, ctx: Any, res: ComponentResult) -> None:
    """A layer that FAILs with no mistake named: where it parts from the reference (its runner's
    search found no reading; the layer is built once more, as the runner built it)."""
    if comp.kind not in LAYER_KINDS or res.status != "fail" or res.findings:
        return
    decoder, causal_block, expected = LAYER_KINDS[comp.kind]

    def localize() -> Departure | None:
        layer = Layer(comp, ctx, decoder, causal_block)
        return localize_layer(layer, layer_readings(layer, expected))

    with dropout_off():
        note_departure(res, localize)
