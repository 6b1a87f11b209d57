"""Adapters: trainable layers put in place of a built model's own (LoRA), and folded back.

A room of its own, beside the lesson (handformer/nn, handformer/models): it reaches a model only
by replacing its modules after the model is built (handformer/replace.py)."""
