"""The peers' verdicts on test cases: ``python verdicts.py PEER CASES_FILE OUT_FILE`` writes one verdict per case.

PEER is ``prime`` (veRL's ``prime_code.compute_score``, continuous as veRL calls it for Eurus' code sources: True
when every test passes, else the fraction of the first 10 tests that pass), ``livecodebench`` (lcb_runner: True
when every test passes) or ``evalplus`` (EvalPlus: True when the base and the plus inputs pass). Each case is a
JSON object; see `VERDICTS` for its fields. The programs run outside any sandbox, as in the peers themselves.
"""

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))


def prime(case):
    from prime_code import compute_score

    score, _ = compute_score(case["completion"], json.dumps(case["tests"]), continuous=True)
    return score


def extract_code(model_output: str) -> str:
    """lcb_runner.utils.extraction_utils.extract_code for chat models (every style but CodeLLaMa's and base)."""
    outputlines = model_output.split("\n")
    indexlines = [i for i, line in enumerate(outputlines) if "```" in line]
    if len(indexlines) < 2:
        return ""
    return "\n".join(outputlines[indexlines[-2] + 1 : indexlines[-1]])


def check_correctness(sample, generation, timeout, debug=True):
    """lcb_runner.evaluation.compute_code_generation_metrics.check_correctness."""
    import multiprocessing

    from lcb_runner.evaluation.testing_util import run_test

    def _temp_run(sample, generation, debug, result, metadata_list, timeout):
        res, metadata = run_test(sample, test=generation, debug=debug, timeout=timeout)
        result.append(res)
        metadata_list.append(metadata)

    manager = multiprocessing.Manager()
    result = manager.list()
    metadata_list = manager.list()
    p = multiprocessing.Process(target=_temp_run, args=(sample, generation, debug, result, metadata_list, timeout))
    p.start()
    p.join(timeout=(timeout + 1) * len(json.loads(sample["input_output"])["inputs"]) + 5)
    if p.is_alive():
        p.kill()
    if not result:
        in_outs = json.loads(sample["input_output"])
        result = [[-1 for i in range(len(in_outs["inputs"]))]]
    return result[0], metadata_list[0]


def livecodebench(case):
    """evaluate_generations_by_problem for one generation, then pass_k_utils' rule: every result > 0."""
    import numpy as np

    sys.set_int_max_str_digits(50000)  # as compute_code_generation_metrics does on import
    curr_res = [-2]
    try:
        sample = {"input_output": json.dumps(case["tests"])}
        curr_res, _ = check_correctness(sample, extract_code(case["completion"]), timeout=6, debug=False)
        fixed = []
        for e in curr_res:
            if isinstance(e, np.ndarray):
                e = e.item(0)
            if isinstance(e, np.bool_):
                e = bool(e)
            fixed.append(e)
        curr_res = fixed
    except Exception:
        pass
    return bool(np.all(np.array(curr_res) > 0))


def evalplus(case):
    """evalplus.evaluate for one solution: expected values and times from trusted_exec, then untrusted_check on the
    base inputs and on the plus inputs; the "plus" verdict."""
    from evalplus.eval import MBPP_OUTPUT_NOT_NONE_TASKS, PASS, untrusted_check
    from evalplus.gen.util import trusted_exec

    problem, dataset = case["problem"], case["dataset"]
    not_none = MBPP_OUTPUT_NOT_NONE_TASKS if dataset == "mbpp" else []
    for inputs in (problem["base_input"], problem["plus_input"]):
        if not inputs:
            continue
        expected, times = trusted_exec(
            problem["prompt"] + problem["canonical_solution"],
            inputs,
            problem["entry_point"],
            record_time=True,
            output_not_none=problem["entry_point"] in not_none,
        )
        status, _ = untrusted_check(
            dataset, case["solution"], inputs, problem["entry_point"], expected, problem["atol"], times
        )
        if status != PASS:
            return False
    return True


VERDICTS = {"prime": prime, "livecodebench": livecodebench, "evalplus": evalplus}

if __name__ == "__main__":
    verdict = VERDICTS[sys.argv[1]]
    cases = json.loads(Path(sys.argv[2]).read_text())
    Path(sys.argv[3]).write_text(json.dumps([verdict(case) for case in cases]))
