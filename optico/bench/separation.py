"""Calibration data and test landscapes never overlap; tuner constants are frozen before test seeds.

Two rules, enforced here in code (docs/benchmarks.md, "Calibration and test separation"):

1. **No test landscape replays a row its tuner was calibrated on.** A measured configuration is
   identified by (workload key, strategy signature), whichever file it sits in. Every calibration
   file the benchmark uses records the rows it was fitted on (`_meta.fitted_rows`); the shipped
   calibration, fitted on every published table and our H100 sweep (its `_meta.fitted_with`), gets
   its rows from `shipped_fit_files()`. `check_disjoint` refuses a replay landscape whose rows meet its
   calibration's, and a replay landscape without a held-out calibration is refused. The held-out
   calibrations (`optico/bench/calibrations/without-<file>.json`) are fitted from the uncalibrated
   defaults — not from the shipped constants, which have seen every file — on all data files but the
   landscape's own: `python -m optico.bench.separation --data
   benchmarks/data/published/*.csv benchmarks/data/h100-llama-1b.csv` rebuilds them.

2. **Test seeds are fresh, and drawn after the tuner's constants were frozen.** Development
   (tuning the residual prior, the acquisition's tie and health share, the stopping threshold) uses
   landscape seeds `DEV_LANDSCAPE_SEEDS` only — 0 is the published seed earlier constants were
   adjusted on. Test landscape seeds come from `TEST_SALT`, which was chosen after the constants were
   frozen; `frozen_digest()` hashes those constants and `FROZEN_DIGEST` is the value they had when
   the salt was drawn. Changing a constant without drawing a new salt makes `check_frozen` fail (the
   benchmark marks its report "not held out", and a unit test fails), so a constant cannot be tuned
   on the reported landscapes without it showing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from functools import lru_cache
from pathlib import Path

from optico.perfmodel.constants import DEFAULT_CALIBRATION, load_constants

CALIBRATIONS = Path(__file__).with_name("calibrations")
REPO_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
# The published tables (the shared data set, shipped in the repository with its README).
PUBLISHED_DATA = REPO_DATA / "published"


def shipped_fit_files() -> list[Path]:
    """What the shipped calibration was fitted on (its _meta.fitted_with): every published table and
    our H100 sweep."""
    return sorted(PUBLISHED_DATA.glob("*.csv")) + [REPO_DATA / "h100-llama-1b.csv"]

DEV_LANDSCAPE_SEEDS: tuple[int, ...] = (0, 1, 2)
# Drawn once the constants below were frozen; a new salt means new test landscapes.
TEST_SALT = "i13-test-2026-11-28-l"  # drawn after the first launch became the highest expected MFU (twelfth freeze)
FROZEN_DIGEST = "fe88eeaff44d2717"  # the constants' digest when TEST_SALT was drawn (frozen_digest())


class LandscapeOverlap(ValueError):
    """A test landscape whose rows its tuner's calibration has seen."""


def row_key(workload_key: str, signature: str) -> str:
    return f"{workload_key}/{signature}"


def file_rows(path: str | Path) -> frozenset[str]:
    """Keys of the measured configurations of a replay CSV (rows the model can read)."""
    return _rows_of(str(path))


@lru_cache(maxsize=64)
def _rows_of(path: str) -> frozenset[str]:
    from optico.replay_csv import read_replay_csv

    return frozenset(row_key(r.workload.key(), r.strategy.signature()) for r in read_replay_csv(path)
                     if r.workload is not None and r.strategy is not None)


@lru_cache(maxsize=32)
def fitted_rows(calibration: str | None) -> frozenset[str] | None:
    """The rows a calibration file was fitted on; None when unknown (then nothing may be replayed)."""
    path = Path(calibration) if calibration else DEFAULT_CALIBRATION
    meta = json.loads(path.read_text()).get("_meta", {})
    if "fitted_rows" in meta:
        # The rows as recorded at fitting, and the same files read with today's workload keys: a
        # reading rule that changed a key since (a GB200 rack read as 64 GPUs, not 72) must not let
        # a fitted row pass as unseen.
        return frozenset(meta["fitted_rows"]).union(*(file_rows(f) for f in _data_files(meta.get("fitted_on", []))))
    if path.resolve() == DEFAULT_CALIBRATION.resolve():
        files = shipped_fit_files()
        if all(f.is_file() for f in files) and files[:-1]:
            return frozenset().union(*(file_rows(f) for f in files))
    return None


def _data_files(names: list[str]) -> list[Path]:
    """The repository's data files of these names (published tables, then our own sweeps); a name is
    a file name, never a path."""
    found = [folder / Path(n).name for n in names for folder in (PUBLISHED_DATA, REPO_DATA)]
    return [f for f in found if f.is_file()]


def check_disjoint(name: str, rows: set[str], calibration: str | None) -> None:
    """Raises LandscapeOverlap when `rows` meet what `calibration` was fitted on (or that is unknown)."""
    seen = fitted_rows(calibration)
    label = calibration or "the shipped calibration"
    if seen is None:
        raise LandscapeOverlap(f"{name}: the rows {label} was fitted on are unknown; a replay landscape needs "
                               f"a calibration that records them")
    common = rows & seen
    if common:
        raise LandscapeOverlap(f"{name}: {len(common)} of its {len(rows)} measured configurations are in the "
                               f"calibration data of {label}")


def heldout_calibration(path: str | Path) -> str | None:
    """The calibration fitted without `path`'s file, if one was built."""
    candidate = CALIBRATIONS / f"without-{Path(path).stem}.json"
    return str(candidate) if candidate.is_file() else None


def build_heldout(files: list[Path], out_dir: Path = CALIBRATIONS, holdout: list[str] | None = None) -> list[Path]:
    """For each file stem in `holdout` (default: every file), fits the constants from the
    uncalibrated defaults on all other files and writes without-<stem>.json with the rows it saw."""
    from optico.perfmodel.calibrate import calibrate
    from optico.perfmodel.constants import Constants

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for held in files:
        if holdout and held.stem not in holdout:
            continue
        held_rows = file_rows(held)
        train = [f for f in files if f != held and not (file_rows(f) & held_rows)]
        result = calibrate(train, start=Constants())
        rows = sorted(set().union(*(file_rows(f) for f in train)))
        data = {"_meta": {"fitted_on": [f.name for f in train], "held_out": held.name,
                          "started_from": "uncalibrated defaults (Constants())", "fitted_rows": rows},
                **result.constants.model_dump()}
        target = out_dir / f"without-{held.stem}.json"
        target.write_text(json.dumps(data, indent=1) + "\n")
        written.append(target)
    return written


# -- seeds and the freeze ------------------------------------------------------------------------

def test_landscape_seed(index: int = 0) -> int:
    """The index-th test landscape seed: from TEST_SALT, never a development seed."""
    digest = hashlib.sha256(f"{TEST_SALT}|{index}".encode()).digest()
    seed = 1_000_000 + int.from_bytes(digest[:4], "little") % 1_000_000_000
    if seed in DEV_LANDSCAPE_SEEDS:
        raise AssertionError("a test seed fell among the development seeds")
    return seed


def frozen_digest() -> str:
    """A hash of every constant of the tuner that was tuned on development landscapes."""
    from optico.agents import acquisition, stopping
    from optico.perfmodel import residual
    from optico.perfmodel.online import MEMORY_COMPONENTS_SD, MEMORY_PRIOR
    from optico.spec import Budget

    b = Budget()
    frozen = {"prior": residual.ResidualPrior().__dict__, "tie": acquisition.TIE,
              "health_share": acquisition.HEALTH_SHARE, "converge_tol": b.converge_tol, "min_trials": b.min_trials}
    # Added with the prior's adaptation and the look-ahead stop (issue 13, second freeze).
    frozen["adapt"] = {"scales": residual.SCALES, "from": residual.ADAPT_FROM,
                       "hyperprior_sd": residual.SCALE_HYPERPRIOR_SD, "memory_prior": MEMORY_PRIOR.__dict__,
                       "lookahead": stopping.LOOKAHEAD}
    # Added with the fit floor and the memory correction that may not reassure (issue 13, third freeze).
    frozen["fit"] = {"min_fit_chance": acquisition.MIN_FIT_CHANCE, "no_reassurance_beyond_measured": True}
    # The tie became a share of the incumbent's MFU (issue 13, fourth freeze).
    frozen["tie_is_relative"] = True
    # The residual GPs average over their prior's factors instead of taking the most likely (fifth freeze).
    frozen["scales_averaged"] = {"cutoff": residual.MIXTURE_CUTOFF}
    # A job without a baseline starts from the model's pick (sixth freeze: within memory headroom; twelfth:
    # the highest expected MFU, the predicted MFU times the chance of fitting).
    frozen["start"] = {"model_pick": "highest expected MFU"}
    # The memory correction also learns per-component errors (seventh freeze).
    frozen["memory_components_sd"] = list(MEMORY_COMPONENTS_SD)
    # The shipped calibration: it centres the simulated families and is the tuner's model on the
    # independent ones, so refitting it calls for a new draw too (eighth freeze).
    frozen["calibration"] = load_constants(DEFAULT_CALIBRATION).model_dump()
    # A zero expected gain never wins the ranking's tie against a positive one (tenth freeze).
    frozen["zero_gain_loses_ties"] = True
    # The ranking reads the posterior widened where it picks (eleventh freeze).
    frozen["pick_sd_widening"] = acquisition.PICK_SD_WIDENING
    return hashlib.sha256(json.dumps(frozen, sort_keys=True).encode()).hexdigest()[:16]


def check_frozen() -> bool:
    """Whether the tuner's constants are those frozen when the test seeds were drawn."""
    return frozen_digest() == FROZEN_DIGEST


def main() -> None:
    parser = argparse.ArgumentParser(description="Rebuild the held-out calibrations of the real landscapes.")
    parser.add_argument("--data", nargs="+", required=True, help="every calibration file (replay CSVs)")
    parser.add_argument("--holdout", nargs="*", help="file stems to hold out (default: each file in turn)")
    args = parser.parse_args()
    for path in build_heldout([Path(p) for p in args.data], holdout=args.holdout):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
