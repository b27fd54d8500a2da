"""python -m coda.train on the CPU (CODA's reference path): --model qwen3 --compare trains the patched and the plain
HF Qwen3 from the same seed and data order, with matching loss curves and an HF Qwen3 checkpoint."""
import json
import subprocess
import sys

import pytest
from conftest import package_env, tiny_corpus

pytest.importorskip("transformers.models.qwen3", reason="transformers without Qwen3")


def test_cpu_train_qwen3_compare(tmp_path):
    corpus, env = tiny_corpus(tmp_path), package_env()
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "coda.train", "--model", "qwen3", "--compare", "--device", "cpu",
                        "--config", "tiny", "--steps", "4", "--batch-size", "2", "--seq-len", "32", "--warmup", "1",
                        "--eval-every", "3", "--eval-batches", "1", "--log-every", "1", "--warmup-timing", "0",
                        "--no-progress", "--data", str(corpus), "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "qwen3 config tiny" in r.stdout, r.stdout
    summaries = json.loads((out / "summary.json").read_text())
    assert [s["model"] for s in summaries] == ["coda", "torch"] and all(s["family"] == "qwen3" for s in summaries)
    curves = [[json.loads(line) for line in (out / f"losses_{k}.jsonl").read_text().splitlines()]
              for k in ("coda", "torch")]
    assert [c["step"] for c in curves[0]] == [0, 1, 2, 3] == [c["step"] for c in curves[1]]
    for a, b in zip(*curves):  # the same model, data and seed: the reference path tracks HF's fp32 training
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]), (a, b)
    assert abs(summaries[0]["final_val_loss"] - summaries[1]["final_val_loss"]) <= 1e-4 * summaries[1]["final_val_loss"]
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    from safetensors.torch import load_file
    keys = set(load_file(out / "checkpoint" / "model.safetensors"))
    assert "model.layers.1.self_attn.q_norm.weight" in keys and "model.layers.0.mlp.gate_proj.weight" in keys
