"""Inference preparation: what makes a trained model decode faster, applied after it is built.

Fused projections (fuse.py), weights packed for oneDNN (packed_linear.py), int8 / int4 weights
(quant.py, quant_int4.py), the thread count for small models (threads.py) and the order the CLI
applies them in (prepare.py). A room of its own, beside the lesson (handformer/nn,
handformer/models): it reaches a model only by replacing its modules after the model is built, and
the plain modules of the lesson stay the reference each replacement is tested against."""
