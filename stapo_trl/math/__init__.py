"""The math task: DAPO's rule reward (math-verify), the training data loaders, the shipped benchmarks."""
