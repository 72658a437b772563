"""LLM reasoners' plumbing: an OpenAI-compatible Chat Completions client and what it needs.

One module per job: `settings` (OPTICO_LLM_* configuration), `client` (retries, backoff,
structured-output negotiation, a circuit breaker), `prompts` (package-data templates),
`untrusted` (fencing, trimming and withholding instructions in logs and earlier model
output), `history` (the view of the pool a prompt gets), `formats` (schemas and output
instructions per mode and ablation), `parsing` (JSON and the paper's text formats),
`answers` (validation into the agents' typed contracts), `audit` (what is stored per call,
with secrets redacted) and `cli` (`optico llm check`). The reasoners themselves are in
`optico.agents.llm`; the wrapper that falls back to the rules, never silently, in
`optico.agents.fallback`.
"""
