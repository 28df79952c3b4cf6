"""Flow ``benchmark``: every method against retraining, in the same run, on the same data.

    reproduce + validate data ─▶ setup (request → forget IDs, optional backdoor) ─▶ original
    (trained or reused) ─▶ retrain ─▶ each method from the same original ─▶ evaluate all
    ─▶ results.json / results.md / plots / certificates ─▶ MLflow (one child run per row)
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from fedunlearn.benchmark import runner
from fedunlearn.benchmark.settings import prepare_unlearning
from fedunlearn.benchmark.spec import parse_request
from fedunlearn.config import load_params
from fedunlearn.device import intra_op_threads, resolve_device
from fedunlearn.unlearning import available_methods
from tasks.benchmark import (audit_ulira, build_evaluator, evaluate, log_benchmark, train_or_reuse_original, unlearn,
                             write_report)
from tasks.data import load_federation, reproduce_data, validate_partition


def select_methods(methods: str, setting: str, kind: str) -> list[str]:
    """``all`` = every method supporting the setting and request kind; retrain always runs."""
    supported = available_methods(setting=setting, kind=kind)
    chosen = supported if methods.strip() == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in supported]
    if unknown:
        raise ValueError(f"method(s) {unknown} do not support {setting} {kind} requests; available: "
                         f"{', '.join(supported)}")
    return [m for m in chosen if m != "retrain"]


@flow(name="benchmark", log_prints=True)
def benchmark(scenario: str = "mnist5k-hfl", request: str = "client:largest", methods: str = "all",
              out: str = "results/benchmark", backdoor: bool = False, root: str = ".",
              device: str | None = None, method_options: dict[str, dict] | None = None,
              ulira_pairs: int = 0, rounds: int | None = None, local_epochs: int | None = None) -> list[dict]:
    """``ulira_pairs`` > 0 adds the per-example U-LiRA audit (2·pairs shadow federations per
    method: for small scenarios). ``rounds`` / ``local_epochs`` override the scenario's training
    protocol (original, retrain and every method's recovery use the same one)."""
    started = time.perf_counter()
    workspace = Path(root).resolve()
    params = load_params(workspace / "params.yaml")
    overrides = {k: v for k, v in {"rounds": rounds, "local_epochs": local_epochs}.items() if v is not None}
    if overrides:
        train = params.scenarios[scenario].train.model_copy(update=overrides)
        params.scenarios[scenario] = params.scenarios[scenario].model_copy(update={"train": train})
    cfg = params.scenario(scenario)
    spec = parse_request(request)
    chosen = select_methods(methods, cfg.setting, spec.kind)
    method_options = method_options or {}

    with intra_op_threads(cfg.threads):
        data_version = reproduce_data(workspace, scenario)
        validate_partition(workspace, scenario)
        dev = resolve_device(device or params.device)
        setup = runner.build_setup(scenario, load_federation(workspace, scenario, params, dev), spec, backdoor=backdoor)
        print(f"request {spec.text}: {setup.batch.num_forget} samples to forget at clients "
              f"{setup.batch.affected_clients}; methods: retrain, {', '.join(chosen)}")

        original, reused = train_or_reuse_original(workspace, setup, data_version, cfg.model)
        print(f"original model {'reused' if reused else 'trained'} ({original.cost.wall_seconds:.1f} s of training)")
        one_off = prepare_unlearning(setup.fed_state, original.state)
        evaluator = build_evaluator(setup)
        retrain_outcome, retrain_certificate = unlearn(setup, original.state, "retrain", None,
                                                       method_options.get("retrain", {}), runner.BENCHMARK_TIMINGS)
        retrain_model = setup.fed_state.model_from(retrain_outcome.state)
        retrain_metrics, retrain_attacks = evaluate(evaluator, "retrain", retrain_model, None)
        print(f"retrain: test_acc={retrain_metrics['test_acc']:.4f} in {retrain_outcome.cost.wall_seconds:.1f} s")

        original_metrics, original_attacks = evaluate(evaluator, "original", setup.fed_state.model_from(original.state),
                                                      retrain_model)
        rows = [runner.make_row(setup, "original", original_metrics, original.cost, runner.original_certificate(setup),
                                None, retrain_metrics, {"reused": reused}),
                runner.make_row(setup, "retrain", retrain_metrics, retrain_outcome.cost, retrain_certificate,
                                retrain_outcome.cost, retrain_metrics, retrain_outcome.notes)]
        attacks = {"original": original_attacks, "retrain": retrain_attacks}
        histories = {"original (training)": original.history, "retrain": retrain_outcome.history}
        certificates = {"original": runner.original_certificate(setup), "retrain": retrain_certificate}
        for name in chosen:
            outcome, certificate = unlearn(setup, original.state, name, retrain_metrics["test_acc"],
                                           method_options.get(name, {}), runner.BENCHMARK_TIMINGS)
            metrics, attacks[name] = evaluate(evaluator, name, setup.fed_state.model_from(outcome.state), retrain_model)
            rows.append(runner.make_row(setup, name, metrics, outcome.cost, certificate, retrain_outcome.cost,
                                        retrain_metrics, outcome.notes))
            histories[name] = outcome.history
            certificates[name] = certificate
            print(f"{name}: test_acc={metrics['test_acc']:.4f} forget_acc={metrics['forget_acc']:.4f} "
                  f"bd_asr={metrics['bd_asr']} in {outcome.cost.wall_seconds:.2f} s [{certificate.guarantee}]")

        for row in rows[1:] if ulira_pairs else []:
            result = audit_ulira(setup, row["method"], retrain_metrics["test_acc"],
                                 method_options.get(row["method"], {}), ulira_pairs)
            attacks[row["method"]]["ulira"] = result
            row.update({f"ulira_{k}": v for k, v in result.summary().items()})
        header = {"scenario": scenario, "request": spec.text, "backdoor": backdoor, "device": str(dev),
                  "rounds": cfg.train.rounds, "local_epochs": cfg.train.local_epochs,
                  "data_version": data_version, "seed": params.seed, "forget_samples": setup.batch.num_forget,
                  **{k: round(v, 3) for k, v in one_off.items()},
                  "flow_seconds": round(time.perf_counter() - started, 1)}
        files = write_report(Path(out).resolve(), rows, attacks, histories, header, certificates)
        log_benchmark(workspace, scenario, rows, files, header)
    return rows
