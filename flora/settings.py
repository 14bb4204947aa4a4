"""One typed settings object for the whole engine.

Every backend choice (tracking store, VLM backend, orchestration mode) is read from
``FLORA_*`` environment variables here; code never forks on anything else.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class FloraSettings(BaseSettings):
    """Runtime configuration. Defaults are the embedded (one machine, no services) mode."""

    model_config = SettingsConfigDict(env_prefix="FLORA_", env_file=".env", extra="ignore")

    home: Path = Field(default=Path(".flora"), description="Embedded state root.")
    dataset: Path = Field(
        default=Path("datasets/toy_world"), description="Dataset the DAGs process."
    )
    mlflow_tracking_uri: str | None = Field(
        default=None, description="Defaults to sqlite:///<home>/mlflow.db."
    )
    mlflow_experiment: str = "flora-data-engine"
    # Which VLM backend serves segmenter/captioner/rewarder requests.
    backend: Literal["kinematic", "transformers", "openai"] = "kinematic"
    model_path: str | None = Field(default=None, description="Path or hub id of a VLM.")
    adapter_path: str | None = Field(default=None, description="Optional PEFT adapter.")
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_model: str = "flora"
    # One OpenAI-compatible endpoint per Flora model (its inference pod or `flora serve`);
    # each falls back to FLORA_OPENAI_BASE_URL. See :meth:`for_model`.
    segmenter_base_url: str | None = None
    captioner_base_url: str | None = None
    rewarder_base_url: str | None = None
    # The segmenter's backend when it differs from FLORA_BACKEND (e.g. kinematic while the
    # captioner and rewarder are served).
    segmenter_backend: Literal["kinematic", "transformers", "openai"] | None = None
    request_timeout_s: float = 120.0
    max_retries: int = 3
    max_concurrency: int = 8
    # OpenAI client capabilities (docs/backends.md): "auto" probes the server once.
    openai_video: Literal["auto", "on", "off"] = "auto"  # frames as one timestamped video
    openai_guided: Literal["auto", "on", "off"] = "auto"  # structured outputs (regex/JSON)
    # In-process transformers backend: enforce each request's grammar regex while decoding
    # (as `flora serve` and vLLM structured outputs do). Off by default: the strict parser
    # alone judges free answers, which is what evaluation of a model's own grammar measures.
    guided: bool = False
    device: str = "auto"
    # `flora serve` limits (docs/backends.md): every request is bounded before it costs
    # memory or CPU; a client fault is a 4xx, never a 500.
    serve_token: str | None = Field(default=None, repr=False, description="Bearer token.")
    serve_token_file: Path | None = Field(default=None, description="File holding the token.")
    serve_max_body_bytes: int = Field(default=64 * 1024**2, ge=1024)  # 413 above
    serve_max_prompt_tokens: int = Field(default=32_768, ge=16)
    serve_max_images: int = Field(default=128, ge=0)  # per request
    serve_max_image_bytes: int = Field(default=8 * 1024**2, ge=1024)  # encoded, per image
    serve_max_image_pixels: int = Field(default=4096 * 4096, ge=64)  # decoded, per image
    serve_max_total_pixels: int = Field(default=32 * 1024**2, ge=64)  # decoded, per request
    serve_max_tokens: int = Field(default=4096, ge=1)  # max_tokens above: 400
    serve_request_timeout_s: float = Field(default=300.0, gt=0)  # queue + generation
    serve_max_pending: int = Field(default=16, ge=1)  # admitted requests; 503 above
    # Orchestration (docs/orchestration.md, "Production mode"): `embedded` runs every DAG
    # step in-process; `production` (set by infra/helm/airflow-values.yaml) runs the heavy
    # steps as KubernetesPodOperator pods on the CUDA image and requires every path handed
    # between tasks to lie on the shared volume. Names below match infra/.
    mode: Literal["embedded", "production"] = "embedded"
    cuda_image: str = "ghcr.io/flora-robotics/flora:cuda"  # FLORA_CUDA_IMAGE, as KFP reads
    pod_namespace: str | None = None  # None: the Airflow workers' own namespace
    shared_pvc: str = "flora-shared"  # ReadWriteMany claim holding FLORA_HOME and datasets
    shared_mount: Path = Path("/shared")
    pod_config_map: str = "flora-pipeline-env"  # envFrom of every step pod
    pod_secrets: list[str] = Field(default_factory=lambda: ["flora-object-store"])
    # Step pods and Airflow workers write the same files on the shared volume, so they run
    # as the same user and group (infra/helm/airflow-values.yaml: 50000, fsGroup 0).
    pod_run_as_user: int = Field(default=50000, ge=1)
    pod_fs_group: int = Field(default=0, ge=0)
    gpu_count: int = Field(default=1, ge=1)  # nvidia.com/gpu per GPU step (limit = request)
    gpu_cpu: str = "8"
    gpu_memory: str = "64Gi"
    gpu_node_selector: dict[str, str] = Field(
        default_factory=lambda: {"nvidia.com/gpu.present": "true"}
    )
    gpu_tolerations: list[dict[str, str | int]] = Field(  # Kubernetes spelling
        default_factory=lambda: [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    )

    @field_validator("home", "dataset", "serve_token_file", "shared_mount", mode="after")
    @classmethod
    def _expand_user(cls, v: Path | None) -> Path | None:
        """``~`` in a path setting means the home directory, as in a shell: without this,
        ``FLORA_HOME=~/flora`` (quoted, or from ``.env``) is a folder named ``~`` in the cwd."""
        if v is None:
            return None
        try:
            return v.expanduser()
        except RuntimeError as e:  # ~nosuchuser, or no home to expand: a bad value, named
            raise ValueError(f"cannot expand {str(v)!r}: {e}") from e

    def for_model(self, model: Literal["segmenter", "captioner", "rewarder"]) -> FloraSettings:
        """These settings as ``model``'s requests see them: its own endpoint when one is
        set (``FLORA_<MODEL>_BASE_URL``), else ``FLORA_OPENAI_BASE_URL``; for the segmenter,
        ``FLORA_SEGMENTER_BACKEND`` when set."""
        update: dict[str, str] = {}
        if url := getattr(self, f"{model}_base_url"):
            update["openai_base_url"] = url
        if model == "segmenter" and self.segmenter_backend:
            update["backend"] = self.segmenter_backend
        return self.model_copy(update=update) if update else self

    @property
    def outputs_dir(self) -> Path:
        """Where engine tables (Parquet) and reports land."""
        return self.home / "outputs"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def dvc_remote(self) -> Path:
        return self.home / "dvc-remote"

    @property
    def tracking_uri(self) -> str:
        """MLflow tracking URI: SQLite under ``home`` unless configured (Postgres in infra)."""
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def artifact_root(self) -> Path:
        return (self.home / "mlartifacts").resolve()


@lru_cache(maxsize=1)
def get_settings() -> FloraSettings:
    """The process-wide settings (cached; call ``get_settings.cache_clear()`` in tests)."""
    return FloraSettings()
