"""``flora_train_models``'s ``models`` param: an unknown name or an empty list fails the
run at once instead of skipping every model (a run that trains nothing and succeeds)."""

from __future__ import annotations

import pytest


def test_prepare_refuses_unknown_or_no_models(airflow_home):
    from airflow.sdk.exceptions import AirflowFailException

    from dags.flora_train_models import MODELS, select_models

    with pytest.raises(AirflowFailException, match=r"'Segmenter'.*segmenter, captioner, rewarder"):
        select_models(["Segmenter"])
    with pytest.raises(AirflowFailException, match=r"'rewardr'"):
        select_models(["captioner", "rewardr"])
    with pytest.raises(AirflowFailException, match="empty"):
        select_models([])
    with pytest.raises(AirflowFailException, match="list"):
        select_models("captioner")  # a string is no list (`in` would match substrings)
    assert select_models(None) == list(MODELS)  # no param: every model
    assert select_models(["rewarder", "captioner"]) == ["captioner", "rewarder"]


def test_models_param_schema_lists_the_models(airflow_home):
    """A trigger (UI, REST, ``--conf``) with a bad ``models`` is refused before any task."""
    from airflow.sdk.exceptions import ParamValidationError

    from dags.flora_train_models import MODELS, dag_object

    param = dag_object.params.get_param("models")
    assert param.resolve(["captioner"]) == ["captioner"]
    for bad in (["Segmenter"], [], ["captioner", "captioner"]):
        with pytest.raises(ParamValidationError):
            param.resolve(bad)
    assert param.schema["items"]["enum"] == list(MODELS)
