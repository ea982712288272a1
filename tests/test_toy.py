"""The offline toy world: tokenizer, synthetic problems, DAPO-layout files, the toy checkpoint and its builder."""

import json
from dataclasses import asdict

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stapo_trl.math.reward import extract_boxed_answer
from stapo_trl.toy import SHIPPED_CHECKPOINT, toy_checkpoint, toy_dataset_files
from stapo_trl.toy.pretrain import PretrainConfig
from stapo_trl.toy.problems import (
    DAPO_PROMPT_PREFIX,
    DAPO_PROMPT_SUFFIX,
    INSTRUCTION,
    Problem,
    all_problems,
    chat_prompt,
    generate_problems,
    is_correct,
    rl_prompt,
    split_of,
    write_dapo_layout,
)
from stapo_trl.toy.tokenizer import build_tokenizer


def test_tokenizer_round_trips_text_and_chat():
    tokenizer = build_tokenizer()
    text = "What is 23+45? Please reason step by step, and put your final answer within \\boxed{}.\n\t~"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text
    chat = chat_prompt(tokenizer, Problem(23, "+", 45))
    assert chat == ("<|im_start|>user\nWhat is 23+45? " + INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n")
    chat_ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(chat_ids) == chat
    assert tokenizer.decode(tokenizer("7<|im_end|>", add_special_tokens=False)["input_ids"]) == "7<|im_end|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id


def test_problems_have_integer_answers_and_short_completions():
    assert Problem(23, "+", 45).completion == "23+45=60+8=68. \\boxed{68}"
    assert Problem(27, "+", 5).completion == "27+5=20+12=32. \\boxed{32}"
    assert Problem(52, "-", 17).completion == "52-17=40-5=35. \\boxed{35}"
    assert Problem(58, "-", 17).completion == "58-17=40+1=41. \\boxed{41}"
    assert Problem(7, "*", 23).completion == "7*23=140+21=161. \\boxed{161}"
    assert Problem(7, "*", 8).completion == "7*8=56. \\boxed{56}"
    assert Problem(23, "+", 45).unboxed_completion == "23+45=60+8=68."
    assert Problem(23, "+", 45).text == "What is 23+45?"
    assert Problem(9, "-", 9).answer == 0
    assert Problem(7, "*", 29).answer == 203
    problems = all_problems()
    assert len(problems) == len(set(problems)) > 10_000
    for problem in problems:
        assert problem.answer >= 0
        assert len(problem.completion) <= 32
        assert is_correct(problem.completion, problem.answer)
        assert extract_boxed_answer(problem.unboxed_completion) is None
        # every worked step is true arithmetic: "a op b = x +/- y = answer"
        left, middle, *rest = problem.completion.split(". ")[0].split("=")
        assert eval(left) == eval(middle) == problem.answer and all(int(r) == problem.answer for r in rest)
    assert rl_prompt("What is 1+1?") == [{"role": "user", "content": "What is 1+1? " + INSTRUCTION}]


def test_problems_are_deterministic_and_splits_disjoint():
    assert generate_problems(50, seed=3) == generate_problems(50, seed=3)
    assert generate_problems(50, seed=3) != generate_problems(50, seed=4)
    train = generate_problems(3000, seed=0, split="train")
    heldout = generate_problems(300, seed=0, split="heldout")
    assert len(set(train)) == 3000 and len(set(heldout)) == 300
    assert not set(train) & set(heldout)
    assert all(split_of(p) == "train" for p in train) and all(p.split == "heldout" for p in heldout)
    everything = all_problems()
    heldout_share = sum(split_of(p) == "heldout" for p in everything) / len(everything)
    assert 0.07 < heldout_share < 0.13
    assert {p.op for p in train} == {"+", "-", "*"}
    with pytest.raises(ValueError):
        generate_problems(1, split="test")


def test_dapo_layout(tmp_path):
    path = write_dapo_layout(tmp_path / "toy.parquet", 20, seed=1)
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    problems = generate_problems(20, seed=1)
    assert len(rows) == 20
    for row, problem in zip(rows, problems):
        assert row["data_source"] == "toy_arithmetic"
        assert row["ability"] == "MATH"
        assert row["reward_model"] == {"ground_truth": str(problem.answer), "style": "rule-lighteval/MATH_v2"}
        assert isinstance(row["extra_info"]["index"], str)
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"] == (
            "Solve the following math problem step by step. The last line of your response should be of the form "
            "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
            f"{problem.text}\n\n"
            'Remember to put your answer on its own line after "Answer:".'
        )
        assert message["content"] == DAPO_PROMPT_PREFIX + problem.text + DAPO_PROMPT_SUFFIX
    assert len({row["extra_info"]["index"] for row in rows}) == 20
    # deterministic: the same call writes the same rows
    again = pq.read_table(write_dapo_layout(tmp_path / "again.parquet", 20, seed=1)).to_pylist()
    assert again == rows


def test_toy_dataset_files(tmp_path):
    paths = toy_dataset_files(tmp_path, num_train=40, num_heldout=10)
    train = pq.read_table(paths["train"]).to_pylist()
    heldout = pq.read_table(paths["heldout"]).to_pylist()
    assert (len(train), len(heldout)) == (40, 10)
    train_prompts = {row["prompt"][0]["content"] for row in train}
    assert not train_prompts & {row["prompt"][0]["content"] for row in heldout}
    assert toy_dataset_files(tmp_path, num_train=40, num_heldout=10) == paths


def test_toy_dataset_files_load_with_load_dapo_math(tmp_path):
    data = pytest.importorskip("stapo_trl.math.data")
    dataset = data.load_dapo_math(toy_dataset_files(tmp_path, num_train=30, num_heldout=5)["train"])
    problems = generate_problems(30, seed=0)
    assert len(dataset) == 30
    assert dataset[0]["prompt"] == rl_prompt(problems[0])
    assert dataset["solution"] == [str(p.answer) for p in problems]


@pytest.fixture(scope="module")
def toy_model_and_tokenizer():
    path = toy_checkpoint()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_toy_checkpoint_is_shipped_and_small():
    assert toy_checkpoint() == str(SHIPPED_CHECKPOINT)
    size = sum(f.stat().st_size for f in SHIPPED_CHECKPOINT.iterdir() if f.is_file())
    assert size < 10 * 2**20
    info = json.loads((SHIPPED_CHECKPOINT / "pretrain_config.json").read_text())
    assert info["pretrain"] == asdict(PretrainConfig())  # the defaults are the recipe that built the shipped weights


def test_toy_checkpoint_answers_heldout_problems(toy_model_and_tokenizer):
    model, tokenizer = toy_model_and_tokenizer
    assert model.config.model_type == "qwen3"
    assert tokenizer.chat_template is not None and tokenizer.padding_side == "left"
    problems = generate_problems(20, seed=0, split="heldout")
    prompts = [chat_prompt(tokenizer, p) for p in problems]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(**batch, do_sample=False, max_new_tokens=32)
    completions = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert all(extract_boxed_answer(c) is not None for c in completions), completions
    correct = sum(is_correct(c, p.answer) for c, p in zip(completions, problems))
    assert correct >= 4, list(zip(completions, problems))  # a random model gets none of these


def test_build_toy_checkpoint_smoke(tmp_path):
    from stapo_trl.toy.pretrain import build_toy_checkpoint, evaluate

    out = build_toy_checkpoint(tmp_path / "ckpt", PretrainConfig(steps=3, batch_size=4, warmup_steps=1), log=None)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert json.loads((out / "pretrain_config.json").read_text())["pretrain"]["steps"] == 3
    accuracy = evaluate(model, tokenizer, generate_problems(2, split="heldout"), max_new_tokens=4)
    assert 0.0 <= accuracy <= 1.0


def test_toy_checkpoint_builds_into_cache_once(tmp_path, monkeypatch):
    import stapo_trl.toy as toy
    import stapo_trl.toy.pretrain as pretrain

    builds = []
    original = pretrain.build_toy_checkpoint

    def quick_build(output_dir, **kwargs):
        builds.append(output_dir)
        return original(output_dir, pretrain.PretrainConfig(steps=2, batch_size=2, warmup_steps=1), log=None)

    monkeypatch.setattr(toy, "SHIPPED_CHECKPOINT", tmp_path / "not-shipped")
    monkeypatch.setattr(pretrain, "build_toy_checkpoint", quick_build)
    path = toy.toy_checkpoint(cache_dir=tmp_path / "cache")
    assert path == str(tmp_path / "cache" / f"toy-{toy.TOY_VERSION}")
    assert toy.toy_checkpoint(cache_dir=tmp_path / "cache") == path
    assert len(builds) == 1
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen3"
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".toy-") and p.is_dir()] == []
