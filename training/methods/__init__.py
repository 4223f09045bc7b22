"""Training methods, one module each, over frozen features from any data source.

A method module holds the method's data (what a source must give it), its hyperparameters and one
``train(...)``; the shapes world (``training.train_<method>``) and a user's dataset
(``training.userdata.<method>``) only build that data from their own records and publish the result.
"""
