"""Measured scale (issue 18 item 5): a deletion batch's latency split (compute / orchestration), the
CLI's peak memory, the ledger/inbox time and the retraining time, against the number of clients and
against the number of sample IDs a batch forgets.

Per workspace (dataset × number of clients) it creates a fresh workspace under --work
(``fedunlearn init``), adds a scenario copied from ``mnist5k-hfl`` / ``digits-hfl`` (or a synthetic
CSV dataset, for 10,000 IDs: mnist5k has 4,000 training samples) with ``num_clients`` N and the same
number of rounds for every size, trains it (``fedunlearn train``), trains the audit references
once (so that no measured batch pays for them), then runs its batches in order. A batch is either
one request naming k IDs (``fedunlearn request samples --ids-file``) or k requests of one ID each
(written into the inbox with ``fedunlearn.requests.inbox.submit_request``, the function the
``request`` command calls, without starting an interpreter per file), then

    /usr/bin/time -v fedunlearn --root W process --scenario S --retrain

run as ``scale.py --process-batch W S`` (the same code as the CLI command, with the escalation
pinned to PUF-Special then exact retrain: see ``process_batch``).

What is recorded per batch: the flow's split as the CLI prints it (flow / compute / orchestration),
the CLI's wall time and peak RSS (``Maximum resident set size`` of /usr/bin/time: the largest
process of the tree, the CLI itself), the Prefect task-run timeline of the batch (the workspace's
Prefect database: every task and sub-flow run of the process-deletions run, start to end), the
receipt's costs (the retrained reference's wall seconds), and ``uptime``'s load before and after.

    .venv/bin/python scripts/scale.py             # the whole grid (about 40 min on 2 busy cores)
    .venv/bin/python scripts/scale.py --quick     # digits only, 10 and 50 clients (a few minutes)
    .venv/bin/python scripts/scale.py --only synth-c10 --only mnist5k-c10    # some workspaces
    .venv/bin/python scripts/scale.py --plot      # the plots and tables again from scale.json

Results are merged into results/scale/scale.json after every batch (a later run replaces the
workspaces it runs); plots go to docs/img/scale-clients.png and docs/img/scale-requests.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parent.parent
FEDUNLEARN = PROJECT / ".venv" / "bin" / "fedunlearn"
PYTHON = PROJECT / ".venv" / "bin" / "python"
SEED = 0

# Synthetic data where real data runs out: Gaussian blobs, 10 classes, 64 features.
SYNTH_ROWS, SYNTH_FEATURES, SYNTH_CLASSES = 40_000, 64, 10


@dataclass
class Batch:
    ids: int    # sample IDs the batch forgets
    files: int  # request files: 1 (one request naming every ID) or ids (one request per ID)

    @property
    def label(self) -> str:
        return f"{self.ids} IDs in {'1 request' if self.files == 1 else f'{self.files} requests'}"


@dataclass
class Spec:
    dataset: str  # mnist5k | digits | synth
    clients: int
    batches: list[Batch] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.dataset}-c{self.clients}"

    @property
    def scenario(self) -> str:
        return f"{self.dataset}-hfl-c{self.clients}"


def one(ids: int) -> Batch:
    return Batch(ids, 1)


def each(ids: int) -> Batch:
    return Batch(ids, ids)


# The first batch of every workspace forgets 100 IDs in one request: the clients axis compares first
# batches. Later batches of a 10-client workspace give the requests axis (ascending, in the same
# workspace: each starts from the model and data the one before left; the record says how many IDs
# were deleted before it).
FULL = [
    Spec("mnist5k", 10, [one(100), one(1), one(1000), each(100)]),
    Spec("synth", 10, [one(100), one(1), each(100), one(1000), each(1000), one(10000)]),
    Spec("mnist5k", 100, [one(100)]),
    Spec("digits", 10, [one(100), one(1), one(1000)]),
    Spec("digits", 100, [one(100)]),
    Spec("mnist5k", 50, [one(100)]),
    Spec("digits", 50, [one(100)]),
]
# What fitted into 45 minutes on the 2 shared cores of 2026-11-23 (load 10-20 from other jobs):
# docs/BENCHMARKS.md "Scale" says which points of FULL are missing.
MEASURED = [
    Spec("mnist5k", 10, [one(100), one(1), one(1000)]),
    Spec("synth", 10, [each(1000), one(10000)]),
    Spec("mnist5k", 100, [one(100)]),
    Spec("digits", 10, [one(100)]),
    Spec("digits", 100, [one(100)]),
    Spec("mnist5k", 50, [one(100)]),
    Spec("digits", 50, [one(100)]),
]
QUICK = [Spec("digits", 10, [one(100), one(1), each(100)]), Spec("digits", 50, [one(100)])]

ROUNDS = 3        # every scale scenario: 3 FedAvg rounds × 1 local epoch (training and retraining alike)
LOCAL_EPOCHS = 1
AUDIT_EPOCHS = 5


# --- workspace setup ---------------------------------------------------------------------------

def write_synthetic_csv(path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(SEED)
    centers = rng.normal(0.0, 1.0, size=(SYNTH_CLASSES, SYNTH_FEATURES))
    labels = rng.integers(0, SYNTH_CLASSES, size=SYNTH_ROWS)
    features = centers[labels] + rng.normal(0.0, 1.5, size=(SYNTH_ROWS, SYNTH_FEATURES))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write("id," + ",".join(f"f{j}" for j in range(SYNTH_FEATURES)) + ",label\n")
        for i in range(SYNTH_ROWS):
            out.write(f"{i:05d}," + ",".join(f"{v:.5f}" for v in features[i]) + f",{labels[i]}\n")


def scenario_config(params: dict, spec: Spec) -> dict:
    if spec.dataset == "synth":
        base = {"dataset": "synth", "setting": "hfl", "model": "mlp",
                "partition": {"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5, "test_fraction": 0.2},
                "train": {"rounds": 20, "local_epochs": 1, "lr": 0.1, "batch_size": 32}}
    else:
        base = json.loads(json.dumps(params["scenarios"][f"{spec.dataset}-hfl"]))
    base["partition"]["num_clients"] = spec.clients
    base["train"].update(rounds=ROUNDS, local_epochs=LOCAL_EPOCHS)
    return base


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run(command: list[str], env: dict | None = None, timed: bool = False) -> dict:
    """Run a command; with ``timed`` under /usr/bin/time -v (peak RSS)."""
    full = (["/usr/bin/time", "-v"] if timed else []) + [str(c) for c in command]
    started = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - started
    result = {"command": " ".join(str(c) for c in command), "rc": proc.returncode, "wall_seconds": round(wall, 2),
              "stdout": proc.stdout, "stderr": proc.stderr}
    if timed:
        found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        result["peak_rss_mib"] = round(int(found.group(1)) / 1024, 1) if found else None
        # CPU seconds of the whole process tree (CLI, Prefect server, DVC): less at the mercy of the
        # machine's load than wall seconds
        cpu = [re.search(rf"{what} time \(seconds\): ([\d.]+)", proc.stderr) for what in ("User", "System")]
        result["cpu_seconds"] = round(sum(float(c.group(1)) for c in cpu), 1) if all(cpu) else None
    return result


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def setup(spec: Spec, work: Path, train: bool = True) -> tuple[Path, dict]:
    root = work / spec.name
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    init = run([FEDUNLEARN, "init", root])
    if init["rc"]:
        raise RuntimeError(f"init failed: {tail(init['stderr'])}")
    params = yaml.safe_load((root / "params.yaml").read_text())
    if spec.dataset == "synth":
        csv = root / "sources" / "synth.csv"  # outside data/: a user source, where params.yaml points
        write_synthetic_csv(csv)
        params["datasets"] = {"synth": {"source": "csv", "path": str(csv), "label_column": "label",
                                        "id_column": "id"}}
        params["prepare"] = [*params["prepare"], "synth"]
    params["scenarios"][spec.scenario] = scenario_config(params, spec)
    # The audit references are trained in the setup, not in a measured batch: 5 epochs instead of 20
    # keep the setup short. Each batch still scores its attempt against all 4 references.
    params["audit"] = {**params.get("audit", {}), "epochs": AUDIT_EPOCHS}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    info: dict = {"workspace": str(root), "scenario": spec.scenario, "dataset": spec.dataset, "clients": spec.clients,
                  "config": params["scenarios"][spec.scenario]}
    if not train:
        prepared = run([FEDUNLEARN, "--root", root, "prepare", "--scenario", spec.scenario])
        if prepared["rc"]:
            raise RuntimeError(f"prepare failed: {tail(prepared['stdout'] + prepared['stderr'])}")
        return root, info
    train = run([FEDUNLEARN, "--root", root, "train", "--scenario", spec.scenario], timed=True)
    info["train"] = {k: train[k] for k in ("command", "rc", "wall_seconds", "peak_rss_mib", "cpu_seconds")}
    info["train"]["flow"] = flow_timeline(root, "train-federated")
    if train["rc"]:
        raise RuntimeError(f"train failed: {tail(train['stdout'] + train['stderr'])}")
    # The audit references, trained once before any measured batch (process-deletions trains them in
    # its first batch when a scenario has none): the flow process-deletions would run, in-process.
    refs = run([PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                "from cli.common import prepare_flow_run; prepare_flow_run(); "
                "from flows.audit import audit_references; print(audit_references(scenario=sys.argv[2], "
                "root=sys.argv[3]))", PROJECT, spec.scenario, root],
               env={"PREFECT_HOME": str(root / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "GX_ANALYTICS_ENABLED": "False",
                    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"})
    info["audit_references"] = {"rc": refs["rc"], "wall_seconds": refs["wall_seconds"], "out": tail(refs["stdout"], 2)}
    if refs["rc"]:
        raise RuntimeError(f"audit references failed: {tail(refs['stdout'] + refs['stderr'])}")
    ids = run([FEDUNLEARN, "--root", root, "ids", "--scenario", spec.scenario])
    info["training_ids"] = ids["stdout"].split()
    return root, info


# --- one batch ---------------------------------------------------------------------------------

def submit(root: Path, spec: Spec, batch: Batch, ids: list[str]) -> dict:
    started = time.perf_counter()
    if batch.files == 1:
        ids_file = root / ".tmp" / f"ids-{batch.ids}.txt"
        ids_file.write_text("\n".join(ids) + "\n")
        result = run([FEDUNLEARN, "--root", root, "request", "samples", "--scenario", spec.scenario,
                      "--ids-file", ids_file])
        if result["rc"]:
            raise RuntimeError(f"request failed: {tail(result['stderr'])}")
        how = "fedunlearn request samples --ids-file (one CLI call)"
    else:
        sys.path.insert(0, str(PROJECT))
        from fedunlearn.requests.folders import RequestFolders
        from fedunlearn.requests.inbox import submit_request
        from fedunlearn.requests.model import RequestKind, build_request

        folders = RequestFolders.create(root)
        for sample_id in ids:
            submit_request(folders, build_request({"kind": RequestKind.SAMPLE, "scenario": spec.scenario,
                                                   "sample_ids": [sample_id]}))
        how = "fedunlearn.requests.inbox.submit_request per ID, in this script's process"
    return {"how": how, "seconds": round(time.perf_counter() - started, 2)}


FLOW_LINE = re.compile(r"flow ([\d.]+) s: compute ([\d.]+) s \(.*?\), orchestration ([\d.]+) s")


def run_batch(root: Path, spec: Spec, batch: Batch, ids: list[str], deleted_before: int, total: int) -> dict:
    row: dict = {"workspace": spec.name, "dataset": spec.dataset, "clients": spec.clients, "ids": batch.ids,
                 "files": batch.files, "label": batch.label, "deleted_before": deleted_before,
                 "training_samples_before": total - deleted_before,
                 "ledger_entries_before": sum(1 for _ in (root / "data/ledger/ledger.jsonl").open())}
    row["submit"] = submit(root, spec, batch, ids)
    row["load_before"] = load()
    row["started_at"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    result = run([PYTHON, __file__, "--process-batch", root, spec.scenario], timed=True)
    row["load_after"] = load()
    row.update({k: result[k] for k in ("command", "rc", "wall_seconds", "peak_rss_mib", "cpu_seconds")})
    row["cli_wall_seconds"] = row.pop("wall_seconds")
    out = result["stdout"]
    found = FLOW_LINE.search(out)
    if found:
        row["flow_seconds"], row["compute_seconds"], row["orchestration_seconds"] = map(float, found.groups())
    attempts = re.search(r"^attempts: (.*)$", out, re.M)
    row["attempts"] = attempts.group(1) if attempts else None
    receipt = re.search(r"^receipt: (\S+)", out, re.M)
    if receipt:
        document = json.loads((root / receipt.group(1)).read_text())
        costs = document.get("costs", {})
        row["unlearn_seconds"] = (costs.get("unlearned") or {}).get("wall_seconds")
        row["retrain_seconds"] = (costs.get("retrained") or {}).get("wall_seconds")
        row["deleted_samples"] = document.get("deleted_samples")
        row["erasure_files"] = (document.get("erasure") or {}).get("files_scanned")
        row["erasure_bytes"] = (document.get("erasure") or {}).get("bytes_scanned")
    if result["rc"]:
        row["error"] = tail(out + result["stderr"], 25)
    row["timeline"] = flow_timeline(root, "process-deletions")
    row.update(stage_seconds(row["timeline"]))
    return row


def process_batch(root: Path, scenario: str) -> int:
    """``fedunlearn --root ROOT process --scenario S --retrain`` (cli.pipeline.run_process, line for
    line) with one change: the escalation is pinned to PUF-Special, then exact retrain (the flow's
    ``escalation`` parameter, a form field in the Prefect UI). The default chain (PUF-Special,
    PUF-Special stronger, PUF-Regular, exact retrain) stops at the first attempt whose gates pass,
    so its length follows the audit's statistical power on the batch, not the batch's size: 1 to 4
    unlearning attempts in one curve. Pinned, every batch unlearns once; when that attempt's gates
    are not passed, the exact retrain is the reference the batch trained anyway (no second training)."""
    sys.path.insert(0, str(PROJECT))
    import cli

    root = cli.workspace_root(argparse.Namespace(root=str(root)))
    cli.configure_environment(root)
    from cli.common import describe_batch, erasure_status, prepare_flow_run, print_summary
    from fedunlearn.unlearning.escalation import Attempt
    from flows.process import process_deletions
    from stores.workspace import init_workspace

    init_workspace(root)
    prepare_flow_run()
    result = process_deletions(scenario=scenario, root=str(root), retrain_reference=True,
                               escalation=[Attempt(method="puf-special"), Attempt(method="retrain")])
    print_summary(result)
    if result.receipt is None:
        return 0
    print(describe_batch(result))
    return erasure_status(result.erasure)


# --- the intake path alone, up to 10,000 request files ---------------------------------------------

def intake_micro(counts: list[int], work: Path) -> dict:
    """The steps of intake-requests, apply-deletions' ledger append and close-batch's filing, in this
    process without Prefect (the functions the tasks run, ``.fn``), timed one by one for k request
    files of one ID each: batch A on an empty ledger, then batch B of k more files on the ledger A
    left (what the ledger's and the journals' history adds). A fresh synthetic workspace, prepared
    only (``fedunlearn prepare``: no model is needed to take requests)."""
    import shutil

    sys.path.insert(0, str(PROJECT))
    import cli

    cli.configure_environment(work)  # as the CLI does: GX analytics off (else every validation phones home)
    spec = Spec("synth", 10)
    base = work / "intake-base"
    if not base.exists():
        root, _ = setup(spec, work, train=False)
        root.rename(base)
    from cli.data import sample_ids
    from fedunlearn.requests.batch import BatchStatus, plan_batch, new_batch_id
    from fedunlearn.requests.catalog import load_catalog
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import file_processed, submit_request
    from fedunlearn.requests.integrity import ensure_intact
    from fedunlearn.requests.model import RequestKind, build_request
    from tasks.requests import append_ledger, open_batch, read_inbox
    from tasks.validation import check_subjects
    from stores.workspace import Workspace
    import great_expectations  # noqa: F401  (imported before the clock starts, as the CLI preloads it)

    rows = []
    for k in counts:
        root = work / f"intake-{k}"
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(base, root, symlinks=True)
        ws = Workspace.open(root)
        ids = sample_ids(root, spec.scenario)
        random.Random(f"{SEED}-intake-{k}").shuffle(ids)
        for phase, chosen in (("A (empty ledger)", ids[:k]), ("B (ledger holds A)", ids[k:2 * k])):
            row: dict = {"files": k, "phase": phase, "ledger_entries_before": len(ws.ledger.entries()),
                         "load_before": load()}
            clock = time.perf_counter()

            def lap(name: str) -> None:
                nonlocal clock
                now = time.perf_counter()
                row[name] = round(now - clock, 3)
                clock = now

            folders = RequestFolders.create(root)
            for sample_id in chosen:
                submit_request(folders, build_request({"kind": RequestKind.SAMPLE, "scenario": spec.scenario,
                                                       "sample_ids": [sample_id]}))
            lap("submit")
            ensure_intact(ws.folders, ws.ledger)
            lap("ledger_check")
            triage = read_inbox(ws, spec.scenario)
            lap("inbox_read")
            deleted = ws.ledger.deleted_ids()
            catalog = load_catalog(spec.scenario, ws.root, deleted)
            lap("catalog")
            reasons = check_subjects(triage.pending, catalog, deleted, ws.data_version(spec.scenario))
            lap("gx_validate")
            plan = plan_batch(new_batch_id(), [p for p in triage.pending if p.request.request_id not in reasons],
                              catalog)
            lap("plan")
            record = open_batch.fn(ws, plan, [], False)
            lap("journal")
            record = append_ledger.fn(ws, record)
            lap("ledger_append")
            moved = [file_processed(ws.folders, item).name for item in read_inbox(ws, spec.scenario).applied]
            record.advance(ws.folders, BatchStatus.COMPLETE, processed_files=moved)
            lap("file_processed")
            row["load_after"] = load()
            row["total_without_submit"] = round(sum(v for key, v in row.items() if key in INTAKE_STEPS[1:]), 3)
            print(f"   intake k={k} {phase}: " + ", ".join(f"{key} {row[key]}" for key in INTAKE_STEPS)
                  + f" (load {row['load_before']}->{row['load_after']})", flush=True)
            rows.append(row)
    return {"rows": rows, "workspace": str(base)}


INTAKE_STEPS = ("submit", "ledger_check", "inbox_read", "catalog", "gx_validate", "plan", "journal", "ledger_append",
                "file_processed")


# --- the Prefect timeline ------------------------------------------------------------------------

def _when(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def flow_timeline(root: Path, flow_name: str) -> dict:
    """Seconds per task and sub-flow (by name, summed over runs) of the latest ``flow_name`` run in
    the workspace's Prefect database."""
    db = root / ".prefect" / "prefect.db"
    if not db.is_file():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        top = con.execute("SELECT fr.id, fr.start_time, fr.end_time FROM flow_run fr JOIN flow f ON fr.flow_id = f.id "
                          "WHERE f.name = ? AND fr.start_time IS NOT NULL ORDER BY fr.start_time DESC LIMIT 1",
                          (flow_name,)).fetchone()
        if top is None:
            return {}
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(name: str, start, end) -> None:
            if start and end:
                totals[name] = totals.get(name, 0.0) + (_when(end) - _when(start)).total_seconds()
                counts[name] = counts.get(name, 0) + 1

        frontier = [top[0]]
        while frontier:
            flow_run = frontier.pop()
            for task_id, name, start, end in con.execute(
                    "SELECT id, name, start_time, end_time FROM task_run WHERE flow_run_id = ?", (flow_run,)):
                child = con.execute("SELECT fr.id, f.name, fr.start_time, fr.end_time FROM flow_run fr JOIN flow f "
                                    "ON fr.flow_id = f.id WHERE fr.parent_task_run_id = ?", (task_id,)).fetchone()
                if child:
                    add(f"flow:{child[1]}", child[2], child[3])
                    frontier.append(child[0])
                else:
                    add(re.sub(r"-[0-9a-z]{3}$", "", name), start, end)
    flow_seconds = (_when(top[2]) - _when(top[1])).total_seconds() if top[2] else None
    return {"flow_seconds": flow_seconds, "seconds": {k: round(v, 3) for k, v in sorted(totals.items())},
            "runs": counts}


def stage_seconds(timeline: dict) -> dict:
    s = timeline.get("seconds", {})
    get = lambda *names: round(sum(s.get(n, 0.0) for n in names), 3)  # noqa: E731
    return {
        "intake_seconds": get("intake-requests"),          # ledger check, inbox read, GX, batch journal
        "ledger_check_seconds": get("recover-interrupted-batches"),
        "inbox_read_seconds": get("collect-inbox"),
        "validate_seconds": get("validate-requests"),
        "ledger_append_seconds": get("append-ledger"),
        "close_batch_seconds": get("close-batch"),               # request files to processed/
        "fingerprints_seconds": get("capture-fingerprints"),
        "new_version_seconds": get("reproduce-versions"),
        "erasure_seconds": get("verify-erasure"),
        "apply_seconds": get("apply-deletions"),
        "unlearn_register_seconds": get("unlearn-and-register"),
        "retrain_flow_seconds": get("flow:retrain-reference"),
        "promote_seconds": get("promote-and-receipt"),
        # ledger/inbox: everything that reads, checks or writes the requests and the ledger
        "ledger_inbox_seconds": get("intake-requests", "append-ledger", "close-batch"),
    }


# --- grid ------------------------------------------------------------------------------------------

def run_spec(spec: Spec, work: Path, results: dict, out: Path) -> None:
    print(f"== {spec.name}: setup (load {load()})", flush=True)
    started = time.perf_counter()
    root, info = setup(spec, work)
    training_ids = info.pop("training_ids")
    info["setup_seconds"] = round(time.perf_counter() - started, 1)
    print(f"   trained in {info['train']['wall_seconds']} s (CLI), {len(training_ids)} training IDs, "
          f"audit references {info['audit_references']['wall_seconds']} s", flush=True)
    results["workspaces"][spec.name] = info
    results["batches"] = [b for b in results["batches"] if b["workspace"] != spec.name]
    rng = random.Random(f"{SEED}-{spec.name}")
    remaining = list(training_ids)
    rng.shuffle(remaining)
    deleted = 0
    for batch in spec.batches:
        chosen, remaining = remaining[:batch.ids], remaining[batch.ids:]
        print(f"   batch {batch.label} (load {load()}) ...", flush=True)
        row = run_batch(root, spec, batch, chosen, deleted, len(training_ids))
        deleted += batch.ids
        results["batches"].append(row)
        save(results, out)
        print(f"   rc {row['rc']}: flow {row.get('flow_seconds')} s = compute {row.get('compute_seconds')} + orch "
              f"{row.get('orchestration_seconds')}; ledger/inbox {row['ledger_inbox_seconds']} s; retrain "
              f"{row.get('retrain_seconds')} s; RSS {row['peak_rss_mib']} MiB; CLI {row['cli_wall_seconds']} s; "
              f"load {row['load_before']}->{row['load_after']}", flush=True)
        if row["rc"]:
            print(row.get("error", ""), flush=True)
            break


def save(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def machine() -> dict:
    import platform

    import torch

    return {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                                          / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.is_available()}


# --- plots and tables ------------------------------------------------------------------------------

COLORS = {"mnist5k": "tab:blue", "digits": "tab:orange", "synth": "tab:green"}


def _panels(fig, rows, x_of, series, xlabel: str, log_x: bool) -> None:
    metrics = [("latency split", [("compute_seconds", "compute", "-"), ("orchestration_seconds", "orchestration",
                                                                          "--"),
                                       ("cpu_seconds", "CPU s of the CLI's process tree", ":")], "seconds"),
               ("peak memory (CLI process)", [("peak_rss_mib", "peak RSS", "-")], "MiB"),
               ("ledger / inbox and erasure", [("ledger_inbox_seconds", "ledger + inbox", "-"),
                                               ("erasure_seconds", "erasure scan + fingerprints", ":")], "seconds"),
               ("retraining the reference", [("retrain_seconds", "retrain (registered wall s)", "-")], "seconds")]
    axes = fig.subplots(2, 2)
    for ax, (title, keys, unit) in zip(axes.flat, metrics):
        for name, selected in series.items():
            selected = sorted(selected, key=x_of)
            dataset = selected[0]["dataset"]
            xs = [x_of(r) for r in selected]
            for key, what, style in keys:
                ys = [(r.get(key) or 0.0) + (r.get("fingerprints_seconds", 0.0) if key == "erasure_seconds" else 0.0)
                      if r.get(key) is not None else float("nan") for r in selected]
                ax.plot(xs, ys, style, marker="o" if "files" not in name else "s", color=COLORS[dataset],
                        alpha=1.0 if "files" not in name else 0.6, label=f"{name}: {what}")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit)
        if log_x:
            ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)


def plot(results: dict) -> list[Path]:
    from matplotlib.figure import Figure

    rows = [r for r in results["batches"] if not r["rc"]]
    written = []
    firsts = [r for r in rows if r["deleted_before"] == 0 and r["files"] == 1 and r["ids"] == 100]
    series = {d: [r for r in firsts if r["dataset"] == d] for d in ("mnist5k", "digits")}
    series = {k: v for k, v in series.items() if v}

    def panels(series, x, label: str, log: bool, title: str, name: str) -> None:
        if series:
            fig = Figure(figsize=(11, 8), layout="constrained")
            _panels(fig, rows, x, series, label, log)
            fig.suptitle(f"{title} (process --retrain, 3 FedAvg rounds)")
            path = PROJECT / "docs" / "img" / name
            fig.savefig(path, dpi=110)
            written.append(path)

    panels(series, lambda r: r["clients"], "clients (first batch: 100 IDs in 1 request)", False,
           "Deletion batch vs. number of clients", "scale-clients.png")
    ten = [r for r in rows if r["clients"] == 10]
    series = {}
    for d in ("mnist5k", "digits", "synth"):
        single = [r for r in ten if r["dataset"] == d and r["files"] == 1]
        multi = [r for r in ten if r["dataset"] == d and r["files"] > 1]
        if single:
            series[f"{d} (1 request)"] = single
        if multi:
            series[f"{d} (k files)"] = multi
    panels(series, lambda r: r["ids"], "sample IDs forgotten in the batch (10 clients)", True,
           "Deletion batch vs. forget-set size", "scale-requests.png")
    steps = results.get("intake", {}).get("rows", [])
    if steps:
        fig = Figure(figsize=(11, 4.5), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, phase in zip(axes, ("A (empty ledger)", "B (ledger holds A)")):
            selected = sorted((r for r in steps if r["phase"] == phase), key=lambda r: r["files"])
            xs = [r["files"] for r in selected]
            for key in INTAKE_STEPS:
                ax.plot(xs, [max(r[key], 1e-3) for r in selected], marker="o", label=key,
                        linestyle="--" if key == "submit" else "-")
            ax.plot(xs, [x * 1e-3 for x in xs], color="grey", linewidth=0.8, linestyle=":", label="1 ms per file")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"batch {phase}")
            ax.set_xlabel("request files of one ID each (synthetic, 40,000 rows)")
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("seconds (floored at 1 ms)")
        axes[1].legend(fontsize=7)
        fig.suptitle("The intake path step by step (scale.py --intake, no Prefect): ledger, inbox, validation")
        path = PROJECT / "docs" / "img" / "scale-intake.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def tables(results: dict) -> str:
    head = ("| workspace | batch | deleted before | flow s | compute s | orch. s | CLI wall s | CPU s | peak RSS MiB | "
            "intake s | ledger append s | close (files) s | fingerprints s | erasure s | new version s | "
            "retrain s | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results["batches"]:
        lines.append(
            f"| {r['workspace']} | {r['label']} | {r['deleted_before']} | {fmt(r.get('flow_seconds'))} | "
            f"{fmt(r.get('compute_seconds'))} | {fmt(r.get('orchestration_seconds'))} | {fmt(r['cli_wall_seconds'])} | "
            f"{fmt(r.get('cpu_seconds'))} | "
            f"{fmt(r['peak_rss_mib'], 0)} | {fmt(r['intake_seconds'], 2)} | {fmt(r['ledger_append_seconds'], 2)} | "
            f"{fmt(r['close_batch_seconds'], 2)} | {fmt(r['fingerprints_seconds'], 2)} | "
            f"{fmt(r['erasure_seconds'], 2)} | {fmt(r['new_version_seconds'], 2)} | {fmt(r.get('retrain_seconds'))} | "
            f"{r['load_before']}→{r['load_after']} |" + (f" rc {r['rc']}" if r["rc"] else ""))
    return "\n".join(lines)


def intake_table(results: dict) -> str:
    rows = results.get("intake", {}).get("rows", [])
    head = ("| files | batch | ledger entries before | " + " | ".join(f"{k} s" for k in INTAKE_STEPS)
            + " | total without submit s | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['files']} | {r['phase']} | {r['ledger_entries_before']} | "
                     + " | ".join(f"{r[k]:.3f}" for k in INTAKE_STEPS)
                     + f" | {r['total_without_submit']:.3f} | {r['load_before']}→{r['load_after']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits at 10 and 50 clients only")
    parser.add_argument("--measured", action="store_true", help="the subset measured for docs/BENCHMARKS.md")
    parser.add_argument("--only", action="append", metavar="NAME", help="workspaces to run (e.g. synth-c10)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/scale"), help="where the workspaces go")
    parser.add_argument("--out", type=Path, default=PROJECT / "results" / "scale")
    parser.add_argument("--plot", action="store_true", help="only redraw the plots and print the tables")
    parser.add_argument("--intake", type=int, nargs="+", metavar="K",
                        help="only the intake path, timed step by step, for K request files of one ID each "
                             "(e.g. --intake 1 100 1000 10000)")
    parser.add_argument("--process-batch", nargs=2, metavar=("ROOT", "SCENARIO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_batch:
        sys.exit(process_batch(Path(args.process_batch[0]), args.process_batch[1]))
    if args.intake:
        path = args.out / "scale.json"
        results = json.loads(path.read_text()) if path.is_file() else {"workspaces": {}, "batches": []}
        started = time.perf_counter()
        results["intake"] = intake_micro(args.intake, args.work)
        results["intake"]["seconds"] = round(time.perf_counter() - started, 1)
        save(results, args.out)
        print(intake_table(results))
        return
    path = args.out / "scale.json"
    results = json.loads(path.read_text()) if path.is_file() else {"workspaces": {}, "batches": []}
    if not args.plot:
        results["machine"] = machine()
        results["rounds"], results["local_epochs"] = ROUNDS, LOCAL_EPOCHS
        specs = QUICK if args.quick else MEASURED if args.measured else FULL
        if args.only:
            specs = [s for s in specs if s.name in args.only]
            specs = list({s.name: s for s in specs}.values())
        started = time.perf_counter()
        for spec in specs:
            try:
                run_spec(spec, args.work, results, args.out)
            except RuntimeError as err:
                print(f"   {spec.name} failed: {err}", flush=True)
                results.setdefault("failures", {})[spec.name] = str(err)
            save(results, args.out)
        print(f"grid: {time.perf_counter() - started:.0f} s", flush=True)
    for written in plot(results):
        print(f"wrote {written.relative_to(PROJECT)}")
    print(tables(results))


if __name__ == "__main__":
    main()
