#!/bin/sh
# Entrypoint of the Flora images (Dockerfile): one image serves as an Airflow worker, a
# Kubeflow Pipelines component image and a plain `flora` CLI. Dispatch on the first arg:
#   airflow ...        Airflow (KubernetesExecutor pods run `airflow tasks run ...`)
#   kfp ...            KFP v2 component: python -m kfp.dsl.executor_main ...
#   flora ... | (none) the Flora CLI (default: flora --help)
#   python*|sh|bash    run as given (KFP's own launcher commands, debugging)
#   anything else      passed to the Flora CLI (`docker run IMAGE serve --model ...`)
# No secrets here: tokens and database URLs come from the environment at run time.
set -eu
if [ "$#" -eq 0 ]; then
  exec flora --help
fi
cmd="$1"
case "$cmd" in
  airflow)
    exec "$@"
    ;;
  kfp)
    shift
    exec python -m kfp.dsl.executor_main "$@"
    ;;
  flora)
    exec "$@"
    ;;
  python|python3|python3.11|sh|bash)
    exec "$@"
    ;;
  *)
    exec flora "$@"
    ;;
esac
