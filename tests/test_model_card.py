"""The model card STAPOTrainer writes (stapo_trl.model_card), offline."""

from pathlib import Path

import pytest
from conftest import cpu_config, length_reward

from stapo_trl import STAPOTrainer
from stapo_trl.model_card import method_name
from stapo_trl.toy import toy_checkpoint


@pytest.fixture
def trainer(tmp_path, tokenizer, prompt_dataset):
    args = cpu_config(tmp_path / "run", spurious_prob_threshold=0.01, spurious_entropy_quantile=0.5)
    return STAPOTrainer(model=toy_checkpoint(), reward_funcs=length_reward, args=args, train_dataset=prompt_dataset)


def test_card_of_a_local_model_with_an_evaluation(trainer):
    output_dir = Path(trainer.args.output_dir)
    table = "| model | AIME24 |\n|---|---|\n| run | 0.25 |"
    (output_dir / "eval").mkdir(parents=True)
    (output_dir / "eval" / "summary.md").write_text(table + "\n")
    trainer.create_model_card(dataset_name="toy")
    card = (output_dir / "README.md").read_text()
    assert "huggingface.co/None" not in card and "[None]" not in card
    assert "trained from a local checkpoint (`toy/checkpoint`)" in card
    assert str(Path(toy_checkpoint()).parent) not in card  # no absolute path of this machine goes to the Hub
    assert "huggingface.co/datasets/toy" not in card and "on `toy`" in card
    assert "Method: **stapo**" in card
    for row in ("| spurious_mask_mode | `low_entropy` |", "| τ_p (spurious_prob_threshold) | `0.01` |",
                "| q (spurious_entropy_quantile) | `0.5` |", "| loss_type | `dapo` |"):  # fmt: skip
        assert row in card
    if hasattr(trainer.args, "spurious_mask_scope"):
        assert f"| spurious_mask_scope | `{trainer.args.spurious_mask_scope}` |" in card
    assert "From `eval/summary.md`:" in card and table in card
    assert "@article{stapo2026" in card
    assert r'answer within \\boxed{}."' in card  # the quick start's prompt is valid Python: \\ in a string is \


def test_card_links_a_hub_base_model(trainer):
    from stapo_trl.model_card import model_card

    card = model_card(trainer.args, "Qwen/Qwen3-1.7B-Base", "run", "me/run", "BytedTsinghua-SIA/DAPO-Math-17k",
                      ["stapo"], "STAPO", trainer._paper)  # fmt: skip
    text = str(card)
    assert "fine-tuned version of [Qwen/Qwen3-1.7B-Base](https://huggingface.co/Qwen/Qwen3-1.7B-Base)" in text
    assert "(https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k)" in text
    assert card.data.base_model == "Qwen/Qwen3-1.7B-Base"
    assert "## Evaluation" not in text


def test_method_name_is_the_most_specific_matching_preset(tmp_path):
    from stapo_trl.methods import method_config

    for method in ("stapo", "justrl", "grpo", "20_entropy", "justrl_fullmask"):
        args = cpu_config(tmp_path, **method_config(method))
        assert method_name(args) == method
    assert method_name(cpu_config(tmp_path, spurious_mask_mode="none", loss_type="grpo")) == "justrl"
