"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.02.3"  # SGLang prefills before it decodes; closed-loop TTFT under load not fitted on; profile refitted
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.02.1"  # + SGLang runs prompt chunks before the decodes, never beside them (no mixed chunks by default)
