"""A plugin for the tests that count grammar parses: it counts the calls of the grammar parser in
its process, and its evaluator `test_parses` logs that count with the process id at each evaluation
(in `log`/<pid>.jsonl), so a test sees how often each worker parsed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from einspace.evaluators.base import Evaluator, register_evaluator
from einspace.grammar import parser

_parse = parser.parse_grammar
PARSES = 0


def _counted(*args: Any, **kwargs: Any) -> Any:
    global PARSES
    PARSES += 1
    return _parse(*args, **kwargs)


parser.parse_grammar = _counted


@register_evaluator
class ParsesEvaluator(Evaluator):
    """Fitness from the parameter count; logs the parses of its process so far."""

    name = "test_parses"

    def __init__(self, log: str):
        self.log = Path(log)

    def evaluate(self, checked, random_seed):
        with open(self.log / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "parses": PARSES}) + "\n")
        return {"fitness": -float(checked.params)}
