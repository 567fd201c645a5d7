"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.06.3"  # + SGLang reserves its piecewise CUDA graphs (0.5.10) and its draft model; 24 graph batches at 20-35 GiB
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.06.3"  # + TensorRT-LLM attention-DP ranks of one GPU; SGLang piecewise graphs and speculative reserve
