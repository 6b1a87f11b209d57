"""`handformer check`: grade a learner's hand-written Transformer against handformer's components.

discovery (find and build their components), weights (map their parameters to W_Q, W_K, ...),
variants + fingerprint (the reference with every named mistake, and the search that matches them),
attention / pieces / layers (the runners), diagnoses (the catalogue), report (English, Chinese,
JSON), sandbox (their code runs in a child process with a time and a memory limit).
"""
