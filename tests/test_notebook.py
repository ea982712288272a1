"""notebooks/stapo_demo.ipynb: committed without outputs, and runs top to bottom offline on the toy model.

The end-to-end test executes the notebook with nbclient (a real ipykernel) after a cell that sets the parameters
``TOY = True`` and a temporary ``OUTPUT_DIR``, inserted right after the cell tagged ``parameters`` (as papermill
does), so every code cell a Colab user runs is run here too, against the tiny local model and synthetic data.
"""

import sys
from pathlib import Path

import pytest


NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "stapo_demo.ipynb"
MISSING = 'executing the notebook needs nbformat, nbclient and ipykernel: pip install -e ".[test]"'

nbformat = pytest.importorskip("nbformat", reason=MISSING)


def read_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def parameters_index(notebook) -> int:
    tagged = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged 'parameters' (papermill's convention)"
    return tagged[0]


def test_committed_notebook_is_valid_and_stripped():
    notebook = read_notebook()
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"outputs must be stripped from the committed notebook: {cell.source[:60]!r}"
            assert cell.execution_count is None, f"execution counts must be stripped: {cell.source[:60]!r}"
    assert "widgets" not in notebook.metadata
    parameters = notebook.cells[parameters_index(notebook)]
    assert parameters.cell_type == "code"
    # The committed defaults are the Colab run: the real model, no toy, nothing pushed.
    assert "TOY = False" in parameters.source
    assert "PUSH_TO_HUB = False" in parameters.source
    assert 'MODEL = "Qwen/Qwen3-0.6B-Base"' in parameters.source


def _kernel_manager(tmp_path):
    """A kernel running this interpreter (where stapo_trl is installed), whatever kernelspecs the machine has."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernels = tmp_path / "kernels"
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    write_kernel_spec(kernels / "stapo-test", overrides={"argv": argv})
    specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    return KernelManager(kernel_name="stapo-test", kernel_spec_manager=specs)


@pytest.mark.slow
def test_notebook_runs_end_to_end_offline_on_the_toy_model(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient", reason=MISSING)
    pytest.importorskip("ipykernel", reason=MISSING)
    # The kernel inherits this environment: no Hub, no network, no GPU.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    notebook = read_notebook()
    output_dir = tmp_path / "run"
    parameters = nbformat.v4.new_code_cell(f"TOY = True\nOUTPUT_DIR = {str(output_dir)!r}")
    parameters.metadata["tags"] = ["injected-parameters"]
    notebook.cells.insert(parameters_index(notebook) + 1, parameters)

    client = nbclient.NotebookClient(
        notebook,
        km=_kernel_manager(tmp_path),
        timeout=300,  # per cell
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails

    def text_of(cell):
        return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")

    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code_cells), "every code cell ran"
    outputs = "\n".join(text_of(cell) for cell in code_cells)
    assert "vLLM: False" in outputs
    assert "accuracy on 8 problems: before" in outputs
    assert "Not pushed (PUSH_TO_HUB = False)" in text_of(code_cells[-1])

    # What the run left behind: logs, trace folder, plots shown inline, the LoRA adapter.
    assert (output_dir / "trainer_state.json").is_file()
    assert (output_dir / "spurious_trace").is_dir()
    for name in ("reward", "entropy", "silenced_ratio", "candidate_ratio"):
        assert (output_dir / "plots" / f"{name}.png").is_file()
    assert (output_dir / "adapter_config.json").is_file()
    assert (output_dir / "adapter_model.safetensors").is_file()
    images = [o for cell in code_cells for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 4, "the four plots are displayed inline"
    # The silenced-token cell shows either the cases (Markdown) or says that nothing was traced.
    trace_cell = next(cell for cell in code_cells if "load_trace" in cell.source)
    shown = text_of(trace_cell) + "".join(o.get("data", {}).get("text/markdown", "") for o in trace_cell.outputs)
    assert "Spurious tokens" in shown or "No token was silenced" in shown
