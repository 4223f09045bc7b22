"""Evaluation methods, one module per method (as ``training.methods``): each holds the figures of
its method once, computed from embeddings and scores that a data source hands it. The shapes world
(``training.evaluation.world``) and a user's dataset (``training.evaluation.userdata``) only build
those inputs from their own records; a method module imports neither, nor another method module.
"""
