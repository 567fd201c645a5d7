"""Reading published measurements: CSV text or API rows -> `ObservedRow`s, each ready to predict or
skipped with the reason.

The one layer between a measurement file (the schema of measured-calibration.csv, plus the columns of
measured-calibration-2.csv) and the validation pipeline. What refuses a whole file, and what only
skips a row:

- A file is refused when it cannot be read as measurements at all: a required column missing, a
  malformed CSV, a cell that is not what its column holds (a word where a number goes, a value that is
  not positive), a repeated row id.
- A row that names something the service does not predict is kept and skipped with the reason: a model
  or GPU the catalog lacks (a Hugging Face id, `a100-variant-unstated`), a metric, scenario, engine or
  precision outside the vocabulary (capacity rows, `fp32`), or a layout the model cannot express yet
  (`layout_skip_reason`) or whose columns contradict the run (`layout_conflict`). A weight dtype the source
  leaves unstated is no reason: the row is predicted at the model's published checkpoint precision, says
  so, and is not fitted on (`predict.prepare`). A file is never refused because some of
  its rows fall outside what can be predicted.

Columns beyond the schema are read only by `layout_skip_reason`, and the notes' run id only by
`layout_conflict` (a row whose layout columns contradict it); a new column that changes how a row is
predicted plugs in here (its cell read in `_observed_row`, its meaning carried by `Measurement`).

Two facts a row implies rather than states are read here too: the checkpoint recipe of a model whose
quantized weights come in one published form (`recipes.PUBLISHED_RECIPES`), and the length distribution of a
run on ShareGPT without fixed lengths (`dataset_lengths`: the shipped histograms of app/data/datasets,
made by scripts/sharegpt_lengths.py; never the row's own measured values).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from app.calibration.schemas import MeasurementRowIn, MeasurementRowUpload
from app.errors import json_pointer
from app.sizing.calibration.predict import Measurement, PoolLayout
from app.sizing.model.recipes import PUBLISHED_RECIPES
from app.sizing.serving.workload import PairedLengths

CSV_COLUMNS = tuple(MeasurementRowIn.model_fields)


def _numeric(annotation: Any) -> bool:
    """Whether a column's type is a number (int or float, optional or constrained)."""
    return annotation in (int, float) or any(_numeric(argument) for argument in get_args(annotation))


_NUMBER_FORM = " (digits, a sign, a decimal point, an exponent; no '_' between digits)"
NUMERIC_COLUMNS = tuple(name for name, field in MeasurementRowIn.model_fields.items() if _numeric(field.annotation))
REQUIRED_COLUMNS = tuple(name for name, field in MeasurementRowIn.model_fields.items() if field.is_required())
# Columns naming a thing (a catalog entry or a word of the schema's vocabulary): a value outside what
# the service knows skips the row instead of refusing the file.
VOCABULARY_COLUMNS = ("model", "gpu", "weight_dtype", "compute_dtype", "kv_dtype", "engine", "scenario", "metric",
                      "stat")
MAX_REPORTED_ERRORS = 100  # invalid cells listed in one problem
# `stated_version`: a version at the start, after an engine's name or after a 'v'; a year of the install.
_STATED_VERSION = re.compile(r"(?:^|vllm[ _-]?|tensorrt-llm[ _-]?|sglang[ _-]?|\bv)(\d+)\.(\d+)(?:\.(\d+))?", re.IGNORECASE)
_STATED_YEAR = re.compile(r"\b(20\d\d)\b")
# An NVIDIA Dynamo runtime image (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:X): X is Dynamo's release, and a
# row whose version is X states Dynamo's, not the engine's (measured-calibration-2-sources.md, AIC_SILICON_SAMPLE).
_DYNAMO_IMAGE = re.compile(r"ai-dynamo/[\w.-]*runtime:v?(\d+)\.(\d+)(?:\.(\d+))?", re.IGNORECASE)
# An aiconfigurator run's id names the layout it was launched with: `..._c32_tp8_ep8_922` or `..._tp4_0_ep1_0_185`
# (tp = the GPUs of the attention group, tp x attention-DP; ids written `_epnone_` name no EP degree).
_RUN_ID_LAYOUT = re.compile(r"\bid=[^;]*_tp(\d+)(?:_\d+)?_ep(\d+)(?:_|;|$)")
AIC_SOURCE = "AIC_SILICON_SAMPLE"  # aiconfigurator: the source whose column patterns `layout_conflict` knows


class RowsInvalid(ValueError):
    """Rows that do not follow the schema: `errors` holds (JSON pointer, message) pairs."""

    def __init__(self, detail: str, errors: list[tuple[str, str]]) -> None:
        super().__init__(detail)
        self.errors = errors


@dataclass(frozen=True, slots=True)
class ObservedRow:
    """A published number and how it was measured, kept apart: predictions only ever see `measurement`.

    `measurement` is None when the row names something the service does not predict; `skipped_reason`
    then says what. The text fields are the row's own words (for reports and grouping).
    """

    row_id: str
    source_id: str
    model: str
    gpu: str
    engine: str
    scenario: str
    metric: str
    stat: str | None
    value: float
    measurement: Measurement | None
    skipped_reason: str | None = None


# Which layouts the model cannot express yet ------------------------------------------------------

# Layout columns: measured-calibration-2.csv writes "n/a" (or 0) where a degree does not apply, i.e. 1.
LAYOUT_COLUMNS = ("dp", "ep", "moe_tp", *(f"{role}_{degree}" for role in ("prefill", "decode")
                                           for degree in ("workers", "pp", "dp", "ep", "moe_tp", "batch")))
NOT_APPLICABLE = ("n/a", "0")
POOL_COLUMNS = tuple(f"{role}_{column}" for role in ("prefill", "decode")
                     for column in ("workers", "tp", "pp", "dp", "ep", "moe_tp", "batch"))


def layout_skip_reason(cells: Mapping[str, str]) -> str | None:
    """Why a row outside the schema is skipped for its layout rather than refusing the file (None: it is
    not). The one place that decides it when reading: a disaggregated run whose source does not state its
    worker counts has no GPU count. Every layout the predictor knows (attention data parallel, expert
    parallel, pipeline, disaggregated pools) reaches it through `Measurement`."""
    if cells.get("deployment", "").strip() == "disaggregated" and not _states_pools(cells):
        return "layout not stated: a disaggregated run without its worker counts"
    return None


def _states_pools(cells: Mapping[str, str]) -> bool:
    """Whether a row states both pools' workers and tensor-parallel degrees (n/a and 0 state nothing)."""
    return all(cells.get(f"{role}_{column}", "").strip().lower() not in ("", *NOT_APPLICABLE)
               for role in ("prefill", "decode") for column in ("workers", "tp"))


def layout_conflict(cells: Mapping[str, str]) -> str | None:
    """Why a row whose layout columns cannot be trusted is skipped (None: nothing contradicts them).

    - Its own run id names another layout (aiconfigurator's `..._tp8_ep8_922`: tp = the attention group's
      GPUs, tp x dp). AIC_SILICON_SAMPLE-8236 (id tp4 ep4) records tp 16, ep 4, moe_tp 4 on 16 GPUs; its twin
      -4018, recorded as the id says (tp 4, ep 4, 4 GPUs), measures the same 25.2887 ms TPOT.
    - An AIC_SILICON_SAMPLE row without such an id whose columns have that pattern, tp x dp = ep² with
      moe_tp = ep > 1: of the 1,940 rows of that source whose id names a degree, the 232 with this pattern
      all contradict their id and none of the 1,708 that agree has it (the db-dump rows, AIC_SILICON_SAMPLE-756,
      are twins of -8236 too). Elsewhere the same columns are a real layout (4 EP groups of TP4), not a
      conflict.
    - An AIC_SILICON_SAMPLE closed loop whose concurrency (the whole deployment's) exceeds its batch (per
      attention-DP rank) times the dp it states: the stated layout would queue the rest, yet such rows measure
      the latency of a replica at its batch (AIC_SILICON_SAMPLE-1781: Qwen3-32B, 15,000-token prompts, 416
      users on one TP2 replica of batch 13, TTFT 719 ms, where 403 prompts queued ahead would take tens of
      seconds). More ranks or replicas ran than the columns say: attention DP recorded as n/a or 0
      (DeepSeek-R1 tp 8, ep 8, batch 10, 80 users = 8 ranks x 10), or replicas (416 = 32 x 13).
    - A disaggregated run whose num_gpus is not its pools' GPUs (workers x tp x pp x dp, summed over the two
      pools, as measured-calibration-2-sources.md computes it), or that states an aggregated layout's degrees
      (tp, pp, dp, ep, moe_tp: each pool states its own); an aggregated run that states a pool's columns.
    Which layout ran is not for the validator to guess: such a row is neither predicted nor fitted."""
    def degree(column: str) -> int:
        value = cells.get(column, "").strip()
        return int(value) if value.isdigit() and int(value) > 0 else 1

    stated = [column for column in POOL_COLUMNS if cells.get(column, "").strip().lower() not in ("", *NOT_APPLICABLE)]
    if cells.get("deployment", "").strip() != "disaggregated":
        if stated:
            return f"layout contradicts the run's deployment: an aggregated run that states {', '.join(stated)}"
    else:
        aggregated = [column for column in ("tp", "pp", *LAYOUT_COLUMNS[:3]) if degree(column) > 1]
        if aggregated:
            return (f"layout contradicts the run's deployment: a disaggregated run that states {', '.join(aggregated)} "
                    "(each pool states its own)")
        pools = sum(degree(f"{role}_workers") * degree(f"{role}_tp") * degree(f"{role}_pp") * degree(f"{role}_dp")
                    for role in ("prefill", "decode"))
        if all(f"{role}_{column}" in cells for role in ("prefill", "decode") for column in ("workers", "tp")) \
                and "num_gpus" in cells and degree("num_gpus") != pools:
            return (f"layout contradicts the run's GPUs: num_gpus {cells['num_gpus']}, the pools' workers x tp x pp x "
                    f"dp {pools}")
        return None

    tp, dp, ep, moe_tp = degree("tp"), degree("dp"), degree("ep"), degree("moe_tp")
    columns = f"the columns tp {tp} x dp {dp} = {tp * dp} GPUs, ep {ep}, moe_tp {moe_tp}"
    named = _RUN_ID_LAYOUT.search(cells.get("notes", ""))
    if named is not None:
        if (int(named[1]), int(named[2])) == (tp * dp, ep):
            return None
        return f"layout contradicts the run's id: the id names tp{named[1]} ep{named[2]}, {columns}"
    if cells.get("source_id") == AIC_SOURCE and ep > 1 and moe_tp == ep and tp * dp == ep * ep:
        return (f"layout in its source's inflated pattern: {columns} (tp x dp = ep², moe_tp = ep, as in every row "
                "of the source that contradicts its id)")
    batch, users = cells.get("batch", "").strip(), cells.get("concurrency", "").strip()
    if (cells.get("source_id") == AIC_SOURCE and cells.get("scenario", "").strip() == "closed_loop"
            and batch.isdigit() and users.isdigit() and int(users) > int(batch) * dp):
        return (f"layout contradicts the run's load: {users} users exceed the batch of {batch} per rank x dp {dp} "
                "that the columns state (the source's concurrency is the whole deployment's: more attention ranks "
                "or replicas ran)")
    return None


# What a row implies without stating it -------------------------------------------------------------

# A row of a model at a weight dtype it ships in one published form ran that checkpoint
# (`recipes.PUBLISHED_RECIPES`): aiconfigurator labels its gpt-oss runs "nvfp4" (measured-calibration-2-sources.md,
# AIC_SILICON_SAMPLE), and gpt-oss ships only as OpenAI's MXFP4 checkpoint.

DATASETS_DIR = Path(__file__).resolve().parents[1] / "data" / "datasets"
# Which tokenizer's ShareGPT histogram a model's rows draw from, by slug prefix (first match): the
# mistral-common 1.12.0 tokenizers, the only ones a registry package ships. tokenizer.model.v1 is the
# Mistral-7B v0.1 / Mixtral-8x7B SentencePiece model; the v3 tokenizer of Mistral-7B v0.3, Mixtral-8x22B and
# Mistral-Large-2407 adds control tokens only and gives the same statistics on this text (checked with
# mistral_instruct_tokenizer_240323.model.v3); Llama-2's own 32k SentencePiece is approximated by it.
# Tekken 240718 is Mistral-NeMo's tokenizer; for the other ~128-150k-vocabulary BPE tokenizers (Llama-3,
# Qwen, ...) it is an approximation.
SHAREGPT_TOKENIZERS = (
    ("mistral-nemo", "tekken-240718", "the model's own tokenizer"),
    ("mistral-", "spm-v1", "the model's own tokenizer's plain-text tokenization"),
    ("mixtral-", "spm-v1", "the model's own tokenizer's plain-text tokenization"),
    ("llama-2-", "spm-v1", "an approximation of Llama-2's own 32k SentencePiece tokenizer"),
    ("", "tekken-240718", "an approximation of the model's own ~128k-vocabulary BPE tokenizer"),
)
DATASET_NOTE = "sharegpt"  # a row whose notes name ShareGPT ran on it


@cache
def sharegpt_lengths(tokenizer: str) -> tuple[PairedLengths, dict[str, Any]]:
    """The shipped ShareGPT histogram of one tokenizer, and its file's header (provenance, statistics)."""
    document = json.loads((DATASETS_DIR / f"sharegpt-lengths-{tokenizer}.json").read_text(encoding="utf-8"))
    pairs = tuple((int(p), int(o), float(n)) for p, o, n in document.pop("histogram"))
    return PairedLengths(pairs), document


def dataset_lengths(model: str, notes: str) -> PairedLengths | None:
    """The (input, output) lengths of a run on ShareGPT (None: the notes name no dataset we ship), drawn as
    vLLM's serving benchmark samples it with a tokenizer of the model's family (`SHAREGPT_TOKENIZERS`). Other
    engines' benchmarks (LMDeploy's request throughput) are assumed to sample it the same way; the
    assumption says so."""
    if DATASET_NOTE not in notes.lower():
        return None
    return _named_sharegpt_lengths(*next((name, fit) for prefix, name, fit in SHAREGPT_TOKENIZERS
                                         if model.startswith(prefix)))


@cache
def _named_sharegpt_lengths(tokenizer: str, fit: str) -> PairedLengths:
    """`sharegpt_lengths` named for a row's report (once per tokenizer: every ShareGPT row of a file shares it)."""
    lengths, header = sharegpt_lengths(tokenizer)
    name = (f"ShareGPT as vLLM's benchmark samples it (other benchmarks assumed alike), tokenized with {header['tokenizer']['package']} "
            f"{header['tokenizer']['file']} ({fit}); mean {header['prompt_tokens']['mean']:g} prompt and "
            f"{header['output_tokens']['mean']:g} output tokens over {header['n']} pairs "
            f"(app/data/datasets/sharegpt-lengths-{tokenizer}.json)")
    return PairedLengths(lengths.pairs, name)


# Reading ----------------------------------------------------------------------------------------

def _records(text: str, pointer: str, max_rows: int | None):
    """(line, cells) per data row of CSV text, `line` the row's first (a quoted cell may span lines): cells of the
    schema's columns and the layout columns, stripped, empty ones left out. Lines may end in \n, \r\n or \r alone
    (universal newlines); a row of empty cells (a spreadsheet's trailing ",,,,") is skipped, as a blank line is."""
    source = io.StringIO(text, newline=None)
    lines = source.getvalue().split("\n")  # newlines translated: the reader's physical lines

    def first_line(after: int) -> int:
        """The line a record read after line `after` starts on: past the blank lines the reader skips."""
        line = after + 1
        while line <= len(lines) and lines[line - 1] == "":
            line += 1
        return line

    reader = csv.DictReader(source, strict=True)  # strict: an unclosed quote is an error
    last_read = 0  # the line the reader has read up to
    try:
        header = [name.strip() for name in reader.fieldnames or []]  # names stripped, as cells are
        reader.fieldnames = header
        repeated = sorted({name for name in header if name in CSV_COLUMNS and header.count(name) > 1})
        if repeated:  # which copy holds the row's value is the file's mistake, not ours to guess
            raise RowsInvalid(f"the CSV header names a column more than once: {', '.join(repeated)}",
                              [(pointer, f"column {name!r} appears {header.count(name)} times in the header; keep one")
                               for name in repeated])
        missing = [column for column in REQUIRED_COLUMNS if column not in header]
        if missing:
            expected = f"missing columns: {', '.join(missing)}; the header must name {', '.join(REQUIRED_COLUMNS)}"
            raise RowsInvalid(f"the CSV lacks required columns: {', '.join(missing)}", [(pointer, expected)])
        count = 0
        last_read = reader.line_num
        for record in reader:
            row_start, last_read = first_line(last_read), reader.line_num
            cells = {column: value.strip() for column, value in record.items()
                     if column is not None and value is not None and value.strip()}
            if not cells and None not in record:
                continue
            count += 1
            if max_rows is not None and count > max_rows:
                raise RowsInvalid(f"more than {max_rows} rows in one upload",
                                  [(pointer, f"at most {max_rows} rows per upload; split the file")])
            yield row_start, None if None in record else cells  # None: more cells than header columns
        if count == 0:
            raise RowsInvalid("the CSV has no rows", [(pointer, "no data rows after the header")])
    except csv.Error as exc:  # a NUL byte, an unclosed quote, an oversized cell
        if str(exc) == "unexpected end of data":  # the file ended inside a quoted cell
            unclosed = (f"line {first_line(last_read)}: a quoted cell on this row is never closed: the file ends inside it "
                        "(a stray double quote?)")
            raise RowsInvalid(f"the CSV cannot be read: {unclosed}", [(pointer, unclosed)]) from None
        raise RowsInvalid(f"the CSV cannot be read: {exc}", [(pointer, f"line {reader.line_num}: {exc}")]) from None


def rows_from_csv(text: str, *, pointer: str = "/body/file", max_rows: int | None = None) -> list[MeasurementRowUpload]:
    """Parse CSV text in the upload schema (API uploads, whose rows become a request body), each row read as
    `read_rows` reads it: names outside the vocabulary are kept (`MeasurementRowUpload`), extra columns are
    ignored; a missing required column, a bad cell, a repeated row id, a malformed file or too many rows raise
    RowsInvalid (pointers `<pointer>/<line>/<column>`, at most MAX_REPORTED_ERRORS of them)."""
    rows: list[MeasurementRowUpload] = []
    errors: list[tuple[str, str]] = []
    lines: dict[str, int] = {}
    for line, cells in _records(text, pointer, max_rows):
        if cells is None:
            errors.append((f"{pointer}/{line}", f"line {line}: more cells than the header has columns"))
            continue
        try:
            row = MeasurementRowUpload.model_validate(_schema_cells(cells), strict=False)
        except ValidationError as exc:
            errors += [(f"{pointer}/{line}" + json_pointer(error["loc"]), f"line {line}: {error['msg']}")
                       for error in exc.errors()]
            continue
        # Its faults named by line; the request reads it whole later (`observed_rows`).
        checked = _checked(_with_pool_gpus(cells), f"{pointer}/{line}", f"line {line}: ")
        if isinstance(checked, list):
            errors += checked
        elif row.row_id in lines:
            repeated = f"line {line}: row_id {row.row_id!r} repeats line {lines[row.row_id]}"
            errors.append((f"{pointer}/{line}/row_id", repeated))
        else:
            lines[row.row_id] = line
            rows.append(row)
    if errors:
        raise RowsInvalid(f"{len(errors)} invalid cells in the CSV", errors[:MAX_REPORTED_ERRORS])
    return rows


def read_rows(text: str, *, pointer: str, sources: Collection[str] | None = None) -> list[ObservedRow]:
    """Every row of a measurement file (the command-line tools; of `sources` only, when given):
    predictable rows, and rows skipped with the reason (module docstring); RowsInvalid only when the file
    itself is not measurements."""
    rows: list[ObservedRow] = []
    errors: list[tuple[str, str]] = []
    for line, cells in _records(text, pointer, None):
        if sources is not None and cells is not None and cells.get("source_id") not in sources:
            continue
        if cells is None:
            errors.append((f"{pointer}/{line}", f"line {line}: more cells than the header has columns"))
            continue
        read = _read_cells(cells, f"{pointer}/{line}", f"line {line}: ")
        if isinstance(read, ObservedRow):
            rows.append(read)
        else:
            errors += read
    if errors:
        raise RowsInvalid(f"{len(errors)} invalid cells in the CSV", errors[:MAX_REPORTED_ERRORS])
    check_unique(rows, pointer)
    return rows


def _read_cells(cells: Mapping[str, str], pointer: str, prefix: str = "") -> ObservedRow | list[tuple[str, str]]:
    """One row's cells (text, empty ones left out) as a row to predict or one skipped with the reason, or the
    (pointer, message) of each cell that is not what its column holds. The one reading of a row, whether it
    came from a file or an API upload. A disaggregated run that leaves out num_gpus has its pools' GPUs."""
    cells = _with_pool_gpus(cells)
    checked = _checked(cells, pointer, prefix)
    if isinstance(checked, list):
        return checked
    if isinstance(checked, str):
        return _skipped_row(cells, checked)
    conflict = layout_conflict(cells)
    return _observed_row(checked) if conflict is None else _skipped_row(cells, conflict)


def _checked(cells: Mapping[str, str], pointer: str, prefix: str) -> MeasurementRowIn | str | list[tuple[str, str]]:
    """The row in the schema; or why it is skipped whatever else it states (a name outside the vocabulary, a
    layout not stated); or the (pointer, message) of each cell that is not what its column holds."""
    unreadable = [(f"{pointer}/{column}", f"{prefix}{value!r} is not a number as a cell writes one" + _NUMBER_FORM)
                  for column, value in cells.items() if column in NUMERIC_COLUMNS and "_" in value]
    if unreadable:  # Python's and the schema's lax parsing would read 1_000 as 1000
        return unreadable
    try:
        return MeasurementRowIn.model_validate(_schema_cells(cells), strict=False)
    except ValidationError as exc:
        # A layout the model cannot express skips the row whatever its other cells hold (a
        # disaggregated run has no single num_gpus); only its id and value must be readable.
        layout_reason = layout_skip_reason(cells)
        faults = [error for error in exc.errors() if error["loc"][0] not in VOCABULARY_COLUMNS
                  and (layout_reason is None or error["loc"][0] in ("row_id", "value"))]
        if faults:
            return [(pointer + json_pointer(error["loc"]), prefix + error["msg"]) for error in faults]
        vocabulary = [error for error in exc.errors() if error["loc"][0] in VOCABULARY_COLUMNS]
        if vocabulary:
            return _vocabulary_reason(vocabulary, cells)
        assert layout_reason is not None  # without one, every error outside the vocabulary is a fault
        return layout_reason


@dataclass(frozen=True, slots=True)
class SourceFiles:
    """Which files the rows came from: their names, and the SHA-256 of their bytes in that order."""

    names: str  # "a.csv + b.csv"
    sha256: str


def read_measurement_files(paths: Sequence[Path], sources: Collection[str] | None = None,
                           ) -> tuple[list[ObservedRow], SourceFiles] | None:
    """The rows of one or more measurement CSV files (the command-line tools; of `sources` only, when
    given), in file order, or None after printing what is wrong with them (to stderr, at most 50
    problems). Row ids are unique across the files."""
    rows: list[ObservedRow] = []
    digest = hashlib.sha256()
    for path in paths:
        data = path.read_bytes()
        digest.update(data)
        try:
            rows += read_rows(data.decode("utf-8-sig"), pointer=str(path), sources=sources)
        except (RowsInvalid, UnicodeDecodeError) as exc:
            _print_problems(str(path), exc)
            return None
    try:
        check_unique(rows, "+".join(str(path) for path in paths))
    except RowsInvalid as exc:
        _print_problems(" + ".join(str(path) for path in paths), exc)
        return None
    return rows, SourceFiles(" + ".join(path.name for path in paths), digest.hexdigest())


def _print_problems(where: str, exc: Exception) -> None:
    print(f"{where}: {exc}", file=sys.stderr)
    for pointer, message in getattr(exc, "errors", [])[:50]:
        print(f"  {pointer}: {message}", file=sys.stderr)


def _with_pool_gpus(cells: Mapping[str, str]) -> Mapping[str, str]:
    """The cells, with a disaggregated run's num_gpus when it states only its pools: workers x tp x pp x dp summed
    over the prefill and decode pools (measured-calibration-2-sources.md computes it so)."""
    if cells.get("deployment", "").strip() != "disaggregated" or "num_gpus" in cells or not _states_pools(cells):
        return cells  # without its worker counts it has no GPU count (`layout_skip_reason`)
    degrees = []
    for role in ("prefill", "decode"):
        values = [cells.get(f"{role}_{column}", "1").strip() for column in ("workers", "tp", "pp", "dp")]
        if not all(value.isdigit() or value.lower() in NOT_APPLICABLE for value in values):
            return cells  # a malformed degree is the row schema's to report
        degrees.append(math.prod(int(value) if value.isdigit() and int(value) > 0 else 1 for value in values))
    return {**cells, "num_gpus": str(sum(degrees))}


def observed_rows(rows: Sequence[MeasurementRowUpload], pointer: str = "/body/rows") -> list[ObservedRow]:
    """Domain rows from an API upload's rows, read as a file's are (`_read_cells`: a name outside the vocabulary
    skips the row with the reason); duplicate row ids raise RowsInvalid."""
    observed = []
    errors: list[tuple[str, str]] = []
    for index, row in enumerate(rows):
        cells = {column: str(value) for column, value in row.model_dump(exclude_none=True).items() if value != ""}
        read = _read_cells(cells, f"{pointer}/{index}")
        if isinstance(read, ObservedRow):
            observed.append(read)
        else:  # the upload schema holds every column but the vocabulary ones to the row schema's rules
            errors += read
    if errors:
        raise RowsInvalid(f"{len(errors)} invalid values in the rows", errors[:MAX_REPORTED_ERRORS])
    check_unique(observed, pointer)
    return observed


def check_unique(rows: Sequence[ObservedRow], pointer: str) -> None:
    seen: dict[str, int] = {}
    errors = []
    for index, row in enumerate(rows):
        if row.row_id in seen:
            errors.append((f"{pointer}/{index}/row_id", f"row_id {row.row_id!r} repeats row {seen[row.row_id]}"))
        seen.setdefault(row.row_id, index)
    if errors:
        raise RowsInvalid("row ids must be unique", errors[:MAX_REPORTED_ERRORS])


def _schema_cells(cells: Mapping[str, str]) -> dict[str, str]:
    return {column: value for column, value in cells.items() if column in CSV_COLUMNS
            and not (column in LAYOUT_COLUMNS and value.lower() in NOT_APPLICABLE)}


def _observed_row(row: MeasurementRowIn) -> ObservedRow:
    measurement = Measurement(
        scenario=row.scenario, metric=row.metric, num_gpus=row.num_gpus, weight_dtype=row.weight_dtype,
        engine=row.engine, engine_version=stated_version(row.engine_version), stat=row.stat, tp=row.tp, pp=row.pp, dp=row.dp, ep=row.ep, moe_tp=row.moe_tp,
        disaggregated=row.deployment == "disaggregated", prefill=_pool(row, "prefill"), decode=_pool(row, "decode"),
        compute_dtype=row.compute_dtype, weight_recipe=PUBLISHED_RECIPES.get((row.model, row.weight_dtype)),
        kv_dtype=row.kv_dtype, isl=row.isl, osl=row.osl, batch=row.batch, concurrency=row.concurrency,
        num_requests=row.num_requests, request_rate=row.request_rate,
        lengths=dataset_lengths(row.model, row.notes) if row.isl is None and row.osl is None else None)
    return ObservedRow(row_id=row.row_id, source_id=row.source_id, model=row.model, gpu=row.gpu, engine=row.engine,
                       scenario=row.scenario, metric=row.metric, stat=row.stat, value=row.value,
                       measurement=measurement)


def stated_version(text: str) -> str | None:
    """The engine version a row's free-text `engine_version` states: the first major.minor[.patch] at its
    start or after the engine's name or a 'v' ('0.5.3.post1 (...)' -> '0.5.3', 'rocm/vllm:rocm6.3.1_vllm0.8.3'
    -> '0.8.3', 'TensorRT-LLM 0.17' -> '0.17'); else the year of the install when the text gives one
    ('not pinned (pip install vllm, 2024)' -> '2024'); else None. A version that is an NVIDIA Dynamo runtime
    image's own ('0.8.1.post1 (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post1)') states nothing of
    the engine's: None; '1.2.0rc6.post1 (.../ai-dynamo/tensorrtllm-runtime:0.8.0)' -> '1.2.0'."""
    found = _STATED_VERSION.search(text)
    if found:
        dynamo = _DYNAMO_IMAGE.search(text)
        if dynamo and dynamo.groups() == found.groups():
            return None  # the Dynamo image's release, which says nothing of the engine's version
        return ".".join(part for part in found.groups() if part is not None)
    year = _STATED_YEAR.search(text)
    return year[1] if year else None


def _pool(row: MeasurementRowIn, role: str) -> PoolLayout | None:
    """A disaggregated row's `role` pool, None when its workers or tensor-parallel degree are not stated."""
    workers, tp = getattr(row, f"{role}_workers"), getattr(row, f"{role}_tp")
    if row.deployment != "disaggregated" or workers is None or tp is None:
        return None
    return PoolLayout(workers=workers, tp=tp, pp=getattr(row, f"{role}_pp") or 1, dp=getattr(row, f"{role}_dp") or 1,
                      ep=getattr(row, f"{role}_ep") or 1, batch=getattr(row, f"{role}_batch"))


def _skipped_row(cells: Mapping[str, str], reason: str) -> ObservedRow:
    """A row whose names fall outside the vocabulary: its other cells passed the schema."""
    return ObservedRow(row_id=cells["row_id"], source_id=cells.get("source_id", "upload"),
                       model=cells.get("model", ""), gpu=cells.get("gpu", ""), engine=cells.get("engine", ""),
                       scenario=cells.get("scenario", ""), metric=cells.get("metric", ""), stat=cells.get("stat"),
                       value=float(cells["value"]), measurement=None, skipped_reason=reason)


def _vocabulary_reason(errors: Sequence[Any], cells: Mapping[str, str]) -> str:
    """The first name the service does not know, in the words the report counts by
    (`unknown model slug`, `scenario not stated`, `metric not predicted`)."""
    columns = [str(error["loc"][0]) for error in errors]
    column = next(name for name in VOCABULARY_COLUMNS if name in columns)
    value = cells.get(column)
    if value is None:
        return f"{column} not stated"
    if column in ("model", "gpu"):
        # A Hugging Face repository id's message says which catalog slug it is, if any (`ModelSlug`).
        hint = next((str(error["msg"]).removeprefix("Value error, ") for error in errors
                     if error["loc"][0] == column and error["type"] == "value_error"), None)
        return f"unknown {'model' if column == 'model' else 'GPU'} slug {value!r}" + (f": {hint}" if hint else "")
    expected = next(((error.get("ctx") or {}).get("expected") for error in errors
                     if error["loc"][0] == column and error["type"] == "literal_error"), None)
    return f"{column} not predicted: {value!r}" + (f" (expected {expected})" if expected else "")
