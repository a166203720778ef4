"""Deriving the layer recipes of a 100B+ MoE config once, and estimating from them afterwards.

Run: ``python benchmarks/recipe_speed.py``. The config is gpt-oss-120b's shape (transformers'
``GptOssConfig`` defaults: 36 layers, 128 experts of 2880 x 2880, 116.8B parameters), read by
the generic reader (as a type without a native family would be). In a fresh subprocess with
an empty recipe cache it times: reading the module tree, tracing the training recipe of a
full and of a LoRA fine-tune (batch 1, seq 2048), and the inference recipe of a 2048 + 256
token generate(); then, in a second subprocess on the filled cache, an estimate of each, and
whether torch or transformers were imported. The yardstick, run in the first subprocess: one
plain fake-tensor forward + backward of the model cut to the same layers, untracked.
Figures are printed (ratios to the yardstick); this is not a pass/fail test. Issue 19's
target: the recipes of a 100B+ MoE config in at most 20 s, and no torch import afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap

_CONFIG = "import transformers, json; c = transformers.AutoConfig.for_model('gpt_oss').to_dict(); c['model_type'] = 'gpt_oss'; config = json.loads(json.dumps(c, default=str))"

_DERIVE = textwrap.dedent(
    f"""
    import json, sys, time, warnings
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    {_CONFIG}
    from vramlens.model.generic import describe_config
    from vramlens.estimator import estimate
    spec = describe_config(config, model_type="gpt_oss", source="gpt-oss-120b")
    times = {{"read the module tree": time.perf_counter() - t}}
    with open(sys.argv[2], "w") as stream:
        json.dump(config, stream)
    for name, workload in json.loads(sys.argv[1]).items():
        t = time.perf_counter()
        estimate({{"model": spec, **workload}})
        times[name] = time.perf_counter() - t
    # Yardstick: one untracked fake forward + backward of the same cut model.
    import importlib, torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    recipe = importlib.import_module("vramlens.simulator.recipe")
    from vramlens.simulator.build import real_code_paths
    from vramlens.model.generic.reader import build_meta_model
    model, _ = build_meta_model(config, "gpt_oss")
    chosen = importlib.import_module("vramlens.simulator._recipe_trace")._subset(spec.generic)
    model.model.layers = torch.nn.ModuleList([model.model.layers[i] for i in chosen])
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with real_code_paths():
        with fake:
            model.to_empty(device="cpu")
        model.train()
        with fake:
            ids = torch.randint(0, 1000, (1, 2048))
            t = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            times["yardstick: one bare fake step of the cut model"] = time.perf_counter() - t
    print(json.dumps({{"parameters": spec.num_parameters, "times": times}}))
    """
)

_ESTIMATE = textwrap.dedent(
    """
    import json, sys, time
    from vramlens.model.generic import describe_config
    from vramlens.estimator import estimate
    with open(sys.argv[2]) as stream:
        config = json.load(stream)
    spec = describe_config(config, model_type="gpt_oss", source="gpt-oss-120b")
    times = {}
    for name, workload in json.loads(sys.argv[1]).items():
        t = time.perf_counter()
        report = estimate({"model": spec, **workload})
        times[name] = (time.perf_counter() - t, report.allocated_bytes)
    print(json.dumps({"times": times, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
    """
)

WORKLOADS = {
    "full fine-tune recipe (b1, s2048)": {"precision": "bf16", "batch": 1, "seq": 2048},
    "LoRA recipe (b1, s2048)": {"precision": "bf16", "method": "lora", "batch": 1, "seq": 2048},
    "generate recipe (2048 + 256 tokens)": {"mode": "infer", "batch": 1, "prompt": 2048, "generate": 256},
}


def _run(code: str, env: dict[str, str], *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    import os

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "VRAMLENS_CACHE_DIR": cache}
        config = os.path.join(cache, "config.json")
        derived = _run(_DERIVE, env, json.dumps(WORKLOADS), config)
        times = derived["times"]
        assert isinstance(times, dict)
        yardstick = times["yardstick: one bare fake step of the cut model"]
        print(f"gpt-oss-120b shape, {derived['parameters']:,} parameters; first use (empty recipe cache):")
        total = 0.0
        for name, seconds in times.items():
            total += seconds if not name.startswith("yardstick") else 0.0
            print(f"  {name:50} {seconds:7.2f} s  ({seconds / yardstick:6.1f} x yardstick)")
        print(f"  {'all recipes, module tree included':50} {total:7.2f} s  (issue 19 target: <= 20 s)")
        again = _run(_ESTIMATE, env, json.dumps(WORKLOADS), config)
        print("afterwards (cache filled), in a new process:")
        estimates = again["times"]
        assert isinstance(estimates, dict)
        for name, (seconds, allocated) in estimates.items():
            print(f"  {name:50} {seconds * 1000:7.1f} ms  peak {allocated / 2**30:8.2f} GiB")
        print(f"  torch imported: {again['torch']}, transformers imported: {again['transformers']}")


if __name__ == "__main__":
    main()
