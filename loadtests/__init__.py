"""Load tests and benchmarks; run each as a module from the repository root: ``python -m loadtests.NAME``."""
