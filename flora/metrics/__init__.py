"""flora.metrics: evaluation and reward metrics (plain re-exports per area)."""

# Rewarder metrics (flora/metrics/reward.py)
from flora.metrics.reward import dense_group_accuracy as dense_group_accuracy  # noqa: E402
from flora.metrics.reward import failure_recall as failure_recall  # noqa: E402
from flora.metrics.reward import outcome_mae as outcome_mae  # noqa: E402
from flora.metrics.reward import rubric_l1 as rubric_l1  # noqa: E402

# Segmentation metrics (flora/metrics/segment.py)
from flora.metrics.segment import boundary_score as boundary_score
from flora.metrics.segment import match as match
from flora.metrics.segment import mean_best_tiou as mean_best_tiou
from flora.metrics.segment import r_seg as r_seg
from flora.metrics.segment import segment_f1 as segment_f1
from flora.metrics.segment import segment_precision as segment_precision
from flora.metrics.segment import segment_recall as segment_recall
from flora.metrics.segment import tiou as tiou
from flora.metrics.segment import tiou_matrix as tiou_matrix

# isort: split
# Caption reward (flora/metrics/caption.py)
from flora.metrics.caption import CapScore as CapScore  # noqa: E402
from flora.metrics.caption import FactualError as FactualError  # noqa: E402
from flora.metrics.caption import Judge as Judge  # noqa: E402
from flora.metrics.caption import Judgment as Judgment  # noqa: E402
from flora.metrics.caption import Requirement as Requirement  # noqa: E402
from flora.metrics.caption import r_cap as r_cap  # noqa: E402
from flora.metrics.caption import score_caption as score_caption  # noqa: E402
from flora.metrics.caption import score_captions as score_captions  # noqa: E402
from flora.metrics.caption import score_judgment as score_judgment  # noqa: E402
