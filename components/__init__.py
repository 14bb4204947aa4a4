"""Kubeflow Pipelines v2 components and pipelines: thin adapters over ``flora`` functions."""
