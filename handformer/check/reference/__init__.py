"""The reference computations `handformer check` grades against, with every catalogued mistake as a
flag, the named mistakes' fixes, and the hand-written BPE with its corpora."""
