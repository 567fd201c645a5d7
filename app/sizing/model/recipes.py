"""Weight storage formats and the quantization recipes of published checkpoints (ENGINES.md section 4).

A model's weights are parameter groups (`GROUPS`); a recipe gives each group a storage format. Quantized
checkpoints do not quantize every linear layer: gpt-oss keeps attention, router and embeddings in bf16
and only its experts in MXFP4; Meta's Llama-3.1-405B FP8 keeps attention and the first and last
layers' MLPs in bf16. A plain weight dtype is the recipe `uniform_recipe(dtype)`: every linear matrix
of the decoder layers in that dtype, the rest in bf16 (or all of it in the dtype when it is 16/32-bit).

Bits per value include the format's scales (exact binary fractions, so byte counts are exact):
- fp8 per-tensor and int8 per-channel: 8 (one FP32 scale per tensor or output row: under 0.05% for
  matrices with >= 2048 inputs, not counted);
- fp8 block (DeepSeek-V3, CT FP8_BLOCK): E4M3 + one FP32 scale per 128x128 block = 8 + 32/16384;
- int4 symmetric, group 128 (ModelOpt int4_awq, CT W4A16; also w4afp8): 4 + 16/128 = 4.125;
- int4 AWQ/GPTQ checkpoints: fp16 scale + packed 4-bit zero per group of 128 = 4 + 20/128 = 4.15625
  (GPTQ's int32 `g_idx` per input row, 32/N_out bits, under 0.2% for N_out >= 4096, not counted);
- MXFP4 (OCP MX): E2M1 + one E8M0 byte per 32 = 4.25;
- NVFP4: E2M1 + one FP8 E4M3 scale per 16 = 4.5 (+ one FP32 per tensor, not counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cache

ATTENTION = "attention"  # Q/K/V/O projections (MLA: q path, kv down and up projections)
DENSE_MLP = "dense_mlp"  # MLP of dense layers
EXPERTS = "experts"  # routed experts of MoE layers
SHARED_EXPERTS = "shared_experts"
ROUTER = "router"
EMBEDDING = "embedding"
LM_HEAD = "lm_head"
NORMS_AND_BIASES = "norms_and_biases"  # norm vectors and projection biases: always 16-bit or wider
GROUPS = (ATTENTION, DENSE_MLP, EXPERTS, SHARED_EXPERTS, ROUTER, EMBEDDING, LM_HEAD, NORMS_AND_BIASES)
LINEAR_GROUPS = (ATTENTION, DENSE_MLP, EXPERTS, SHARED_EXPERTS)  # what a plain weight dtype covers


@dataclass(frozen=True, slots=True)
class WeightFormat:
    name: str
    bits: Fraction  # per stored value, scales included
    dtype: str  # the compute-facing dtype family (`specs.WEIGHT_DTYPES` + fp32)
    description: str
    source: str
    # Side of the square blocks that share one scale (0: none). A checkpoint in such a format can be split
    # over ranks only on block boundaries (`Engine.layout_problems` with its recipe).
    tile: int = 0


_FORMATS = (
    WeightFormat("fp32", Fraction(32), "fp32", "32-bit float", "IEEE 754"),
    WeightFormat("bf16", Fraction(16), "bf16", "bfloat16", "IEEE 754 / bfloat16"),
    WeightFormat("fp16", Fraction(16), "fp16", "float16", "IEEE 754"),
    WeightFormat("fp8", Fraction(8), "fp8", "FP8 E4M3, per-tensor or per-channel scale",
                 "ModelOpt 0.47 numerics/fp8.yaml; compressed-tensors 0.20.1 FP8 / FP8_DYNAMIC"),
    WeightFormat("fp8_block", Fraction(8) + Fraction(32, 128 * 128), "fp8",
                 "FP8 E4M3 with one FP32 scale per 128x128 block",
                 "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md @9b4e9788 (weight_block_size [128, 128])", tile=128),
    WeightFormat("int8", Fraction(8), "int8", "INT8, per-channel scale (W8A8)",
                 "compressed-tensors 0.20.1 W8A8"),
    WeightFormat("int4", Fraction(4) + Fraction(16, 128), "int4",
                 "INT4 symmetric, one 16-bit scale per 128 values",
                 "ModelOpt 0.47 numerics/int4_per_block.yaml; compressed-tensors 0.20.1 W4A16"),
    WeightFormat("int4_awq", Fraction(4) + Fraction(16 + 4, 128), "int4",
                 "INT4 asymmetric, one fp16 scale and one packed 4-bit zero per 128 values (AWQ/GPTQ)",
                 "vLLM 0.19.0 quantization/awq.py, gptq.py (qzeros + scales per group)"),
    WeightFormat("w4afp8", Fraction(4) + Fraction(16, 128), "int4",
                 "INT4 weights, group 128, symmetric, with FP8 activations",
                 "compressed-tensors 0.20.1 W4AFP8; ModelOpt 0.47 w4a8_awq_beta"),
    WeightFormat("mxfp4", Fraction(4) + Fraction(8, 32), "fp4", "MXFP4: E2M1 + one E8M0 scale per 32",
                 "vLLM 0.19.0 quantization/mxfp4.py (mxfp4_block = 32); ModelOpt 0.47 numerics/mxfp4.yaml"),
    WeightFormat("nvfp4", Fraction(4) + Fraction(8, 16), "fp4",
                 "NVFP4: E2M1 + one FP8 E4M3 scale per 16 (+ FP32 per tensor)",
                 "ModelOpt 0.47 numerics/nvfp4.yaml (effective_bits 4.5); compressed-tensors 0.20.1 NVFP4"),
)
FORMATS: dict[str, WeightFormat] = {f.name: f for f in _FORMATS}

# The format a plain weight dtype stores its linear matrices in. `fp4` is MXFP4, the format the
# service quoted for fp4 before recipes existed; NVFP4 checkpoints are named by their recipe.
_DTYPE_FORMATS = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8",
                  "int4": "int4", "fp4": "mxfp4"}
SIXTEEN_BIT_OR_WIDER = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, slots=True)
class WeightRecipe:
    """Which storage format each parameter group of a checkpoint uses.

    `edge_mlp_format`: the format of the first and the last decoder layer's dense MLP when it differs
    from `dense_mlp` (Meta's FP8 405B keeps them in bf16). `checkpoint_kv_dtype`: the KV-cache dtype the
    checkpoint declares (ModelOpt's `kv_cache_quant_algo`), which some engines adopt by default.
    """

    name: str
    formats: tuple[tuple[str, str], ...]  # (group, format) for every group in GROUPS
    description: str
    source: str
    edge_mlp_format: str | None = None
    checkpoint_kv_dtype: str | None = None
    producer: str = ""  # "modelopt" for NVIDIA ModelOpt exports: the KV default rules key on it

    def __post_init__(self) -> None:
        groups = [group for group, _ in self.formats]
        if sorted(groups) != sorted(GROUPS):
            raise ValueError(f"a recipe names every group once: {list(GROUPS)}")
        for fmt in [f for _, f in self.formats] + ([self.edge_mlp_format] if self.edge_mlp_format else []):
            if fmt not in FORMATS:
                raise ValueError(f"unknown weight format {fmt!r}; expected one of {sorted(FORMATS)}")

    def format_of(self, group: str, layer_index: int | None = None, num_layers: int | None = None) -> str:
        """The format of `group`; for `dense_mlp`, of that layer's MLP when the recipe treats edges apart."""
        if (group == DENSE_MLP and self.edge_mlp_format is not None and layer_index is not None
                and layer_index in (0, (num_layers or 0) - 1)):
            return self.edge_mlp_format
        return dict(self.formats)[group]

    @property
    def dtype(self) -> str:
        """The dtype family of the recipe's narrowest linear format, for the step-time model's weight
        reads and the default compute precision (the bulk of a quantized checkpoint's bytes)."""
        linear = [FORMATS[self.format_of(g)] for g in LINEAR_GROUPS]
        return min(linear, key=lambda f: f.bits).dtype


@cache  # a handful of dtypes; the recipe is immutable
def uniform_recipe(dtype: str) -> WeightRecipe:
    """A plain weight dtype: the decoder layers' linear matrices in `dtype`; the embedding, LM head,
    routers, norms and biases in bf16 (in `dtype` itself when it is 16-bit or wider)."""
    try:
        linear = _DTYPE_FORMATS[dtype]
    except KeyError:
        raise ValueError(f"unknown weight dtype {dtype!r}; expected one of {list(_DTYPE_FORMATS)}") from None
    rest = dtype if dtype in SIXTEEN_BIT_OR_WIDER else "bf16"
    stored = FORMATS[linear]  # a quantized dtype's storage: its scales, and which fp4 (`_DTYPE_FORMATS`)
    stored_as = "" if dtype in SIXTEEN_BIT_OR_WIDER else f" ({stored.description}: {float(stored.bits):g} bits a value)"
    return WeightRecipe(
        name=dtype,
        formats=tuple((g, linear if g in LINEAR_GROUPS else rest) for g in GROUPS),
        description=f"every linear matrix of the decoder layers in {dtype}{stored_as}; embedding, LM head, routers, "
                    f"norms and biases in {rest}",
        source="the service's plain weight dtype",
    )


def _recipe(name: str, description: str, source: str, *, attention: str = "bf16", dense_mlp: str = "bf16",
            experts: str = "bf16", shared_experts: str | None = None, **extra: str | None) -> WeightRecipe:
    formats = {ATTENTION: attention, DENSE_MLP: dense_mlp, EXPERTS: experts,
               SHARED_EXPERTS: shared_experts or experts, ROUTER: "bf16", EMBEDDING: "bf16",
               LM_HEAD: "bf16", NORMS_AND_BIASES: "bf16"}
    return WeightRecipe(name=name, formats=tuple((g, formats[g]) for g in GROUPS), description=description,
                        source=source, **extra)  # type: ignore[arg-type]


_MODELOPT_SOURCE = ("ModelOpt 0.47 default recipes quantize every linear layer including attention q/k/v/o, "
                    "except lm_head, routers, embeddings (configs/ptq/units/default_disabled_quantizers.yaml); "
                    "NVIDIA's exported checkpoints set kv_cache_quant_algo FP8 (quant_utils.py, "
                    "convert_hf_config.py example)")

RECIPES: dict[str, WeightRecipe] = {r.name: r for r in (
    _recipe("modelopt_fp8", "NVIDIA ModelOpt FP8: all decoder linear layers FP8 per-tensor, FP8 KV cache",
            _MODELOPT_SOURCE, attention="fp8", dense_mlp="fp8", experts="fp8",
            checkpoint_kv_dtype="fp8", producer="modelopt"),
    _recipe("modelopt_nvfp4", "NVIDIA ModelOpt NVFP4: all decoder linear layers NVFP4, FP8 KV cache",
            _MODELOPT_SOURCE, attention="nvfp4", dense_mlp="nvfp4", experts="nvfp4",
            checkpoint_kv_dtype="fp8", producer="modelopt"),
    _recipe("deepseek_fp8", "DeepSeek-V3/R1 native FP8: every Linear FP8 with 128x128 block scales; "
            "embedding, LM head, router and norms bf16",
            "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md and inference/model.py @9b4e9788",
            attention="fp8_block", dense_mlp="fp8_block", experts="fp8_block"),
    _recipe("gpt_oss_mxfp4", "OpenAI gpt-oss: MoE experts MXFP4; attention, router, embedding and LM head "
            "bf16", "huggingface.co/openai/gpt-oss-120b config.json quantization_config "
            "modules_to_not_convert [self_attn, mlp.router, embed_tokens, lm_head]; vLLM 0.19.0 mxfp4.py "
            "applies MXFP4 only to FusedMoE", experts="mxfp4"),
    _recipe("meta_fp8", "Meta Llama-3.1-405B-Instruct-FP8 (fbgemm_fp8): MLP FP8 per-channel except the "
            "first and last layers; attention, embedding and LM head bf16",
            "Llama 3 paper section 6.2 (FP8 in the FFN layers only, not self-attention, not the first and "
            "last layer; not checked against the paper's text, ENGINES.md section 4); quant_method fbgemm_fp8 "
            "with modules_to_not_convert (vLLM FBGEMMFp8Config)",
            dense_mlp="fp8", experts="fp8", edge_mlp_format="bf16"),
    _recipe("awq_int4", "AWQ int4: decoder linear layers int4 with group-128 scales and zeros; LM head and "
            "embedding bf16", "vLLM 0.19.0 quantization/awq.py (lm_head not quantized)",
            attention="int4_awq", dense_mlp="int4_awq", experts="int4_awq"),
    _recipe("gptq_int4", "GPTQ int4: decoder linear layers int4 with group-128 scales and zeros; LM head "
            "and embedding bf16", "vLLM 0.19.0 quantization/gptq.py",
            attention="int4_awq", dense_mlp="int4_awq", experts="int4_awq"),
    _recipe("w4a16_int4", "compressed-tensors W4A16: decoder linear layers int4 symmetric, group 128; lm_head "
            "bf16", "compressed-tensors 0.20.1 W4A16 preset, ignore [lm_head]",
            attention="int4", dense_mlp="int4", experts="int4"),
    _recipe("w8a8_int8", "compressed-tensors W8A8: decoder linear layers INT8 per-channel; lm_head bf16",
            "compressed-tensors 0.20.1 W8A8 preset, ignore [lm_head]",
            attention="int8", dense_mlp="int8", experts="int8"),
    _recipe("fp8_dynamic", "compressed-tensors FP8_DYNAMIC: decoder linear layers FP8 per-channel; lm_head "
            "bf16", "compressed-tensors 0.20.1 FP8_DYNAMIC preset, ignore [lm_head]",
            attention="fp8", dense_mlp="fp8", experts="fp8"),
    _recipe("w4afp8", "W4A8: decoder linear layers int4 (group 128) with FP8 activations",
            "compressed-tensors 0.20.1 W4AFP8; ModelOpt 0.47 w4a8_awq_beta",
            attention="w4afp8", dense_mlp="w4afp8", experts="w4afp8"),
)}
RECIPE_NAMES = tuple(RECIPES)

# (catalog model, weight dtype) -> the recipe of the one checkpoint of that precision the model ships as, which a
# run or a plan of the model at that dtype serves unless it names another checkpoint. gpt-oss ships only as
# OpenAI's MXFP4 checkpoint: experts MXFP4, attention, router and embeddings bf16 (models.json notes,
# ENGINES.md section 4), not every decoder matrix in fp4 as the plain dtype would read. DeepSeek-V3 and R1 ship
# in FP8 only as DeepSeek's 128 x 128 block-scaled checkpoint (models.json notes "Released weights are FP8 (block
# 128x128)"; ENGINES.md section 4), whose FP32 block scales add bytes and whose blocks vLLM loads only whole per
# rank.
PUBLISHED_RECIPES = {("gpt-oss-120b", "fp4"): "gpt_oss_mxfp4", ("gpt-oss-20b", "fp4"): "gpt_oss_mxfp4",
                     ("deepseek-v3", "fp8"): "deepseek_fp8", ("deepseek-r1", "fp8"): "deepseek_fp8"}


def published_recipe(model_slug: str, weight_dtype: str) -> WeightRecipe | None:
    """The recipe of the catalog model's one published checkpoint in `weight_dtype` (`PUBLISHED_RECIPES`);
    None where it names none, and the plain dtype stands for the weights."""
    name = PUBLISHED_RECIPES.get((model_slug, weight_dtype))
    return RECIPES[name] if name is not None else None


def resolve_recipe(weights: str | WeightRecipe) -> WeightRecipe:
    """A recipe object, a recipe's name, or a plain weight dtype."""
    if isinstance(weights, WeightRecipe):
        return weights
    if weights in RECIPES:
        return RECIPES[weights]
    return uniform_recipe(weights)


# Reading a checkpoint's quantization_config -----------------------------------------------------------

_ATTENTION_MARKERS = ("self_attn", "attention", "attn")


def recipe_from_quantization_config(config: dict[str, object]) -> tuple[str | None, str]:
    """The recipe a Hugging Face `quantization_config` describes (None when no shipped recipe matches),
    and a sentence naming what it read: `quant_method`, the scheme, and the excluded modules
    (`modules_to_not_convert`, `ignore`, `exclude_modules`). ENGINES.md section 4 lists the keys."""
    method = str(config.get("quant_method", "")).lower()
    excluded = _excluded_modules(config)
    attention_excluded = any(marker in m for m in excluded for marker in _ATTENTION_MARKERS)
    name: str | None = None
    if method == "mxfp4":
        name = "gpt_oss_mxfp4"  # vLLM applies MXFP4 to the fused MoE experts only
    elif method == "fp8":
        name = "deepseek_fp8" if config.get("weight_block_size") == [128, 128] else "fp8_dynamic"
    elif method == "fbgemm_fp8":
        name = "meta_fp8" if attention_excluded else "fp8_dynamic"
    elif method in ("awq", "gptq"):
        name = f"{method}_int4" if config.get("bits", 4) == 4 else None
    elif method.startswith("modelopt"):
        algo = str(config.get("quant_algo") or _nested(config, "quantization", "quant_algo") or "").upper()
        name = {"FP8": "modelopt_fp8", "NVFP4": "modelopt_nvfp4"}.get(algo)
        if method == "modelopt_fp4":
            name = "modelopt_nvfp4"
        elif name is None and not algo:  # the config.json form: the scheme is in config_groups
            name = _by_first_group(config, {(8, "float"): "modelopt_fp8", (4, "float"): "modelopt_nvfp4"})
    elif method == "compressed-tensors":
        name = _compressed_tensors_recipe(config)
    read = f"quant_method {method or 'missing'!r}" + (f", excluded modules {excluded}" if excluded else "")
    return name, read


def _excluded_modules(config: dict[str, object]) -> list[str]:
    """The module names each exclusion key lists (a lone name counts as a list of one; any other value, which
    no quantizer writes, names none)."""
    excluded: list[str] = []
    for key in ("modules_to_not_convert", "ignore", "exclude_modules"):
        value = config.get(key)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            excluded += [str(module) for module in value]
    return excluded


def _nested(config: dict[str, object], *keys: str) -> object:
    value: object = config
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _by_first_group(config: dict[str, object], names: dict[tuple[object, object], str]) -> str | None:
    """The name `names` gives the (num_bits, type) of the first config group's weights (compressed-tensors,
    and ModelOpt's config.json form); None without such a group or for another scheme."""
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    weights = next(iter(groups.values()))
    weights = weights.get("weights") if isinstance(weights, dict) else None
    if not isinstance(weights, dict):
        return None
    return names.get((weights.get("num_bits"), weights.get("type")))


def _compressed_tensors_recipe(config: dict[str, object]) -> str | None:
    """W8A8 int8, FP8 (dynamic) and W4A16 int4 presets, read from the first config group's weights."""
    return _by_first_group(config, {(8, "float"): "fp8_dynamic", (8, "int"): "w8a8_int8", (4, "int"): "w4a16_int4"})


# What KV cache a ModelOpt checkpoint declares: by kv_cache_quant_algo (hf_quant_config.json's form) or by its
# kv_cache_scheme's (num_bits, type) (config.json's) (ENGINES.md section 4; vLLM 0.33 also adopts NVFP4).
_DECLARED_KV_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4"}
_DECLARED_KV_SCHEMES: dict[tuple[object, object], str] = {(8, "float"): "fp8", (4, "float"): "nvfp4"}


def declared_kv_cache(config: dict[str, object]) -> str | None:
    """The KV-cache format a ModelOpt `quantization_config` declares ('fp8', 'nvfp4', or the algorithm's
    own name in lower case), None when it declares none: `kv_cache_quant_algo` (at the top or under
    `quantization`, hf_quant_config.json's form) null or absent, and no `kv_cache_scheme` (config.json's
    form). Without one every engine caches K and V in the model's dtype: an engine's 'auto' adopts a declared
    one only (ENGINES.md 1.1-1.3)."""
    algo = config.get("kv_cache_quant_algo") or _nested(config, "quantization", "kv_cache_quant_algo")
    if algo:
        return _DECLARED_KV_ALGOS.get(str(algo).upper(), str(algo).lower())
    scheme = config.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        bits, kind = scheme.get("num_bits"), scheme.get("type")
        return _DECLARED_KV_SCHEMES.get((bits, kind), f"{kind}{bits}")
    return None
