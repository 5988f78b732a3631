"""``meshwise plan``: a model, a cluster and a batch in; the ranked layouts, the explanation and the
warnings out (tables, JSON or an HTML report). Its defaults live here; ``cli.py`` only parses."""

from __future__ import annotations

import json

from meshwise.errors import MeshwiseError

DEFAULT_MODEL = "llama3-70b"
DEFAULT_GPU = "h100"
DEFAULT_GPUS = 64
DEFAULT_GLOBAL_BATCH = 512
DEFAULT_TOP = 5


def plan_main(model_name: str | None, params: float | None, gpu: str, gpus: int, gpus_per_node: int | None,
              seq_len: int | None, global_batch: int, precision: str, optimizer: str, layout_text: str | None,
              top: int, headroom: float | None, as_json: bool, report: str | None,
              runtime: str | None = None, verify: int = 0) -> int:
    """Check every input, then plan and print; ``layout_text`` evaluates that one layout; ``runtime``
    (meshwise or megatron) defaults to the profile's ``runtime`` key, else meshwise; ``verify`` K > 0
    traces the top K candidates (meshwise.measure.verify.verify_plan; imports torch)."""
    from meshwise import spec
    from meshwise.plan import planner
    from meshwise.cost.estimate import DEFAULT_HEADROOM
    from meshwise.layout import check_runnable, parse

    model = spec.ModelSpec.from_param_count(params) if params is not None else spec.load_model(model_name or DEFAULT_MODEL)
    cluster = spec.load_cluster(gpu, gpus, gpus_per_node)
    if seq_len is None:
        seq_len = spec.default_seq_len(model)
    runtime = runtime or cluster.accelerator.runtime or "meshwise"
    train = spec.TrainSpec(global_batch=global_batch, seq_len=seq_len, precision=precision, optimizer=optimizer,
                           runtime=runtime)
    if top < 1:
        raise MeshwiseError(f"--top: {top} must be at least 1")
    if verify < 0:
        raise MeshwiseError(f"--verify: {verify} must be 0 (no trace) or a number of candidates to trace")
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    if not 0 <= headroom < 1:
        raise MeshwiseError(f"--headroom: {headroom} must be in [0, 1)")
    if report:
        from meshwise.files import check_output_file
        from meshwise.report import require_matplotlib
        check_output_file("--report", report, parent_must_exist=True)
        require_matplotlib()
    chosen = None
    if layout_text:
        chosen = parse(layout_text, cluster.world_size)
        check_runnable(chosen, model, cluster.world_size, global_batch, seq_len, seq_field="--seq-len",
                       runtime=runtime)
    result = planner.plan(model, cluster, train, top=top, headroom=headroom, layout=chosen)
    if verify:
        from meshwise.measure.verify import verify_plan
        result = verify_plan(model, cluster, train, result, verify, headroom)
    if as_json:
        print(json.dumps({"model": model.as_json(), **result.as_json(), "runtime": runtime}))
    else:
        from meshwise.plan.show import print_plan
        print_plan(model, cluster, train, result)
    if report:
        from meshwise.report.plan_report import write_plan_report
        write_plan_report(report, model, cluster, train, result, headroom)
        if not as_json:
            print(f"report: {report}")
    return 0
