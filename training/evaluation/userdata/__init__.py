"""Evaluation of a model version on a user's own labelled images and captions (docs/data.md):
zero-shot with and without comparatives, pair ranking, DCSM, negation by text encoder and YUKINO,
one module per family; ``run.evaluate_user_data`` runs what the version and the data allow and
``figures`` names each figure for the printed table and report.html."""
