"""Evaluation of a model version on a user's own labelled images and captions (docs/data.md):
zero-shot with and without comparatives, pair ranking, DCSM, negation by text encoder and YUKINO,
one module per method that builds its inputs from the records (``data``) and reads its figures
from ``training.evaluation.methods``; ``run.evaluate_user_data`` runs what the version and the data
allow and ``figures`` names each figure for the printed table and report.html."""
