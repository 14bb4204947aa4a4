"""MLflow model registry: registration (``register.py``) with lineage tags and aliases."""
