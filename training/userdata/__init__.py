"""Training every method on a user's own images and texts (docs/data.md).

One module per method, each with a run configuration and a ``run_<method>(ctx, cfg)`` that trains
from a store version and publishes a derived one: ``pcclip``, ``dcsm``, ``semclip``, ``yukino``,
``comparatives``; ``base`` trains from scratch. ``context.RunContext`` holds what they share
(validated data, base version, device, seed) and ``training.feature_cache`` the frozen image features.
"""
