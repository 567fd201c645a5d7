"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.02.5"  # RTX PRO 6000 (sm_120) calibrated apart from data-center Blackwell; profile refitted
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.02.2"  # + vLLM scheduler defaults by release; SGLang DP attention (chunk / dp, reserve)
