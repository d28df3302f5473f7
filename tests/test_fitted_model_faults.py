"""A corrupt fitted model, with the samples intact, through the real daemon (#10 item 4):
reported, set aside, the workload fitted again; register never fails with `internal`.

The stored samples are sound, so they are kept: a budget met before is met again from its
stored decision, and the next budget that needs the predictor refits it from the samples
(and whatever it profiles on top)."""

import json

import pytest

from powerd.sim.harness import EmulatedBoard
from powerd.sim.job import run_training_job
from powerd.sim.trace import TRACE_DIR, Trace

TS = 0.03


@pytest.fixture(scope="module")
def nano_trace():
    return Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")


def _corrupt_onnx(model):
    (model / "predictor.onnx").write_bytes(b"\x00garbage, not a protobuf" * 10)


def _drop_stats(model):
    meta = json.loads((model / "fitted.json").read_text())
    del meta["stats"]
    (model / "fitted.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("corrupt", [_corrupt_onnx, _drop_stats], ids=["onnx", "stats"])
def test_corrupt_fitted_model_is_set_aside_and_fitted_again(nano_trace, corrupt):
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, strategy="powertrain") as b:
        first = run_training_job(
            b.root, nano_trace, 12, "resnet", TS, endpoint=b.endpoint, max_s=180
        )
        assert first.final_phase == "tuned", b.log_tail()
        wdir = next(b.state_dir.glob("workloads/*/resnet"))
        samples_before = json.loads((wdir / "samples.json").read_text())["samples"]
        b.stop_daemon()
        corrupt(wdir / "model")
        b.start_daemon()  # a fresh daemon loads the workload on the next register

        # a budget with no stored decision: the strategy needs (and refits) a predictor
        run = run_training_job(b.root, nano_trace, 10, "resnet", TS, endpoint=b.endpoint, max_s=180)
        log = b.daemon_log.read_text()
        assert run.final_phase == "tuned", b.log_tail()
        assert "corrupt fitted model of resnet" in log
        assert "internal" not in log
        aside = list(wdir.glob("model.corrupt-*"))
        assert len(aside) == 1 and aside[0].name in log
        assert (wdir / "model" / "fitted.json").exists()  # fitted again and saved
        assert "stats" in json.loads((wdir / "model" / "fitted.json").read_text())
        samples_after = json.loads((wdir / "samples.json").read_text())["samples"]
        assert len(samples_after) >= len(samples_before)
        assert b.status()["jobs"] == [] or all(j["phase"] for j in b.status()["jobs"])
