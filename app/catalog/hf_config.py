"""Read a Hugging Face `config.json`, exactly as published, into `ModelSpec` keyword arguments.

Pure: no I/O, no framework. The input is whatever JSON a client sent; the output is either a
`NormalizedConfig` whose `fields` build a valid `ModelSpec`, or a `ConfigError` listing every
problem with a JSON pointer into the config. Nothing else is raised.

Where a config omits a field, the `transformers` configuration class of its `model_type` is the
authority on what the field is (that is how the published checkpoint is loaded). `FAMILIES` copies
those defaults, class by class (transformers 5.24, `models/<family>/configuration_<family>.py`),
under this service's field names (e.g. GPTJConfig's `n_positions` is listed as
`max_position_embeddings`). Every default that fills a gap is reported in `defaults_applied`.
A config of unknown `model_type` gets no library defaults: its missing essentials are errors, and
the assumptions left (untied embeddings, a gated MLP, no Q/K/V bias, one KV head per attention
head) are reported the same way.

Longer than 600 lines because it is mostly one table: the transformers defaults and field aliases of
each supported `model_type`, which a reader checks against the library side by side.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from app.sizing.model.recipes import RECIPES, declared_kv_cache, recipe_from_quantization_config
from app.sizing.specs import LAYER_CHUNKED, LAYER_FULL, LAYER_SLIDING, LAYER_TYPES, ModelSpec

# Integers above 2**53 are not exactly representable as floats, and products of a few of them
# would overflow float arithmetic downstream; no real model dimension comes near.
MAX_INTEGER = 2**53
# Guards the per-layer tuples (layer_types, moe_layers); published models have at most ~130 layers. The catalog's
# bound too (schemas.Layers), so a config is refused once, with the limit it is held to.
MAX_LAYERS = 1000

_TEXT_CONFIG = "text_config"
# Multimodal wrappers and the class their `text_config` is read with when it names no model_type.
_TEXT_MODEL_TYPE_OF_WRAPPER = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
# Falcon checkpoints that predate the transformers port (trust_remote_code "RW" classes).
_FALCON_CUSTOM_CODE_TYPES = ("RefinedWeb", "RefinedWebModel")
# Keys a multimodal config may state at the top level rather than in its text_config.
_TOP_LEVEL_FALLBACK = ("tie_word_embeddings", "dtype")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

# Names the same quantity goes by in published configs, the preferred (HF Llama-style) name first.
ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
                            "n_kv_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len",
                                "max_sequence_length", "seq_length"),
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_topk", "experts_per_token"),
    "attention_bias": ("attention_bias", "bias", "qkv_bias", "enable_bias"),
    "sliding_window": ("sliding_window", "sliding_window_size"),
    "dtype": ("torch_dtype", "dtype"),
}

# How a family lays out attention when the config lists no `layer_types` (see `_layer_types`).
LAYOUT_NONE = "none"                      # every layer global
LAYOUT_ALL_SLIDING = "all_sliding"        # every layer slides when a window is set (Mistral)
LAYOUT_ABOVE_MAX_WINDOW = "above_max_window"  # layers i >= max_window_layers slide (Qwen2, Qwen3)
LAYOUT_QWEN2_MOE = "qwen2_moe"            # even i < max_window_layers slide (Qwen2MoeConfig)
LAYOUT_ALTERNATING = "alternating"        # even i slide, odd i global (Gemma 2, gpt-oss)
LAYOUT_PATTERN = "pattern"                # every sliding_window_pattern-th layer global (Gemma 3)
LAYOUT_CHUNKED_ROPE = "chunked_rope"      # RoPE layers chunked, NoPE layers global (Llama 4)


@dataclass(frozen=True, slots=True)
class Family:
    """What a `model_type` implies beyond the keys its config.json states."""

    config_class: str                      # the transformers class `defaults` are copied from
    mlp_gated: bool                        # SwiGLU/GeGLU (3 matrices) vs plain up/down MLP
    layout: str = LAYOUT_NONE
    defaults: Mapping[str, object] = field(default_factory=dict)  # applied when the key is absent
    fixed: Mapping[str, object] = field(default_factory=dict)     # hard-coded by the modeling code
    dense_width_key: str = "intermediate_size"       # config key of the dense MLP width
    expert_width_key: str = "moe_intermediate_size"  # config key of the routed-expert width


_QWEN_WINDOW = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}
_DEEPSEEK_MLA = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                 "qk_nope_head_dim": 128, "v_head_dim": 128}
_FALCON_DEFAULTS = {
    "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "attention_bias": False,
    "multi_query": True, "new_decoder_architecture": False,
}

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", True, defaults={
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "attention_bias": False}),
    "mistral": Family("MistralConfig", True, LAYOUT_ALL_SLIDING, defaults={
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "sliding_window": 4096},
        fixed={"attention_bias": False}),
    "mixtral": Family("MixtralConfig", True, LAYOUT_ALL_SLIDING, defaults={
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "sliding_window": None, "num_experts": 8, "num_experts_per_tok": 2},
        fixed={"attention_bias": False}),
    "qwen2": Family("Qwen2Config", True, LAYOUT_ABOVE_MAX_WINDOW, defaults={
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, **_QWEN_WINDOW},
        fixed={"attention_bias": True}),  # Qwen2Attention: q/k/v_proj bias=True
    "qwen2_moe": Family("Qwen2MoeConfig", True, LAYOUT_QWEN2_MOE, defaults={
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, "attention_bias": True, **_QWEN_WINDOW, "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts_per_tok": 4, "num_experts": 60, "mlp_only_layers": []}),
    "qwen3": Family("Qwen3Config", True, LAYOUT_ABOVE_MAX_WINDOW, defaults={
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "attention_bias": False,
        **_QWEN_WINDOW}),
    "qwen3_moe": Family("Qwen3MoeConfig", True, LAYOUT_ALL_SLIDING, defaults={
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
        "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
        "sliding_window": 4096, "decoder_sparse_step": 1, "moe_intermediate_size": 768,
        "num_experts_per_tok": 8, "num_experts": 128, "mlp_only_layers": []}),
    "deepseek_v2": Family("DeepseekV2Config", True, defaults={
        "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "attention_bias": False, "first_k_dense_replace": 0, **_DEEPSEEK_MLA, "num_experts": 64,
        "n_shared_experts": 2, "moe_intermediate_size": 1407}),
    "deepseek_v3": Family("DeepseekV3Config", True, defaults={
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "n_shared_experts": 1, "num_experts": 256, **_DEEPSEEK_MLA,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "attention_bias": False}),
    "gemma": Family("GemmaConfig", True, defaults={
        "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
        "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False}),
    "gemma2": Family("Gemma2Config", True, LAYOUT_ALTERNATING, defaults={
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
        "sliding_window": 4096}),
    "gemma3_text": Family("Gemma3TextConfig", True, LAYOUT_PATTERN, defaults={
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "max_position_embeddings": 131072, "tie_word_embeddings": True, "attention_bias": False,
        "sliding_window": 4096, "sliding_window_pattern": 6}),
    "falcon": Family("FalconConfig", False, defaults=_FALCON_DEFAULTS),
    "gptj": Family("GPTJConfig", False, defaults={
        "vocab_size": 50400, "max_position_embeddings": 2048, "hidden_size": 4096,
        "num_hidden_layers": 28, "num_attention_heads": 16, "tie_word_embeddings": False},
        fixed={"attention_bias": False}),  # GPTJAttention: q/k/v_proj bias=False
    "opt": Family("OPTConfig", False, defaults={
        "vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 3072,
        "max_position_embeddings": 2048, "num_attention_heads": 12, "attention_bias": True,
        "tie_word_embeddings": True}),
    "gpt_oss": Family("GptOssConfig", True, LAYOUT_ALTERNATING, defaults={
        "num_hidden_layers": 36, "num_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
        "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
        "sliding_window": 128, "tie_word_embeddings": False, "max_position_embeddings": 131072,
        "num_experts_per_tok": 4, "attention_bias": True}),
    "llama4_text": Family("Llama4TextConfig", True, LAYOUT_CHUNKED_ROPE, defaults={
        "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "num_experts_per_tok": 1, "num_experts": 16,
        "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
        "attention_bias": False},
        # Llama4TextMoe always has one shared expert, as wide as a routed one.
        fixed={"n_shared_experts": 1},
        dense_width_key="intermediate_size_mlp", expert_width_key="intermediate_size"),
    "phi3": Family("Phi3Config", True, LAYOUT_ALL_SLIDING, defaults={
        "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "sliding_window": None},
        fixed={"attention_bias": False}),  # Phi3Attention: qkv_proj bias=False
    "gpt_neox": Family("GPTNeoXConfig", False, defaults={
        "vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
        "intermediate_size": 24576, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "attention_bias": True}),
    "gpt2": Family("GPT2Config", False, defaults={
        "vocab_size": 50257, "max_position_embeddings": 1024, "hidden_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 12, "tie_word_embeddings": True},
        fixed={"attention_bias": True}),  # GPT2Attention: c_attn Conv1D has a bias
    "bloom": Family("BloomConfig", False, defaults={
        "vocab_size": 250880, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
        "tie_word_embeddings": True},
        fixed={"attention_bias": True}),  # BloomAttention: query_key_value bias=True
}

_MISSING = object()  # absent from the config (or null where null means absent), and no default
_INVALID = object()  # present but unusable; the problem is already recorded
_REJECT = object()   # `null` argument of _Reader.get: a JSON null is a wrong-type value


@dataclass(frozen=True)
class NormalizedConfig:
    fields: dict[str, object]          # ModelSpec keyword arguments (HF names), ready for ModelSpec(**fields)
    defaults_applied: tuple[str, ...]  # human-readable "field = value (reason/source)" lines
    notes: tuple[str, ...]             # other observations (e.g. "num_kv_heads 71 ignored: multi_query")
    # Where the config states each field it states (a JSON pointer into it: "/num_local_experts" for num_experts),
    # so a later problem with a field's value names the key the client sent.
    pointers: Mapping[str, str] = field(default_factory=dict)


class ConfigError(ValueError):
    """The config cannot describe a model; `problems` holds (JSON pointer, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = list(dict.fromkeys(problems))  # one entry per problem, in reading order
        super().__init__("; ".join(f"{pointer or '(root)'}: {message}" for pointer, message in self.problems))


def named_field(message: str, names: Iterable[str]) -> str | None:
    """The first of `names` a spec's error message names (its messages name the offending field first), or None."""
    known = set(names)
    return next((word for word in re.split(r"[\s,.:;()]+", message) if word in known), None)


def normalize_hf_config(raw: object) -> NormalizedConfig:
    """Turn a parsed config.json into ModelSpec keyword arguments, or raise ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError([("", f"expected a JSON object (the contents of config.json), got {_describe(raw)}")])
    reader = _section_reader(raw)
    fields = _read_fields(reader)
    try:
        ModelSpec(**fields)
    except ValueError as exc:  # an invariant the reader did not anticipate: still the client's input
        named = named_field(str(exc), fields)  # at the key the config states it under, where it does
        raise ConfigError([(reader.located.get(named, f"/{named}") if named else "", str(exc))]) from None
    return NormalizedConfig(fields, tuple(dict.fromkeys(reader.defaults_applied)),
                            tuple(dict.fromkeys(reader.notes)), dict(reader.located))


# Reading values -----------------------------------------------------------------------------


class _Invalid(Exception):
    """A value of the wrong type or range; `suffix` points below the key (a list index)."""

    def __init__(self, message: str, suffix: str = "") -> None:
        super().__init__(message)
        self.suffix = suffix


def _describe(value: object) -> str:
    """A short rendering of a bad value (containers by kind only: they may be huge or deep)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = json.dumps(value) if isinstance(value, (bool, int, float, str)) or value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(minimum: int, maximum: int = MAX_INTEGER) -> Callable[[object], int]:
    def parse(value: object) -> int:
        # JSON has one number type: 4096.0 is 4096. Booleans are not numbers here.
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer, got {_describe(value)}")
        if not minimum <= value <= maximum:
            raise _Invalid(f"must be between {minimum} and {maximum}, got {_describe(value)}")
        return value
    return parse


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_describe(value)}")
    return value


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_describe(value)}")
    return value


def _list_of(item: Callable[[object], object]) -> Callable[[object], list[object]]:
    def parse(value: object) -> list[object]:
        if not isinstance(value, list):
            raise _Invalid(f"expected a list, got {_describe(value)}")
        parsed = []
        for index, element in enumerate(value):
            try:
                parsed.append(item(element))
            except _Invalid as exc:
                raise _Invalid(str(exc), f"/{index}") from None
        return parsed
    return parse


_POSITIVE = _integer(1)
_COUNT = _integer(0)
_LAYERS = _integer(1, MAX_LAYERS)


class _Reader:
    """Reads one config section (the top level, or text_config) under one family's defaults."""

    def __init__(self, top: dict, section: dict, prefix: str, model_type: str | None,
                 family: Family | None) -> None:
        self.top, self.section, self.prefix = top, section, prefix
        self.model_type, self.family = model_type, family
        self.problems: list[tuple[str, str]] = []
        self.defaults_applied: list[str] = []
        self.notes: list[str] = []
        self.located: dict[str, str] = {}  # key -> the pointer of the alias the config states it under

    @property
    def source(self) -> str:
        return self.family.config_class if self.family else "model_type unknown"

    def pointer(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def find(self, key: str) -> tuple[str, object] | None:
        """(pointer, raw value) of the first alias of `key` the config states; flags disagreeing aliases."""
        names = ALIASES.get(key, (key,))
        present = [(self.pointer(name), self.section[name]) for name in names if name in self.section]
        if not present and self.prefix and key in _TOP_LEVEL_FALLBACK:
            present = [(f"/{name}", self.top[name]) for name in names if name in self.top]
        stated = [(pointer, value) for pointer, value in present if value is not None]
        for pointer, value in stated[1:]:
            if value != stated[0][1]:
                self.problems.append((pointer, f"conflicts with {stated[0][0]} ({_describe(stated[0][1])})"))
        found = (stated or present or [None])[0]
        if found is not None:
            self.located[key] = found[0]
        return found

    def get(self, key: str, parse: Callable[[object], object], *, null: object = _REJECT) -> object:
        """The config's value for `key`, else the family default (reported), else _MISSING.

        A JSON null is a wrong-type value unless the field gives null a meaning: `null=_MISSING`
        reads it like an absent key (transformers' Optional fields, whose None it derives, as
        num_key_value_heads or n_inner), any other `null` is what it stands for (sliding_window:
        null is no window, whatever the class default). _INVALID marks a recorded problem.
        """
        found = self.find(key)
        if found is None:
            return self.default(key)
        pointer, value = found
        if value is None and null is not _REJECT:
            return self.default(key) if null is _MISSING else null
        try:
            return parse(value)
        except _Invalid as exc:
            self.problems.append((pointer + exc.suffix, str(exc)))
            return _INVALID

    def default(self, key: str) -> object:
        if self.family is None or key not in self.family.defaults:
            return _MISSING
        value = self.family.defaults[key]
        self.applied(key, value, f"{self.family.config_class} default; not in the config")
        return value

    def require(self, key: str, parse: Callable[[object], object], *, null: object = _REJECT) -> object:
        value = self.get(key, parse, null=null)
        if value is _MISSING:
            return self.missing(key)
        return value

    def missing(self, key: str) -> object:
        self.problems.append((self.pointer(key), "missing"))
        return _INVALID

    def applied(self, key: str, value: object, reason: str) -> None:
        self.defaults_applied.append(f"{key} = {json.dumps(value)} ({reason})")


def _invalid(*values: object) -> bool:
    return any(value is _INVALID for value in values)


def _section_reader(top: dict) -> _Reader:
    """Pick the section that describes the language model and the family it is read with."""
    model_type = _model_type(top, "/model_type")
    if _TEXT_CONFIG in top and top[_TEXT_CONFIG] is not None:
        section = top[_TEXT_CONFIG]
        if not isinstance(section, dict):
            raise ConfigError([(f"/{_TEXT_CONFIG}", f"expected an object, got {_describe(section)}")])
        text_type = _model_type(section, f"/{_TEXT_CONFIG}/model_type")
        if text_type is None and model_type is not None:
            text_type = _TEXT_MODEL_TYPE_OF_WRAPPER.get(model_type)
        return _make_reader(top, section, f"/{_TEXT_CONFIG}", text_type)
    if model_type in _TEXT_MODEL_TYPE_OF_WRAPPER:
        message = f"missing: a {model_type} config describes its language model under text_config"
        raise ConfigError([(f"/{_TEXT_CONFIG}", message)])
    return _make_reader(top, top, "", model_type)


def _model_type(section: dict, pointer: str) -> str | None:
    value = section.get("model_type")
    if value is not None and not isinstance(value, str):
        raise ConfigError([(pointer, f"expected a string, got {_describe(value)}")])
    return value


def _make_reader(top: dict, section: dict, prefix: str, model_type: str | None) -> _Reader:
    family_name = "falcon" if model_type in _FALCON_CUSTOM_CODE_TYPES else model_type
    family = FAMILIES.get(family_name) if family_name is not None else None
    reader = _Reader(top, section, prefix, model_type, family)
    if family is None:
        described = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        reader.notes.append(f"{described}: not a known family, so no library defaults apply")
    elif model_type in _FALCON_CUSTOM_CODE_TYPES:
        reader.notes.append(f"model_type {model_type!r} (custom-code Falcon) read as falcon, as transformers' "
                            "convert_custom_code_checkpoint.py does")
    return reader


# Assembling ModelSpec fields ----------------------------------------------------------------


def _read_fields(r: _Reader) -> dict[str, object]:
    layers = r.require("num_hidden_layers", _LAYERS)
    hidden = r.require("hidden_size", _POSITIVE)
    heads = r.require("num_attention_heads", _POSITIVE)
    fields: dict[str, object] = {
        "name": _name(r),
        "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "vocab_size": r.require("vocab_size", _POSITIVE),
        "tie_word_embeddings": _tie_word_embeddings(r),
        "max_position_embeddings": _max_position_embeddings(r),
        "attention_bias": _attention_bias(r),
        "dtype": _dtype(r),
        "mlp_gated": _mlp_gated(r),
    }
    fields.update(_mla(r))
    is_mla = isinstance(fields["kv_lora_rank"], int)
    if not _invalid(heads):
        fields["num_key_value_heads"] = _key_value_heads(r, heads, is_mla=is_mla)
    if not _invalid(hidden, heads):
        fields["head_dim"] = _head_dim(r, hidden, heads, is_mla=is_mla)
    if not _invalid(layers):
        fields.update(_moe(r, layers))
        fields.update(_attention_layout(r, layers))
    fields["intermediate_size"] = _dense_width(r, hidden, fields)
    _quantization_note(r, str(fields["dtype"]))
    if not r.problems:
        _check_kv_grouping(r, fields)
    if r.problems:
        raise ConfigError(r.problems)
    return fields


def _name(r: _Reader) -> str:
    name = r.top.get("_name_or_path")
    if name is not None and not isinstance(name, str):
        r.problems.append(("/_name_or_path", f"expected a string, got {_describe(name)}"))
        return ""
    if name:
        r.located["name"] = "/_name_or_path"  # where a problem with the catalog's name points
    return name or ""


def _tie_word_embeddings(r: _Reader) -> object:
    tie = r.get("tie_word_embeddings", _boolean)
    if tie is _MISSING:
        # Untied counts a separate output matrix: the larger, safer reading of an unknown model.
        r.applied("tie_word_embeddings", False, "not in the config and model_type unknown: untied assumed")
        return False
    return tie


def _max_position_embeddings(r: _Reader) -> object:
    value = r.get("max_position_embeddings", _POSITIVE, null=_MISSING)
    if value is _MISSING:
        fallback = ModelSpec.__dataclass_fields__["max_position_embeddings"].default
        r.applied("max_position_embeddings", fallback,
                  f"not in the config and {r.source} has no default: the service default")
        return fallback
    return value


def _attention_bias(r: _Reader) -> object:
    if r.family is not None and "attention_bias" in r.family.fixed:
        fixed = r.family.fixed["attention_bias"]
        stated = r.find("attention_bias")
        if stated is not None and stated[1] is not None and stated[1] != fixed:
            r.notes.append(f"{stated[0][1:]} ignored: {r.family.config_class}'s attention projections "
                           f"always have attention_bias = {json.dumps(fixed)}")
        return fixed
    bias = r.get("attention_bias", _boolean)
    if bias is _MISSING:
        r.applied("attention_bias", False, "not in the config and model_type unknown: no Q/K/V bias assumed")
        return False
    return bias


def _dtype(r: _Reader) -> str:
    stated = r.get("dtype", _string, null=_MISSING)
    if isinstance(stated, str) and stated in _DTYPES:
        return _DTYPES[stated]
    if isinstance(stated, str):
        r.notes.append(f"torch_dtype {stated!r} is not bfloat16, float16 or float32: ignored")
    fallback = ModelSpec.__dataclass_fields__["dtype"].default
    if stated is not _INVALID:
        r.applied("dtype", fallback, "no usable torch_dtype in the config: the service default")
    return fallback


def _mlp_gated(r: _Reader) -> bool:
    if r.family is not None:
        return r.family.mlp_gated
    r.applied("mlp_gated", True, "model_type unknown: a gated (SwiGLU-style) MLP assumed")
    return True


def _mla(r: _Reader) -> dict[str, object]:
    """Multi-head latent attention (DeepSeek-V2/V3): on when kv_lora_rank is set."""
    rank = r.get("kv_lora_rank", _POSITIVE, null=None)
    if not isinstance(rank, int):
        return {"kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None,
                "qk_nope_head_dim": None, "v_head_dim": None}
    q_rank = r.get("q_lora_rank", _POSITIVE, null=None)  # null: queries are not compressed (V2-Lite)
    return {
        "kv_lora_rank": rank,
        "q_lora_rank": None if q_rank is _MISSING else q_rank,
        "qk_rope_head_dim": r.require("qk_rope_head_dim", _POSITIVE),
        "qk_nope_head_dim": r.require("qk_nope_head_dim", _POSITIVE),
        "v_head_dim": r.require("v_head_dim", _POSITIVE),
    }


def _is_falcon(r: _Reader) -> bool:
    return r.family is FAMILIES["falcon"]


def _key_value_heads(r: _Reader, heads: int, *, is_mla: bool) -> object:
    if _is_falcon(r):
        return _falcon_key_value_heads(r, heads)
    kv = r.get("num_key_value_heads", _POSITIVE, null=_MISSING)
    if kv is _MISSING:
        owner = r.family.config_class if r.family else "transformers"
        r.applied("num_key_value_heads", heads,
                  f"not in the config: one KV head per attention head, as {owner} does")
        kv = heads
    if is_mla and isinstance(kv, int):
        r.notes.append(f"num_key_value_heads {kv} does not size the KV cache: MLA caches one latent "
                       "(kv_lora_rank + qk_rope_head_dim) per token per layer")
    return kv


def _falcon_key_value_heads(r: _Reader, heads: int) -> object:
    """FalconAttention: the new decoder architecture groups KV heads; the old one is MQA or MHA."""
    if r.model_type in _FALCON_CUSTOM_CODE_TYPES:
        # The conversion script sets new_decoder_architecture exactly when n_head_kv is present.
        new_architecture: object = "n_head_kv" in r.section
    else:
        new_architecture = r.get("new_decoder_architecture", _boolean, null=False)
    stated = r.get("num_key_value_heads", _POSITIVE, null=_MISSING)
    if _invalid(new_architecture, stated):
        return _INVALID
    if new_architecture:
        multi_query = r.find("multi_query")
        if multi_query is not None and multi_query[1] is True:
            r.notes.append("multi_query ignored: with new_decoder_architecture Falcon groups KV heads "
                           "by num_kv_heads")
        if stated is _MISSING:
            r.applied("num_key_value_heads", heads,
                      "not in the config: FalconConfig sets num_kv_heads = num_attention_heads")
            return heads
        return stated
    multi_query = r.get("multi_query", _boolean, null=False)
    if _invalid(multi_query):
        return _INVALID
    kv = 1 if multi_query else heads
    if isinstance(stated, int) and stated != kv:
        reason = ("multi_query without new_decoder_architecture" if multi_query
                  else "neither multi_query nor new_decoder_architecture")
        r.notes.append(f"num_kv_heads {stated} ignored: {reason} means {kv} KV head{'s' if kv > 1 else ''}")
    return kv


def _head_dim(r: _Reader, hidden: int, heads: int, *, is_mla: bool) -> object:
    if is_mla:
        r.notes.append("head_dim not used: MLA heads are qk_nope_head_dim + qk_rope_head_dim wide "
                       "(queries, keys) and v_head_dim wide (values)")
        return None
    # FalconConfig has no head_dim field: it always derives it.
    head_dim = _MISSING if _is_falcon(r) else r.get("head_dim", _POSITIVE, null=_MISSING)
    if head_dim is not _MISSING:
        return head_dim
    if hidden < heads:
        r.problems.append((r.pointer("num_attention_heads"),
                           f"{heads} heads leave no width per head in hidden_size {hidden}"))
        return _INVALID
    rounded = "" if hidden % heads == 0 else " (rounded down, as transformers does)"
    r.notes.append(f"head_dim derived: hidden_size / num_attention_heads = {hidden} / {heads} = "
                   f"{hidden // heads}{rounded}")
    return hidden // heads


def _dense_width(r: _Reader, hidden: object, fields: dict[str, object]) -> object:
    """The dense MLP width; plain (ungated) families default it to 4 * hidden_size."""
    key = r.family.dense_width_key if r.family else "intermediate_size"
    width = r.get(key, _POSITIVE, null=_MISSING)
    if width is not _MISSING:
        return width
    if r.family is not None and not r.family.mlp_gated:
        if not isinstance(hidden, int):
            return _INVALID  # hidden_size's own problem is already recorded
        r.applied("intermediate_size", 4 * hidden,
                  f"not in the config: {r.family.config_class} uses 4 * hidden_size")
        return 4 * hidden
    moe_layers = fields.get("moe_layers")
    every_layer_moe = isinstance(moe_layers, tuple) and len(moe_layers) == fields.get("num_hidden_layers")
    if every_layer_moe and isinstance(fields.get("moe_intermediate_size"), int):
        return None  # no dense MLP anywhere, and the experts state their own width
    return r.missing(key)


def _moe(r: _Reader, layers: int) -> dict[str, object]:
    dense = {"num_experts": 0, "num_experts_per_tok": 0, "n_shared_experts": 0,
             "moe_intermediate_size": None, "shared_expert_intermediate_size": None,
             "first_k_dense_replace": 0, "moe_layers": None}
    experts = r.get("num_experts", _COUNT, null=0)
    if not isinstance(experts, int) or experts == 0:
        return {**dense, "num_experts": experts} if experts is _INVALID else dense
    per_token = r.require("num_experts_per_tok", _POSITIVE, null=_MISSING)
    if isinstance(per_token, int) and per_token > experts:
        stated = r.find("num_experts_per_tok")
        r.problems.append((stated[0] if stated else r.pointer("num_experts_per_tok"),
                           f"must be at most the {experts} routed experts"))
    expert_key = r.family.expert_width_key if r.family else "moe_intermediate_size"
    expert_width = r.get(expert_key, _POSITIVE, null=_MISSING)
    shared_width = r.get("shared_expert_intermediate_size", _COUNT, null=_MISSING)
    if r.family is not None and "n_shared_experts" in r.family.fixed:
        shared = r.family.fixed["n_shared_experts"]
    else:
        shared = r.get("n_shared_experts", _COUNT, null=0)
        if shared is _MISSING:
            # Qwen2-MoE states no count: one shared expert whenever it states a shared width.
            shared = 1 if isinstance(shared_width, int) and shared_width > 0 else 0
    first_dense = r.get("first_k_dense_replace", _COUNT, null=0)
    return {
        "num_experts": experts,
        "num_experts_per_tok": per_token,
        "n_shared_experts": shared,
        "moe_intermediate_size": None if expert_width is _MISSING else expert_width,
        "shared_expert_intermediate_size": shared_width if isinstance(shared_width, int) and shared else None,
        "first_k_dense_replace": 0 if first_dense is _MISSING else first_dense,
        "moe_layers": _moe_layers(r, layers, first_dense),
    }


def _moe_layers(r: _Reader, layers: int, first_dense: object) -> object:
    """Indices of MoE layers. Each family states its pattern with its own keys; absent keys are neutral.

    DeepSeek: i >= first_k_dense_replace (and i % moe_layer_freq == 0 in its remote code).
    Qwen MoE: (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers.
    Llama 4:  range(interleave_moe_layer_step - 1, L, step), i.e. (i + 1) % step == 0, or moe_layers.
    """
    explicit = r.get("moe_layers", _list_of(_integer(0, layers - 1)), null=None)
    if isinstance(explicit, list):
        return tuple(sorted(set(explicit)))
    steps = [r.get(key, _POSITIVE) for key in ("decoder_sparse_step", "interleave_moe_layer_step",
                                               "moe_layer_freq")]
    dense_only = r.get("mlp_only_layers", _list_of(_COUNT), null=[])
    if _invalid(explicit, first_dense, dense_only, *steps):
        return _INVALID
    sparse_step, interleave, frequency = (step if isinstance(step, int) else 1 for step in steps)
    first = first_dense if isinstance(first_dense, int) else 0
    dense_set = set(dense_only) if isinstance(dense_only, list) else set()
    return tuple(i for i in range(layers)
                 if i >= first and i % frequency == 0 and (i + 1) % sparse_step == 0
                 and (i + 1) % interleave == 0 and i not in dense_set)


def _attention_layout(r: _Reader, layers: int) -> dict[str, object]:
    types = _layer_types(r, layers)
    if not isinstance(types, tuple):
        return {"layer_types": _INVALID, "sliding_window": None, "attention_chunk_size": None}
    window: object = None
    chunk: object = None
    if LAYER_SLIDING in types:
        window = r.get("sliding_window", _POSITIVE, null=None)
        if window is None or window is _MISSING:
            window = r.missing("sliding_window")  # sliding_attention layers need a window
    if LAYER_CHUNKED in types:
        chunk = r.get("attention_chunk_size", _POSITIVE, null=None)
        if chunk is None or chunk is _MISSING:
            chunk = r.missing("attention_chunk_size")  # chunked_attention layers need a chunk size
    all_full = all(kind == LAYER_FULL for kind in types)
    return {"layer_types": None if all_full else types, "sliding_window": window,
            "attention_chunk_size": chunk}


def _layer_types(r: _Reader, layers: int) -> object:
    """Each layer's attention kind: the config's own list, else its family's rule."""
    explicit = r.get("layer_types", _list_of(_string), null=None)
    if explicit is _INVALID:
        return _INVALID
    if isinstance(explicit, list):
        if len(explicit) != layers:
            r.problems.append((r.pointer("layer_types"), f"has {len(explicit)} entries for {layers} layers"))
            return _INVALID
        unknown = [(i, kind) for i, kind in enumerate(explicit) if kind not in LAYER_TYPES]
        for i, kind in unknown:
            r.problems.append((f"{r.pointer('layer_types')}/{i}",
                               f"{_describe(kind)} is not one of {', '.join(LAYER_TYPES)}"))
        return _INVALID if unknown else tuple(explicit)
    layout = r.family.layout if r.family else LAYOUT_NONE
    if layout == LAYOUT_CHUNKED_ROPE:
        return _llama4_layer_types(r, layers)
    if layout in (LAYOUT_ALTERNATING, LAYOUT_PATTERN):
        period = 2 if layout == LAYOUT_ALTERNATING else r.get("sliding_window_pattern", _POSITIVE)
        if not isinstance(period, int):
            return period if period is _INVALID else r.missing("sliding_window_pattern")
        # transformers: "sliding_attention" if (i + 1) % period else "full_attention"
        return tuple(LAYER_SLIDING if (i + 1) % period else LAYER_FULL for i in range(layers))
    window = _window_in_use(r, layout)
    if window is _INVALID:
        return _INVALID
    if window is None:
        return (LAYER_FULL,) * layers
    if layout == LAYOUT_ALL_SLIDING:
        return (LAYER_SLIDING,) * layers
    max_window_layers = r.get("max_window_layers", _COUNT)
    if not isinstance(max_window_layers, int):
        return max_window_layers if max_window_layers is _INVALID else r.missing("max_window_layers")
    if layout == LAYOUT_ABOVE_MAX_WINDOW:
        return tuple(LAYER_SLIDING if i >= max_window_layers else LAYER_FULL for i in range(layers))
    return tuple(LAYER_SLIDING if (i + 1) % 2 and i < max_window_layers else LAYER_FULL  # LAYOUT_QWEN2_MOE
                 for i in range(layers))


def _window_in_use(r: _Reader, layout: str) -> object:
    """The window a family applies to every eligible layer, None when off; says why one is ignored."""
    window = r.get("sliding_window", _COUNT, null=None)
    if window is _INVALID:
        return _INVALID
    if not isinstance(window, int) or window == 0:  # absent, null, or 0 (Qwen2MoeConfig's "off")
        return None
    if layout == LAYOUT_NONE:
        if r.family is not None:
            r.notes.append(f"sliding_window {window} ignored: {r.family.config_class} has no "
                           "sliding-window attention")
        else:
            r.notes.append(f"sliding_window {window} not applied: model_type unknown, so which layers "
                           "slide is not known; all layers are counted as full attention")
        return None
    use = r.get("use_sliding_window", _boolean)
    if use is _INVALID:
        return _INVALID
    if use is False:
        r.notes.append(f"sliding_window {window} ignored: use_sliding_window is false")
        return None
    return window


def _llama4_layer_types(r: _Reader, layers: int) -> object:
    """Llama4TextConfig: no_rope_layers[i] == 1 marks a RoPE layer, chunked when attention_chunk_size
    is set; NoPE layers (every no_rope_layer_interval-th by default) attend globally."""
    rope_flags = r.get("no_rope_layers", _list_of(_integer(0, 1)), null=None)
    if rope_flags is _INVALID:
        return _INVALID
    if not isinstance(rope_flags, list) or not rope_flags:  # absent, null or [] (as Maverick ships it)
        interval = r.get("no_rope_layer_interval", _POSITIVE)
        if not isinstance(interval, int):
            return interval if interval is _INVALID else r.missing("no_rope_layer_interval")
        rope_flags = [int((i + 1) % interval != 0) for i in range(layers)]
    elif len(rope_flags) != layers:
        r.problems.append((r.pointer("no_rope_layers"), f"has {len(rope_flags)} entries for {layers} layers"))
        return _INVALID
    chunk = r.get("attention_chunk_size", _POSITIVE, null=None)
    if chunk is _INVALID:
        return _INVALID
    chunked = isinstance(chunk, int)
    return tuple(LAYER_CHUNKED if flag and chunked else LAYER_FULL for flag in rope_flags)


def _quantization_note(r: _Reader, dtype: str) -> None:
    """Which shipped recipe sizes the checkpoint's quantized weights, and, for a recipe that stands for a
    declared KV-cache format (ModelOpt's: FP8), whether this checkpoint declares that one (`dtype`: the
    model's, which every engine caches K and V in when it declares none)."""
    quantization = r.top.get("quantization_config")
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if isinstance(method, str):
        assert isinstance(quantization, dict)
        recipe, read = recipe_from_quantization_config(quantization)
        advice = (f"size it with weight_recipe {recipe!r}" if recipe is not None
                  else "no shipped weight_recipe matches: choose the weight precision when sizing")
        expected = RECIPES[recipe].checkpoint_kv_dtype if recipe is not None else None
        if expected is not None:
            declared = declared_kv_cache(quantization)
            if declared is None:
                advice += (f" and kv_dtype {dtype!r}: it declares no KV-cache quantization (kv_cache_quant_algo "
                           f"null or absent), so every engine caches K and V in {dtype}, while {recipe!r} stands "
                           f"for exports that declare {expected}")
            elif declared == expected:
                read += f", KV cache declared {declared}"
            else:
                advice += (f": it declares its KV cache in {declared}, which the service does not size; "
                           f"{recipe!r} counts {expected}")
        r.notes.append(f"weights ship quantized (quantization_config {read}); dtype is the unquantized "
                       f"torch_dtype; {advice}")
    else:
        r.notes.append("quantization_config present without a quant_method: ignored")


def _check_kv_grouping(r: _Reader, fields: dict[str, object]) -> None:
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    assert isinstance(heads, int) and isinstance(kv, int)  # both read without problems
    if fields["kv_lora_rank"] is None and heads % kv:
        stated = r.find("num_key_value_heads")
        r.problems.append((stated[0] if stated else r.pointer("num_key_value_heads"),
                           f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})"))
