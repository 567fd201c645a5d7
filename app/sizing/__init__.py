"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.06.2"  # + decode workers pay no prompt-step cost per MoE layer
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.06.1"  # + vLLM loads a block-FP8 checkpoint only where each rank gets whole blocks
