"""The tiny offline world: a character tokenizer, a Qwen3-shaped model, synthetic math problems.

Everything here is built locally, so demos and tests run without the Hugging Face Hub.
"""
