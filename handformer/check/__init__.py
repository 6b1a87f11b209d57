"""`handformer check`: grade a learner's hand-written Transformer against handformer's components.

Four rooms, imported one way: reference/ (the reference computations with every named mistake as a
flag, the hand-written BPE), catalog/ (the named mistakes and their fixes), core/ (finding and
building components, mapping weights, the sandbox, the search that names a mistake, localizing what
has no name, the report; core/engine.py runs it all) and runners/ (one runner a kind of component).
"""
