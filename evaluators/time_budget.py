"""The time budget of one training run (`max_seconds`): a forecast before anything is built, a
projection a few steps in, and the record of how far training got and where the time went.

The forecast comes from the worker's calibrated time model (einspace.evaluators.time_model) and
refuses trees predicted far over the budget; the projection replaces the prediction by measured
step times; `Progress` is what `run_task` turns into the evaluation's Cost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from einspace.evaluators._runtime import Runtime, autocast_dtype, resolve_device
from einspace.evaluators.base import EvaluationFailed
from einspace.evaluators.time_model import Forecast, Workload, calibrated

if TYPE_CHECKING:
    from einspace.checker import CheckedTree
    from einspace.evaluators.objectives import Objective
    from einspace.evaluators.training_settings import TrainingSettings

__all__ = ["PROJECTION_STEPS", "Laps", "Progress", "Projection", "forecast_run"]


class Laps:
    """Wall time of the consecutive phases of a run, as `time/<phase>` metrics: where the fixed
    cost of an evaluation goes (device start, building, data, autotuning in the first step)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, phase: str) -> None:
        """The phase `phase` ends now (and the next begins)."""
        now = time.perf_counter()
        self.times[f"time/{phase}"] = now - self.mark
        self.mark = now


#: Steps after the first (which includes lazy initialisation and autotuning) that time the
#: projection of a run under a time budget.
PROJECTION_STEPS = 3
#: Without a calibrated time model, a forward pass is taken as a third of a training step per
#: example (the backward pass costs about twice the forward).
_FORWARD_SHARE = 1 / 3


def forecast_run(
    checked: CheckedTree,
    settings: TrainingSettings,
    objective: Objective,
    examples: int,
    eval_examples: int,
    epochs: int | None = None,
) -> Forecast | None:
    """The predicted time of a run of `epochs` (default: the settings') under a time budget
    (None: no budget, or no calibration on this device). Refuses, before anything is built, a
    tree predicted to take more than `predicted_time_margin` times the budget; on a lower rung of
    a multi-fidelity search (`top_epochs`), also one whose training for the top rung's epochs
    (from scratch, as a run without rungs would train) is predicted to, since it could never be
    promoted to the top and every rung it trained on would be wasted."""
    if settings.max_seconds is None:
        return None
    device = resolve_device(settings.device)
    model = calibrated(device, autocast_dtype(device, settings.amp), settings.threads)
    if model is None:
        return None
    workload = Workload.of(checked, objective.budget_classes)

    def predicted(epochs: int) -> Forecast:
        return model.forecast(
            workload, epochs, examples, settings.batch_size, eval_examples, settings.eval_batch_size
        )

    forecast = predicted(settings.epochs if epochs is None else epochs)
    _refuse_beyond_margin(forecast, settings, "")
    top = settings.top_epochs
    if top is not None and top > settings.epochs:
        _refuse_beyond_margin(
            predicted(top), settings, f", so it could never train at the top rung ({top} epochs)"
        )
    return forecast


def _refuse_beyond_margin(forecast: Forecast, settings: TrainingSettings, consequence: str) -> None:
    """Raise EvaluationFailed, with nothing trained, if `forecast` exceeds `predicted_time_margin`
    times the time budget (`consequence` ends the reason)."""
    assert settings.max_seconds is not None
    if forecast.seconds > settings.predicted_time_margin * settings.max_seconds:
        raise EvaluationFailed(
            f"predicted {forecast} exceeds the time budget of {settings.max_seconds:g} s "
            f"(refused beyond {settings.predicted_time_margin:g}x the budget){consequence}",
            {"epochs": 0.0, "steps": 0.0, "gpu_seconds": 0.0},
        )


class Progress:
    """How far training got, as the progress metrics `run_task` turns into a Cost: epochs
    (fractional), optimiser steps, and seconds of training and scoring on a CUDA device."""

    def __init__(self, steps_per_epoch: int, cuda: bool):
        self.steps_per_epoch, self.cuda = steps_per_epoch, cuda
        self.steps = 0
        self.device_started: float | None = None
        self.device_ended: float | None = None

    def metrics(self) -> dict[str, float]:
        gpu = 0.0
        if self.cuda and self.device_started is not None:
            gpu = (self.device_ended or time.perf_counter()) - self.device_started
        return {"epochs": self.steps / self.steps_per_epoch, "steps": float(self.steps), "gpu_seconds": gpu}


class Projection:
    """The `max_seconds` budget during training: after the first step and PROJECTION_STEPS more,
    the whole run is projected from their measured time and stopped if the projection exceeds
    the budget. Later it only says when the budget has run out."""

    def __init__(
        self,
        settings: TrainingSettings,
        started: float,
        total_steps: int,
        eval_examples: int,
        forecast: Forecast | None,
    ):
        self.limit, self.started = settings.max_seconds, started
        self.total_steps, self.forecast = total_steps, forecast
        self.eval_examples, self.batch_size = eval_examples, settings.batch_size
        self.after_first: float | None = None

    def exhausted(self) -> bool:
        return self.limit is not None and time.perf_counter() - self.started > self.limit

    def validation_seconds(self, step_seconds: float) -> float:
        """Validation time, from the forecast scaled by how far the measured step is off its
        prediction, or without a forecast from the step time itself."""
        if self.forecast is not None and self.forecast.step_seconds > 0:
            return self.forecast.validation_seconds * step_seconds / self.forecast.step_seconds
        return self.eval_examples / self.batch_size * step_seconds * _FORWARD_SHARE

    def check(self, progress: Progress, runtime: Runtime) -> None:
        """Called after every step; raises EvaluationFailed when the projection exceeds the budget."""
        if self.limit is None or self.total_steps <= 1 + PROJECTION_STEPS:
            return
        if progress.steps == 1:
            self.after_first = time.perf_counter()  # the caller synchronised after the first step
        if progress.steps != 1 + PROJECTION_STEPS or self.after_first is None:
            return
        runtime.synchronize()
        now = time.perf_counter()
        step = (now - self.after_first) / PROJECTION_STEPS
        remaining = (self.total_steps - progress.steps) * step
        validation = self.validation_seconds(step)
        projected = now - self.started + remaining + validation
        if projected > self.limit:
            raise EvaluationFailed(
                f"projected {projected:.3g} s of training exceeds the time budget of {self.limit:g} s: "
                f"{now - self.started:.3g} s for the first {progress.steps} steps, then "
                f"{self.total_steps - progress.steps} steps x {step:.3g} s/step (measured over "
                f"{PROJECTION_STEPS}) + {validation:.3g} s validation",
                progress.metrics(),
            )
