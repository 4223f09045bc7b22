"""Pure implementations of the scoring and training methods.

Serving, training and evaluation import these modules directly, e.g.
``from clipcore.methods.zero_shot import zero_shot_probs``. Nothing is imported here, so that
loading a numpy-only module (``common``, ``zero_shot``, ``comparative``, ``pairwise_rank``) never
pulls in torch; only ``losses`` depends on torch.
"""
