"""`python -m app.calibrate FILE.csv [FILE.csv ...] [--name NAME] [--write-db]`: fit a calibration profile.

Reads published measurements (the schema of measured-calibration.csv), fits the efficiencies of
app.sizing.calibration.fit per GPU family and compute precision (plus one per GPU maker, and the global
fallback) starting from the builtin constants, cross-validates (leave one GPU, model family, engine out) and ships the specificity level with the
lowest held-out error (a more specific one only where its lead is more than sampling noise), and writes the profile as JSON
(app/data/calibration/<name>-profile.json unless --output says otherwise). With --write-db it is also
stored in DATABASE_URL. The shipped default profile is made with:

    python -m app.calibrate tests/data/measured-calibration.csv tests/data/measured-calibration-2.csv --name default

With --hold-out gpu=b200,h200-sxm (or model_family=..., engine=...) it only cross-validates those groups, each
predicted by a fit on every other group's rows, prints their held-out errors per level, metric and layout, and
writes no profile: a quick look at a change on the groups it is about, before a whole refit. With --rows FILE.csv
it also writes each of their rows, its measured value and its held-out prediction and error at each level (which
rows a change moved, where the medians only say by how much), with the run's stated engine version, layout, lengths
and load to group them by. The fits (the whole one and every held-out one)
run --jobs at a time (default: one per CPU this process may use), each in a worker process, a worker taking
the next fit when it is done; the numbers do not depend on it.

Predictions use the catalog shipped in app/data (no database needed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from pathlib import Path

from sqlalchemy.exc import DBAPIError

from app.calibration.crossval import HELD_OUT_ROW_FIELDS, HOLD_OUTS
from app.calibration.profiles import (
    DEFAULT_PROFILE,
    DEFAULT_PROFILE_PATH,
    RESERVED_PROFILE_NAMES,
    builtin_profile,
    load_default_profile,
    store_profile,
)
from app.calibration.rows import read_measurement_files
from app.calibration.service import (
    NothingToFit,
    ReferenceCatalog,
    calibrate,
    held_out_groups,
)
from app.catalog.tables import ORIGIN_REFERENCE
from app.common import SLUG_PATTERN
from app.db import database_revisions, make_engine, make_session_factory, migration_heads
from app.errors import ServiceError
from app.settings import Settings

# Objective evaluations per entry: the Nelder-Mead search over up to ten parameters is not converged at
# 80. Same code and data (2026-12-04), 80 -> 160, at the level each run chose: held-out medians GPU 27.3 ->
# 27.5%, model family 19.5 -> 17.3%, engine 27.0 -> 27.3%, parameters at a bound 18 -> 7. 21
# cross-validation fits of up to 15 entries each plus the fit itself took 25-28 minutes at 160 on a quiet
# 2-vCPU AMD EPYC, one fit at a time (at 50 the held-out errors still moved by 2-3 points with incidental
# changes).
CLI_EVALUATIONS = 160


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE",
                        help="measurements CSV (the measured-calibration.csv schema); several are read as one")
    parser.add_argument("--name", default=DEFAULT_PROFILE, help="profile name (default: %(default)s)")
    parser.add_argument("--description", default=None, help="one line on what the profile is for")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the profile JSON (default: app/data/calibration/<name>-profile.json)")
    parser.add_argument("--write-db", action="store_true", help="also store the profile in DATABASE_URL")
    parser.add_argument("--evaluations", type=int, default=CLI_EVALUATIONS,
                        help="objective evaluations per fitted entry (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=_usable_cpus(),
                        help="fits (the whole fit and the held-out ones) run at once, each in a worker process of up "
                             "to about 1 GB (default: the CPUs this process may use, %(default)s); the results do "
                             "not depend on it")
    parser.add_argument("--no-cross-validation", action="store_true",
                        help="skip the held-out fits (one per GPU, model family and engine) and ship the most "
                             "specific level")
    parser.add_argument("--hold-out", metavar="KIND=GROUP[,GROUP...]",
                        help=f"only cross-validate these groups of one hold-out ({', '.join(HOLD_OUTS)}), print "
                             "their held-out errors and write no profile")
    parser.add_argument("--rows", type=Path, metavar="FILE.csv",
                        help="with --hold-out: also write each held-out row's measured value and its held-out "
                             "prediction and absolute %% error at each level to this CSV, with the run's stated "
                             "engine version, layout, lengths and load")
    args = parser.parse_args(argv)

    if args.hold_out is not None:
        return _hold_out(args)
    if args.rows is not None:
        print("--rows goes with --hold-out (a whole refit stores its held-out errors per group in the profile)",
              file=sys.stderr)
        return 2
    if not re.match(SLUG_PATTERN, args.name) or (args.name in RESERVED_PROFILE_NAMES and args.name != DEFAULT_PROFILE):
        print(f"--name must match {SLUG_PATTERN} and not be {sorted(RESERVED_PROFILE_NAMES)}", file=sys.stderr)
        return 2
    read = read_measurement_files(args.files)
    if read is None:
        return 2
    rows, files = read
    description = args.description or (
        f"Fitted to the published measurements in {files.names} ({len(rows)} rows): engines' offline, static-"
        "batch, batch-1 and Poisson-load results; see docs/ACCURACY.md")
    try:
        result = calibrate(rows, ReferenceCatalog(), name=args.name, description=description, base=builtin_profile(),
                           fit_global=True, cross_validation=not args.no_cross_validation, source_file=files.names,
                           source_sha256=files.sha256, max_evaluations=args.evaluations, jobs=args.jobs,
                           progress=lambda line: print(line, file=sys.stderr))
    except NothingToFit as exc:
        print(str(exc), file=sys.stderr)
        return 1
    output = args.output or (DEFAULT_PROFILE_PATH if args.name == DEFAULT_PROFILE
                             else DEFAULT_PROFILE_PATH.with_name(f"{args.name}-profile.json"))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result.document, indent=2) + "\n", encoding="utf-8")
    provenance = result.document["provenance"]
    validation = provenance["cross_validation"]
    print(json.dumps({
        "profile": args.name, "written": str(output), "rows_used": provenance["rows_used"],
        "median_abs_pct_error_before": provenance["fit_error"]["before"]["median_abs_pct_error"],
        "median_abs_pct_error_after": provenance["fit_error"]["after"]["median_abs_pct_error"],
        "chosen_level": None if validation is None else validation["chosen_level"],
        "held_out_median_abs_pct_error": None if validation is None else {
            item["held_out"]: item["overall"]["median_abs_pct_error"] for item in validation["hold_outs"]},
        "parameters_at_bounds": len(provenance["parameters_at_bounds"]),
    }))
    if args.write_db:
        return _write_db(result.document, output)
    return 0


def _hold_out(args: argparse.Namespace) -> int:
    kind, _, names = args.hold_out.partition("=")
    groups = [name for name in names.split(",") if name]
    if kind not in HOLD_OUTS or not groups:
        print(f"--hold-out must be KIND=GROUP[,GROUP...] with KIND one of {', '.join(HOLD_OUTS)}", file=sys.stderr)
        return 2
    read = read_measurement_files(args.files)
    if read is None:
        return 2
    try:
        document, rows = held_out_groups(read[0], ReferenceCatalog(), base=builtin_profile(), hold_out=kind,
                                         groups=groups, max_evaluations=args.evaluations, jobs=args.jobs,
                                         progress=lambda line: print(line, file=sys.stderr))
    except NothingToFit as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.rows is not None:
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        with args.rows.open("w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=HELD_OUT_ROW_FIELDS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    print(json.dumps(document, indent=1))
    return 0


def _write_db(document: dict, path: Path) -> int:
    engine = make_engine(Settings().database_url)
    try:
        if database_revisions(engine) != migration_heads():
            print("The database is not at the migration head: run `alembic upgrade head` first", file=sys.stderr)
            return 1
        with make_session_factory(engine)() as session, session.begin():
            if document["name"] == DEFAULT_PROFILE:
                status = load_default_profile(session, path=path)
            else:
                store_profile(session, document, origin=ORIGIN_REFERENCE)
                status = "inserted"
    except (DBAPIError, ServiceError) as exc:
        print(f"Cannot store the profile: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    print(json.dumps({"database": status, "profile": document["name"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
