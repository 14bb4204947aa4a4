"""A step pod's command: ``python -m flora.orchestration.pod STEP --inputs JSON --xcom``.

Runs :func:`flora.orchestration.steps.run_step` — the same function the in-process
``@task`` calls — on the JSON inputs (the upstream tasks' XCom values, rendered into the
argument by Airflow), prints the result as one JSON line and, with ``--xcom``, writes it
where ``KubernetesPodOperator``'s XCom sidecar reads it (:data:`XCOM_PATH`; a path after
``--xcom`` overrides it for tests — the DAGs pass none, since a templated argument ending
in ``.json`` would be loaded as a template file), so the next task receives it exactly as
it would from the ``@task``. Exit status 0 on success; any exception propagates (non-zero
exit: the pod and the Airflow task fail, retries apply).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Where KubernetesPodOperator (do_xcom_push=True) reads a pod's return value.
XCOM_PATH = Path("/airflow/xcom/return.json")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run the step and publish its result; returns the result."""
    from flora.orchestration.steps import STEPS, run_step

    ap = argparse.ArgumentParser(prog="python -m flora.orchestration.pod", description=__doc__)
    ap.add_argument("step", choices=sorted(STEPS), help="the step to run")
    ap.add_argument("--inputs", default="{}", help="the step's keyword arguments (JSON object)")
    ap.add_argument("--xcom", nargs="?", const=str(XCOM_PATH), default=None, metavar="PATH",
                    help=f"also write the result to PATH (default {XCOM_PATH})")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        inputs = json.loads(args.inputs)
    except json.JSONDecodeError as e:
        ap.error(f"--inputs of step {args.step} is not JSON: {e}")
    if not isinstance(inputs, dict):
        ap.error(f"--inputs of step {args.step} must be a JSON object, got {type(inputs).__name__}")
    result = run_step(args.step, inputs)
    text = json.dumps(result, default=str)
    if args.xcom:
        out = Path(args.xcom)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    print(text, flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
