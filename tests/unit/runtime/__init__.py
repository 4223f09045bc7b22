"""Tests of service.runtime (batcher, cache, metrics)."""
