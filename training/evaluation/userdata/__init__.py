"""Evaluation of a model version on a user's own labelled images and captions (docs/data.md):
zero-shot with and without comparatives, pair ranking, DCSM, SemCLIP and YUKINO, one module per
family; ``run.evaluate_user_data`` runs what the version and the data allow."""
