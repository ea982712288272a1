"""The code task: tests run in a sandbox as the reward, Eurus-2 code data, code benchmarks."""
