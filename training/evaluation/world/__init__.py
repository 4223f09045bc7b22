"""Evaluation of a model version on held-out shapes-world data (docs/design.md, section 4): how the
world samples the scenes, pairs and captions of each method's figures; ``run.evaluate`` runs them
all."""
