"""Flow ``benchmark``: every method against retraining, in the same run, on the same data.

    reproduce + validate data ─▶ setup (request → forget IDs, optional backdoor) ─▶ original
    (trained or reused) ─▶ retrain ─▶ each method from the same original ─▶ evaluate all
    ─▶ results.json / results.md / plots / certificates ─▶ MLflow (one child run per row)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from fedunlearn.benchmark import yardstick
from fedunlearn.benchmark.spec import parse_request
from fedunlearn.device import intra_op_threads
from fedunlearn.evaluation.records import ResultRow
from fedunlearn.training import prepare_unlearning, trained
from fedunlearn.unlearning import available_methods
from fedunlearn.unlearning.escalation import is_exact_retrain
from flows.results import BenchmarkResult
from tasks.benchmark import audit_ulira, log_benchmark, train_or_reuse_original, write_report
from tasks.data import command_device, load_data, reproduce_data, validate_partition
from tasks.evaluation import evaluate
from tasks.unlearning import unlearn
from stores.workspace import ScenarioScope, Workspace


def select_methods(methods: str, setting: str, kind: str) -> list[str]:
    """``all`` = every method supporting the setting and request kind; retrain always runs."""
    supported = available_methods(setting=setting, kind=kind)
    chosen = supported if methods.strip() == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in supported]
    if unknown:
        raise ValueError(f"method(s) {unknown} do not support {setting} {kind} requests; available: "
                         f"{', '.join(supported)}")
    return [m for m in chosen if not is_exact_retrain(m)]



def with_protocol(ws: Workspace, scenario: str, rounds: int | None, local_epochs: int | None) -> Workspace:
    """``ws`` as the command sees it, the scenario's training protocol overridden (original, retrain
    and recovery alike); params.yaml and the opened workspace unchanged."""
    return ScenarioScope(ws, scenario).with_training(rounds, local_epochs).ws


def protocol(cfg, data_version: str, seed: int, forget_samples: int, one_off: dict[str, float]) -> dict:
    """The report header's training protocol, data version and one-off preparation seconds."""
    return {"rounds": cfg.train.rounds, "local_epochs": cfg.train.local_epochs, "data_version": data_version,
            "seed": seed, "forget_samples": forget_samples, **{k: round(v, 3) for k, v in one_off.items()}}


def add_ulira(setup, records: list[dict], attacks: dict, retrain_test_acc: float, method_options: dict,
              pairs: int) -> None:
    """The per-example U-LiRA audit of each method's row (``pairs`` shadow federations each)."""
    for record in records:
        result = audit_ulira(setup, record["method"], retrain_test_acc, method_options.get(record["method"], {}), pairs)
        attacks[record["method"]]["ulira"] = result
        record.update({f"ulira_{k}": v for k, v in result.summary().items()})


@dataclass
class Compared:
    """Every row of the benchmark with what the report draws from: evaluations, histories, certificates."""
    rows: list[ResultRow]
    evaluations: dict
    histories: dict
    certificates: dict
    retrain_test_acc: float


def compare_methods(setup, scenario: str, spec, original, reused: bool, chosen: list[str],
                    method_options: dict) -> Compared:
    """The original, the retrain and each chosen method from the same original, evaluated against the
    retrain: one row each."""
    evaluator = setup.evaluator()

    def row(name: str, evaluation, cost, certificate, notes, retrain=(None, None)) -> ResultRow:
        return ResultRow(name, scenario, spec.text, evaluation, cost, certificate.guarantee,
                         setup.forget_set.num_forget, *retrain, notes)

    retrain_outcome, retrain_certificate = unlearn(setup, original.state, "retrain", None,
                                                   method_options.get("retrain", {}), yardstick.BENCHMARK_TIMINGS)
    retrained = evaluate(evaluator, "retrain", retrain_model := setup.fed_state.model_from(retrain_outcome.state))
    print(f"retrain: test_acc={retrained.test_acc:.4f} in {retrain_outcome.cost.wall_seconds:.1f} s")
    against = (retrain_outcome.cost, retrained)

    original_eval = evaluate(evaluator, "original", setup.fed_state.model_from(original.state), retrain_model)
    compared = Compared(
        [row("original", original_eval, original.cost, yardstick.original_certificate(setup), {"reused": reused},
             (None, retrained)),
         row("retrain", retrained, retrain_outcome.cost, retrain_certificate, retrain_outcome.notes, against)],
        {"original": original_eval, "retrain": retrained},
        {"original (training)": original.history, "retrain": retrain_outcome.history},
        {"original": yardstick.original_certificate(setup), "retrain": retrain_certificate}, retrained.test_acc)
    for name in chosen:
        outcome, certificate = unlearn(setup, original.state, name, retrained.test_acc,
                                       method_options.get(name, {}), yardstick.BENCHMARK_TIMINGS)
        evaluation = evaluate(evaluator, name, setup.fed_state.model_from(outcome.state), retrain_model)
        compared.rows.append(row(name, evaluation, outcome.cost, certificate, outcome.notes, against))
        compared.evaluations[name], compared.histories[name] = evaluation, outcome.history
        compared.certificates[name] = certificate
        print(f"{name}: test_acc={evaluation.test_acc:.4f} forget_acc={evaluation.forget_acc:.4f} "
              f"bd_asr={evaluation.bd_asr} in {outcome.cost.wall_seconds:.2f} s [{certificate.guarantee}]")
    return compared


@flow(name="benchmark", log_prints=True)
def benchmark(scenario: str = "mnist5k-hfl", request: str = "client:largest", methods: str = "all",
              out: str = "results/benchmark", backdoor: bool = False, root: str = ".",
              device: str | None = None, method_options: dict[str, dict] | None = None,
              ulira_pairs: int = 0, rounds: int | None = None, local_epochs: int | None = None) -> BenchmarkResult:
    """Every unlearning method against retraining, from the same original on the same request.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        request: what to forget: client:<id>[,<id>...] | class:<label>[,<label>...] |
            samples:<fraction>@<client id|all>; 'largest' may stand for a client id.
        methods: comma-separated method names, or 'all': every method that supports the scenario's
            setting and the request's kind (the retrain always runs).
        out: the directory results.json, results.md, the plots and certificates/ are written to.
        backdoor: put the 4×4 trigger with target label 0 on the forget samples before training.
        root: the workspace (the directory holding params.yaml).
        device: auto, cpu, cuda or mps; empty: params.yaml's ``device``.
        method_options: hyperparameters per method, e.g. {"ga": {"recovery_rounds": 0}}; empty: each
            method's defaults.
        ulira_pairs: > 0 adds the per-example U-LiRA audit with this many pairs of shadow federations
            per method (2·pairs trainings each: small scenarios only); 0: no U-LiRA audit.
        rounds: federated rounds of the original, the retrain and every method's recovery; empty: the
            scenario's train.rounds.
        local_epochs: local epochs per round, likewise; empty: the scenario's train.local_epochs.
    """
    started = time.perf_counter()
    ws = with_protocol(Workspace.open(root), scenario, rounds, local_epochs)
    cfg = ws.scenario(scenario)
    spec = parse_request(request)
    chosen, method_options = select_methods(methods, cfg.setting, spec.kind), method_options or {}
    with intra_op_threads(cfg.threads):
        data_version = reproduce_data(ws, scenario)
        validate_partition(ws, scenario)
        dev = command_device(ws, device)
        setup = yardstick.build_setup(scenario, load_data(ws, scenario, dev), spec, backdoor=backdoor)
        print(f"request {spec.text}: {setup.forget_set.num_forget} samples to forget at clients "
              f"{setup.forget_set.affected_clients}; methods: retrain, {', '.join(chosen)}")

        original, reused = train_or_reuse_original(ws, setup, data_version, cfg.model)
        print(f"original model {'reused' if reused else 'trained'} ({original.cost.wall_seconds:.1f} s of training)")
        one_off = prepare_unlearning(trained(setup.fed_state, original))
        compared = compare_methods(setup, scenario, spec, original, reused, chosen, method_options)

        records = [r.to_dict() for r in compared.rows]
        attacks = {name: dict(evaluation.evidence.attacks) for name, evaluation in compared.evaluations.items()}
        add_ulira(setup, records[1:] if ulira_pairs else [], attacks, compared.retrain_test_acc, method_options,
                  ulira_pairs)
        header = {"scenario": scenario, "request": spec.text, "backdoor": backdoor, "device": str(dev),
                  **protocol(cfg, data_version, ws.params.seed, setup.forget_set.num_forget, one_off),
                  "flow_seconds": round(time.perf_counter() - started, 1)}
        files = write_report(Path(out).resolve(), records, attacks, compared.histories, header,
                             compared.certificates)
        log_benchmark(ws, scenario, records, files, header)
    return BenchmarkResult(records)
