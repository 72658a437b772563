"""Seeded random mutations of real inputs — the shipped example specs, the shipped replay tables, the
shapes of a model's answer — each read the way a user's would be. Every mutant must be either accepted
or refused with the reader's own error (SpecError, ReplayError, AnswerError): a TypeError, a KeyError
or a traceback is a finding. These seeds once found a spec value that ended `tune` in a traceback and
answer fields that skipped the re-ask (docs/llm.md); the seeds are fixed, so a failure reproduces."""

from __future__ import annotations

import copy
import csv
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from optico.candidates import valid_strategies
from optico.errors import SpecError
from optico.llm.answers import AnswerError, analysis_answer, failure_answer, generation_answer
from optico.replay_csv import read_replay_file
from optico.replay_format import ReplayError
from optico.replay_measured import measured_mfu
from optico.replay_parse import variants
from optico.spec import parse_spec_text
from tests.conftest import EXAMPLES, REPO

# Values a hand-edited or generated file holds where another was meant.
VALUES: list[Any] = [None, 0, -1, 1, 3, 7, 2**31, 2**63, 10**30, 1.5, -0.0, float("nan"), float("inf"), True, False,
                     "", "x", "none", "auto", "1e400", "\x1b[31mred", "a" * 3000, [], [1], [None], [[1, 2], 3], {},
                     {"a": 1}, ["tp"], [0, 0], ["none", "full"], [True, False], "1", "true", "TP", 1e-300]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        out += _paths(child, prefix + (key,))
    return out


def _mutate(doc: dict, rng: random.Random) -> dict:
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        roll = rng.random()
        if roll < 0.25:
            del parent[path[-1]]
        elif roll < 0.35 and isinstance(parent, dict):
            parent[rng.choice(["tp", "mbs", "recompute", "recompute_num_layers", "recompute_method", "vpp", "ep",
                               "num_experts", "gpu", "nodes", "max_trials", "kind", "bogus"])] = \
                copy.deepcopy(rng.choice(VALUES))
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(VALUES))
    return doc


@pytest.mark.parametrize("seed", range(4))
def test_mutated_example_specs_are_accepted_or_refused_naming_a_field(seed: int):
    rng = random.Random(seed)
    examples = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))]
    refused = 0
    for _ in range(400):
        text = yaml.safe_dump(_mutate(rng.choice(examples), rng), allow_unicode=True)
        try:
            parse_spec_text(text, origin_name="fuzz.yaml", base_dir=EXAMPLES)
        except SpecError as exc:
            refused += 1
            assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)[:300]
    assert refused > 200  # most mutants are wrong; a reader accepting them all would pass unnoticed


def _tables() -> list[list[list[str]]]:
    files = sorted((REPO / "benchmarks" / "data").rglob("*.csv"))
    return [rows for f in files if len(rows := list(csv.reader(f.open(encoding="utf-8")))) > 1]


CELLS = ["", " ", "0", "-1", "1e309", "nan", "inf", "1" * 40, "0.0", "1,5", "45 %", "850 ms", "none", "true", "oom",
         "error", "∞", "１２", "full", "block", "a100", "mi300x", "1/2", "(4)", "4 (8)", "1 (", "args: tp=0",
         "args: num-layers=0, hidden-size=7", "zero-1 (deepspeed)", "\"", "a\nb", "9" * 400]


@pytest.mark.parametrize("seed", range(3))
def test_mutated_replay_tables_are_read_or_refused_as_replay_errors(seed: int, tmp_path: Path):
    rng = random.Random(seed)
    tables = _tables()
    path = tmp_path / "t.csv"
    for _ in range(60):
        rows = [list(r) for r in rng.choice(tables)]
        for _ in range(rng.randint(1, 6)):
            r = rng.randrange(len(rows))
            if rows[r] and rng.random() < 0.8:
                rows[r][rng.randrange(len(rows[r]))] = rng.choice(CELLS)
            else:
                rows[r] = rows[r][:rng.randrange(len(rows[r]) + 1)]
        buf = io.StringIO()
        csv.writer(buf).writerows(rows)
        path.write_text(buf.getvalue(), encoding="utf-8")
        try:
            read, _ = read_replay_file(path)
        except ReplayError:
            continue
        for row in read:
            if row.usable:
                measured_mfu(row)
                variants(row)


KEYS = ["health", "health_reason", "bottleneck", "directive", "suggestions", "changes", "change", "param", "from",
        "to", "kind", "proposals", "config", "confidence", "summary", "category", "params", "evidence", "retry",
        "tp", "mbs", "recompute", "think"]
ATOMS: list[Any] = [None, True, 0, 2, 3.5, float("nan"), 10**40, "", "x", "none", "full", "oom", "healthy",
                    "RETRY", "TP 1 -> 2", "2", "abc" * 50]


def _shape(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.45:
        return rng.choice(ATOMS)
    if roll < 0.7:
        return [_shape(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): _shape(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def test_answers_of_every_shape_are_used_or_re_asked():
    spec = parse_spec_text((EXAMPLES / "llama3-8b-a100.yaml").read_text(), origin_name="x.yaml", base_dir=EXAMPLES)
    space, ref = spec.search_space, next(iter(valid_strategies(spec.search_space, spec.workload)))
    rng = random.Random(0)
    for _ in range(1500):
        data = {k: _shape(rng, 1) for k in rng.sample(KEYS, rng.randint(1, 7))}
        text = json.dumps(data)
        for parse in (lambda: analysis_answer(data, text, space=space, reference=ref, limit=5),
                      lambda: generation_answer(data, text, space=space, reference=ref, limit=5),
                      lambda: failure_answer(data, text, space=space, detected=None, excerpt="", log="")):
            try:
                parse()
            except AnswerError:
                pass
