"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
# 2026.12.06.4: vLLM's MoE layers gather every data-parallel rank's tokens (allgather_reducescatter); a model at a
# dtype it ships in one checkpoint (gpt-oss in fp4) is planned and sized as that checkpoint's recipe.
# 2026.12.06.5: the default search also plans an MoE model one node cannot hold in attention DP + EP over whole nodes;
# disaggregated pools may run attention DP + EP and pipeline workers (each scheduler at its share of the worker's load);
# TensorRT-LLM is sized and planned on NVIDIA GPUs only, its first pipeline stages taking the leftover layers.
# 2026.12.06.6: each pipeline stage's GPU has its own KV budget (its own weights) and its own bytes per block (its
# own layers); a replica holds the fewest blocks any stage fits (was: the heaviest stage's budget over the most layers);
# under attention DP, SGLang's dense MLPs and shared experts are split over all the replica's GPUs.
# 2026.12.06.7: SGLang's step under attention DP reads its dense MLPs and shared experts split over the tp x dp GPUs
# and gathers every rank's tokens around every feed-forward block, dense ones too (was: whole, and an exchange per
# expert copy around the MoE layers only).
# 2026.12.06.8: the planner adds cross-node pipeline layouts only where the given data- and expert-parallel degrees
# admit 1; an engine whose memory fraction is at most 0 (SGLang with a large prefill chunk) uses none of the GPU
# (was: a negative amount); a dense model with experts per token or shared experts is refused.
# 2026.12.06.9: a closed loop (concurrent_users) gets disaggregated plans, sized as the open loop of its users' rate
# (was: aggregated plans only); the comparison note calls a cost tie a tie.
# 2026.12.06.10: ha_policy.extra_replicas adds spare workers to each pool of a disaggregated plan (was: none), its
# prediction the pools' without them over the spared deployment's link; a disaggregated pool's worker search starts
# near its answer (the same fewest count wherever more workers never hurt); an aggregated search's step held to a
# replica's finishing rate holds once, then the light load decides (was: held every time).
# 2026.12.07.1: each disaggregated plan of a closed loop whose users send more or less than the rate the cheapest
# was sized for (by 2%) is sized at its own users' rate, and the plans are ranked at their own rates (was: every
# plan at the cheapest's rate, one whose users sent more refused); a disaggregated plan's `predicted` load, requests
# and tokens per second are one decode worker's share, as its other per-replica fields (was: the deployment's); the
# note on why aggregated wins states prefill's share of a request's GPU time (was: "a small share" whatever it was).
# 2026.12.07.2: a closed loop's users may think between requests (workload.think_time_s, exponential pauses; was:
# none, every user sending the next request the moment the last one ended), the aggregated replicas simulated with
# the pauses and the disaggregated plans sized for N / (E + Z); a closed loop's disaggregated rate search stops where
# its next rate would be no lower than the one known enough (was: the same plan sized again, or a larger one kept);
# /v1/capacity's operating point states the users it carries at a think time (batch + requests/s x think time).
# 2026.12.07.3: /v1/capacity of a disaggregated deployment states what each pool sustains (a prefill worker: the
# prompts its token budget holds per step, each attention-DP rank its own; was: none) and which pool limits it;
# its operating point charges a prompt shorter than half the token budget its 1/k share of a step of the k whole
# prompts the budget holds (was: a step of its own, fixed costs included: TensorRT-LLM's 122 ms of MoE prompt-step
# cost on every 100-token Qwen3-235B prompt, TPOT 502 ms where 1,000-token prompts read 238 ms);
# the note on why aggregated wins counts a decode worker's GPU time per request no longer than the request decodes
# (was: its share of the workers' whole time, idle included: users thinking a day read "0% prefill"); a disaggregated
# plan's prediction carries the tokens of the load it was sized for (was: of the mean rate beside the peak's
# requests), and its decode worker's max_verified load is its share with the spares down (was: with them up).
# 2026.12.07.4: a disaggregated plan's analytic_ceiling is its decode worker's, from its decode steps alone (in a
# closed loop's users at the plan's mean request and think time; was: its max_verified load repeated).
# 2026.12.07.5: every engine sizes from the memory CUDA reports where the catalog has it (was: SGLang and the generic
# engine from nvidia-smi's total, 0.49 GB more on an H100; SGLang still picks its default fraction by that total);
# a model with window layers is charged full-attention-equivalent tokens in the worst-case and admission views as in
# the steady state (was: raw tokens beside kv_tokens' layer-equivalent count); vLLM 0.8.0-0.8.4 runs an MLA model in
# FlashMLA's 64-token blocks (was: 16); a disaggregated plan's pools of one GPU type share nodes (was: each pool's
# nodes counted apart, 2 nodes beside an NVLink transfer inside one); launch commands run the KV dtype planned
# (vLLM/SGLang int8 as fp8, TensorRT-LLM's kv_cache_config dtype fp8; was: 16-bit), and TensorRT-LLM's options file
# sets max_input_len to the context where it passes the default 1,024 (was: prompts past 1,024 tokens not admitted).
# 2026.12.07.6: a plan simulates every configuration that could be the cheapest (its cost bound at or below the
# cheapest plan found) past the six-simulation and per-GPU caps, up to 16 (was: six in all, two per GPU type: a
# whole-catalog rank 1 dearer than a single GPU's); a disaggregated plan sizes up to eight pool options (was: four);
# a decode worker's ceiling counts the step that streams a one-token answer (was: a division by zero, a 500); an
# open loop's arrival_cv is the fleet's stream, dealt out at random over its N schedulers, each drawing its share
# as the stream thinned, of CV sqrt(1 + (c^2 - 1) / N) (was: every scheduler saw c itself: CV 4 at 40 req/s took 28
# H100s where 3 do), its gaps from a generator of their own (the same lengths at every CV), and a light-load miss
# gives a configuration up only once the shares are nearly Poisson (was: at a small fleet's light load); KV moved between PCIe cards is named pcie (was:
# nvlink; same rate); an efficiency entry with a parameter the fit pushed to a bound says so in its source.
# 2026.12.07.7: SGLang runs a given running-request limit divided among its attention data-parallel ranks and capped
# at its request pool (was: taken whole per rank and never capped), and plans launch it with the replica's limit,
# dp times one rank's (was: one rank's, which SGLang divided again); SGLang plans with a draft model keep attention DP
# out (SGLang refuses the pair); SGLang 0.5.10 runs no piecewise CUDA graphs under attention DP, pipeline stages,
# speculative decoding, PD disaggregation or on AMD GPUs: there it reserves nothing for them and its prompt steps
# pay the per-MoE-layer launch overhead (was: graphs and their reserve wherever the release had them); DeepSeek-V3
# and R1 in fp8 are DeepSeek's block-scaled checkpoint (deepseek_fp8: its FP32 block scales, vLLM's whole-block
# rule; was: plain fp8), and a measured row stating no weight dtype takes the published checkpoint's recipe; under
# attention DP SGLang's LM head is split over the whole TP group (was: over the attention TP ranks), in memory.
CALCULATION_VERSION = "2026.12.07.7"
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
# 2026.12.06.4: each engine's default MoE exchange under attention DP (vLLM: allgather_reducescatter).
# 2026.12.06.5: the GPU makers each engine runs on (TensorRT-LLM: NVIDIA) and how it splits layers into pipeline
# stages; a replica larger than a node says so.
# 2026.12.06.6: whether an engine splits dense MLPs and shared experts over the attention DP ranks (SGLang: yes).
# 2026.12.06.7: SGLang's exchange under attention DP: every feed-forward block gathers the ranks' tokens (its a2a
# backends are opt-in); its dense split follows from it.
# 2026.12.07.1: every engine sizes from the memory CUDA reports (SGLang's fraction still picked by the driver's total,
# the generic engine's by SIZING.md section 7); each engine names why its default release is what it is and the
# releases the reference covers; vLLM 0.8.0-0.8.4 forces FlashMLA's 64-token blocks on an MLA model; launch flags:
# vLLM and SGLang launch an int8 KV cache as fp8, TensorRT-LLM's options file sets kv_cache_config dtype fp8 and
# max_input_len past 1,024, and its notes say what each precision's checkpoint needs.
# 2026.12.07.2: SGLang divides a given --max-running-requests among the attention DP ranks and caps each rank's at its
# request pool (SGLang 0.5.10 `_resolve_max_num_reqs`); its launch flag is the replica's; SGLang refuses attention DP
# with a draft model's speculative decoding (SGLang 0.5.10 `server_args.py`); SGLang's piecewise CUDA graphs are off
# under attention DP, pipeline stages, speculative decoding, PD disaggregation and on AMD (`_handle_piecewise_cuda_graph`).
ENGINE_RULES_VERSION = "2026.12.07.2"
