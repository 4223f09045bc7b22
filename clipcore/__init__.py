"""The core of the CLIP scoring product: method math, models and bundles, backends, heatmaps.

Imported by the HTTP service (``service``), the offline training job (``training``) and the load
tests alike; it imports neither of them.
"""
