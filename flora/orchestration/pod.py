"""A step pod's command: ``python -m flora.orchestration.pod STEP --inputs JSON --xcom``.

Runs :func:`flora.orchestration.steps.run_step` — the same function the in-process
``@task`` calls — on the JSON inputs (the upstream tasks' XCom values, rendered into the
argument by Airflow), prints the result as one JSON line and, with ``--xcom``, writes it
where ``KubernetesPodOperator``'s XCom sidecar reads it (:data:`XCOM_PATH`; a path after
``--xcom`` overrides it for tests — the DAGs pass none, since a templated argument ending
in ``.json`` would be loaded as a template file), so the next task receives it exactly as
it would from the ``@task``.

Exit status: 0 on success; :data:`EXIT_PERMANENT` when the step raised one of
:func:`flora.orchestration.permanent_errors` (bad input: every retry would fail alike), on
which the DAG's pod task fails at once without retrying
(:class:`flora.orchestration.tasks.StepPodOperator`); 2 for bad arguments; any other
exception propagates (exit 1: the task fails and its retries apply).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

#: Where KubernetesPodOperator (do_xcom_push=True) reads a pod's return value.
XCOM_PATH = Path("/airflow/xcom/return.json")
#: Exit status of a step that failed on bad input (sysexits' EX_DATAERR): distinct from
#: Python's 1 (any uncaught exception), argparse's 2 and the signal statuses (137 OOM kill).
EXIT_PERMANENT = 65
#: Kubernetes shows this file's text as the container's termination message, which
#: KubernetesPodOperator puts in the task's error.
TERMINATION_LOG = Path("/dev/termination-log")


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
    from flora.orchestration import permanent_errors

    try:
        result = run_step(args.step, inputs)
    except permanent_errors() as e:
        traceback.print_exc()  # in the pod's log, as an uncaught error would be
        msg = f"{args.step}: bad input, not retried: {type(e).__name__}: {e}"
        print(msg, file=sys.stderr, flush=True)
        if TERMINATION_LOG.exists():  # only in a Kubernetes container (never create it)
            with contextlib.suppress(OSError):
                TERMINATION_LOG.write_text(msg[:4000])  # the kubelet keeps 4096 bytes
        raise SystemExit(EXIT_PERMANENT) from e
    text = json.dumps(result, default=str)
    if args.xcom:
        out = Path(args.xcom)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    print(text, flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
