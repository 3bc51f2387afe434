"""Reads back, with the trackers' own Python libraries, what Trainyard sent
them; run by tests/e2e/tracking.rs in the tracking venv (scripts/tracking.sh).

  tracking_read.py mlflow URI JOB_ID OUT_DIR
      Finds the MLflow run tagged trainyard.job_id=JOB_ID (in any
      experiment), waits up to 180 s for it to end (status FINISHED, FAILED
      or KILLED), downloads its model.safetensors artifact (a model job's)
      or its outputs/ folder (a script job's) into OUT_DIR and prints one
      JSON object: experiment name, status, params, tags, every point of
      every metric ([step, value, timestamp] by key) and the downloaded
      file's and folder's paths.

  tracking_read.py tensorboard DIR
      Loads the event file(s) in DIR with TensorBoard's EventAccumulator,
      keeping every scalar, and prints {tag: [[step, value, wall_time]]}.
"""

import json
import sys
import time


def mlflow_run(uri, job_id, out_dir):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    deadline = time.time() + 180
    run = None
    while time.time() < deadline:
        experiments = client.search_experiments()
        runs = client.search_runs(
            [e.experiment_id for e in experiments],
            filter_string=f"tags.`trainyard.job_id` = '{job_id}'",
        )
        if len(runs) > 1:
            raise SystemExit(f"{len(runs)} runs for job {job_id}")
        if runs and runs[0].info.status in ("FINISHED", "FAILED", "KILLED"):
            run = runs[0]
            break
        time.sleep(0.5)
    if run is None:
        raise SystemExit(f"no ended run for job {job_id} within 180 s")
    run_id = run.info.run_id
    metrics = {}
    for key in run.data.metrics:
        history = client.get_metric_history(run_id, key)
        metrics[key] = sorted([m.step, m.value, m.timestamp] for m in history)
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    model = None
    if "model.safetensors" in artifacts:
        model = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path="model.safetensors", dst_path=out_dir
        )
    outputs = None
    if "outputs" in artifacts:
        outputs = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path="outputs", dst_path=out_dir
        )
    print(
        json.dumps(
            {
                "experiment": client.get_experiment(run.info.experiment_id).name,
                "run_name": run.info.run_name,
                "status": run.info.status,
                "params": run.data.params,
                "tags": run.data.tags,
                "metrics": metrics,
                "artifacts": artifacts,
                "model": model,
                "outputs": outputs,
            }
        )
    )


def tensorboard(directory):
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        out[tag] = [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "mlflow":
        mlflow_run(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "tensorboard":
        tensorboard(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
