"""Background preloading (tasks/preload.py): steps run in order, a failing step costs only its head
start, ``wait`` joins, and concurrent model exports take turns (torch.export is not thread-safe)."""

import threading

from tasks import preload
from stores.registry import prepare_model_logging


def test_steps_run_in_order_and_a_failure_only_logs(caplog):
    ran = []

    def broken() -> None:
        raise RuntimeError("no such library")

    preload.in_background(lambda: ran.append("first"), broken, lambda: ran.append("last"))
    preload.wait()
    assert ran == ["first", "last"]
    assert "preloading broken failed: no such library" in caplog.text


def test_model_logging_probes_in_two_threads_do_not_collide():
    errors = []

    def probe() -> None:
        try:
            prepare_model_logging()
        except Exception as err:  # the assertion below reports it
            errors.append(err)

    threads = [threading.Thread(target=probe) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_dvc_probe_commits_a_throwaway_repository_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """``prepare_dvc`` (the warm process's) runs a real commit — a failure would only log, so it is
    called directly here — in a temporary directory, DVC's site cache included."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    site_cache = []
    from dvc.repo import Repo

    opened = Repo.__init__

    def recording(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        site_cache.append(self.site_cache_dir)

    monkeypatch.setattr(Repo, "__init__", recording)
    preload.prepare_dvc()
    assert site_cache and all(str(path).startswith(str(tmp_path)) for path in site_cache)
    assert list(tmp_path.iterdir()) == []
