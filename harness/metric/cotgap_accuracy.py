"""cotgap accuracy: chain-of-thought completions scored with cotgap's named, versioned extractors.

    import evaluate
    from harness import metric
    acc = evaluate.load(metric.path())
    acc.compute(predictions=["3+4=7. The answer is 7."], references=["7"], task="sandbox_addition")
    # {'accuracy': 1.0, 'strict_accuracy': 1.0, 'flexible_accuracy': 1.0, ...}

The same scores as `scoring.score` and `cotgap score`: strict and flexible readings side by side, the
task's headline reading as `accuracy`, a truncated completion (finish_reason "length") never
scored as an answer. References are gold answers as `cotgap ls items TASK` prints them.
"""

from __future__ import annotations

import datasets
import evaluate

from harness.tasks import scoring
from harness.tasks import suite as tasks

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of completions (str).
    references: list of gold answers (str), in the task's canonical form.
    task: a cotgap task name (`cotgap ls tasks`); picks the extractor, answer type and headline.
    extractor: optional extractor name overriding the task's (`harness.tasks.answers.EXTRACTORS`).
    finish_reasons: optional list of "stop" / "length", one per prediction (default all "stop").
    choices: optional list of option-text lists, one per prediction (multiple-choice tasks).
Returns:
    accuracy (the task's headline reading), strict_accuracy, flexible_accuracy,
    format_failure_rate (no headline answer, not truncated), truncation_rate, n.
"""


class CotgapAccuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[str],
        task: str | None = None,
        extractor: str | None = None,
        finish_reasons: list[str] | None = None,
        choices: list[list[str] | None] | None = None,
    ) -> dict:
        if task is None:
            raise ValueError(f"compute(..., task=NAME) is required; tasks: {tasks.task_names()}")
        spec = tasks.load_task(task)
        n = len(predictions)
        finish_reasons = finish_reasons or ["stop"] * n
        choices = choices or [None] * n
        if len(finish_reasons) != n or len(choices) != n:
            raise ValueError("finish_reasons and choices need one entry per prediction")
        rows = zip(predictions, references, finish_reasons, choices, strict=True)
        records = []
        for text, gold, finish, opts in rows:
            scored = scoring.score(spec, text, gold, finish, extractor, opts)
            records.append({**scored, "finish_reason": finish, "completion_tokens": None})
        out = scoring.rates(records, spec.headline)
        return {k: out[k] for k in ("accuracy", "strict_accuracy", "flexible_accuracy",
                                    "format_failure_rate", "truncation_rate", "n")}  # fmt: skip
