"""The code task: tests run in a sandbox as the reward, Eurus-2 code data.

- `stapo_trl.code.reward`: `code_reward` (a TRL reward function: ±1 by default, veRL's partial credit on request),
  and what every harness shares: `Harness`, `parse_tests`, `run_tests`, `run_program`, `stdin_driver`.
- `stapo_trl.code.prime`: PRIME's (veRL ``prime_code``) grading rules, the training reward's: `PRIME`.
- `stapo_trl.code.values`: return values across the sandbox's wall with their Python types.
- `stapo_trl.code.sandbox`: the `Executor` interface (`Job` in, `Output` per input out) and `LocalSandbox`, the
  default executor (`sandbox_harness.py` is what runs inside it).
- `stapo_trl.code.data`: `load_eurus_code` (Eurus-2-RL-Data's code problems as a TRL prompt dataset),
  `drop_long_prompts`, and `SAMPLE_FILE` (six tiny problems in that layout, for the offline demo and the tests).
"""
