"""The code task: tests run in a sandbox as the reward, Eurus-2 code data.

- `stapo_trl.code.reward`: `code_reward` (PRIME's +1/-1 test reward, a TRL reward function), and for evaluation
  `extract_program`, `parse_tests`, `run_tests`, `run_program`, `output_matches`.
- `stapo_trl.code.sandbox`: the `Executor` interface (`Job` in, `Output` per input out) and `LocalSandbox`, the
  default executor (`sandbox_harness.py` is what runs inside it).
- `stapo_trl.code.data`: `load_eurus_code` (Eurus-2-RL-Data's code problems as a TRL prompt dataset),
  `drop_long_prompts`, and `SAMPLE_FILE` (six tiny problems in that layout, for the offline demo and the tests).
"""
