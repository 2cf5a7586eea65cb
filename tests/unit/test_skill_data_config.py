"""data_config_generator on datasets the tests build (real image files written with
Pillow, real annotation files in each format); every generated config passes config_validator."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from slurmagent.skills import Status
from slurmagent.skills.config_validator import check_keys, validator_data
from slurmagent.skills.data_config import DataConfigGenerator

RED, BLUE = (255, 0, 0), (0, 0, 255)


def img(path: Path, color: tuple[int, int, int] = RED, size: tuple[int, int] = (8, 6)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def generate(path: Path, out: Path | None = None, **kw: object) -> tuple[Status, dict, list[str]]:  # type: ignore[type-arg]
    res = DataConfigGenerator().run(path=path, output=out, **kw)
    assert res.status != Status.UNKNOWN, res.reasons
    cfg = res.findings["config"]
    errors = [i for i in check_keys(cfg, validator_data()["keys"]) if i.status == Status.CRITICAL]
    assert errors == []  # the output passes config_validator
    return res.status, cfg["data"], res.reasons


def test_imagefolder_counts_stats_and_problems_with_paths(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    for i in range(3):
        img(root / "train" / "cat" / f"{i}.png", RED)
        img(root / "train" / "dog" / f"{i}.png", BLUE, size=(10, 6))  # PNG: lossless, exact colours
    img(root / "val" / "cat" / "0.png", RED)
    (root / "train" / "bird").mkdir()
    (root / "val" / "dog").mkdir()
    (root / "val" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    out = tmp_path / "conf" / "pets.yaml"
    status, data, problems = generate(root, out)
    assert status == Status.WARNING
    assert data["classes"] == ["bird", "cat", "dog"] and data["num_classes"] == 3
    assert data["splits"]["train"] == {"samples": 6, "per_class": {"bird": 0, "cat": 3, "dog": 3}}
    assert data["splits"]["val"]["per_class"] == {"cat": 1, "dog": 1}
    assert data["split_source"] == "found" and data["image_size"] == [6, 8]
    # 4 red 8x6 images and 3 blue 10x6 ones (the corrupt one is not sampled)
    px_red, px_blue = 4 * 48, 3 * 60
    r = px_red / (px_red + px_blue)
    assert data["mean"] == pytest.approx([r, 0.0, 1 - r], abs=1e-4)
    assert data["std"] == pytest.approx([np.sqrt(r * (1 - r)), 0.0, np.sqrt(r * (1 - r))], abs=1e-4)
    assert f"empty class: {root / 'train' / 'bird'} has no images" in problems
    assert f"class 'bird' has no folder in split val ({root / 'val' / 'bird'})" in problems
    assert any(p.startswith(f"corrupt image: {root / 'val' / 'dog' / 'broken.png'}") for p in problems)
    written = OmegaConf.to_container(OmegaConf.load(out))
    assert written == {"data": data} and out.read_text().startswith("# @package _global_")


def test_flat_imagefolder_gets_a_proposed_split(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        for i in range(2):
            img(tmp_path / cls / f"{i}.png")
    status, data, _ = generate(tmp_path, val_fraction=0.25, seed=3)
    assert status == Status.OK and data["split_source"] == "proposed"
    assert data["val_fraction"] == 0.25 and data["split_seed"] == 3 and data["splits"]["all"]["samples"] == 4


def test_coco_missing_images_and_dangling_annotations(tmp_path: Path) -> None:
    img(tmp_path / "images" / "train" / "1.jpg", size=(20, 10))
    img(tmp_path / "images" / "train" / "2.jpg", size=(20, 10))
    doc = {
        "images": [
            {"id": 1, "file_name": "1.jpg", "width": 20, "height": 10},
            {"id": 2, "file_name": "2.jpg", "width": 20, "height": 10},
            {"id": 3, "file_name": "3.jpg", "width": 20, "height": 10},
        ],
        "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "car"}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]},
            {"id": 11, "image_id": 2, "category_id": 2, "bbox": [0, 0, 19, 9]},
            {"id": 12, "image_id": 2, "category_id": 2, "bbox": [15, 0, 10, 5]},
            {"id": 13, "image_id": 9, "category_id": 1, "bbox": [1, 1, 2, 2]},
            {"id": 14, "image_id": 1, "category_id": 7, "bbox": [1, 1, 2, 2]},
        ],
    }
    ann = tmp_path / "annotations" / "instances_train.json"
    ann.parent.mkdir()
    ann.write_text(json.dumps(doc))
    status, data, problems = generate(tmp_path)
    assert status == Status.WARNING and data["format"] == "coco" and data["classes"] == ["person", "car"]
    assert data["splits"]["train"]["per_class"] == {"car": 2, "person": 1}
    assert problems == [
        f"missing image: {tmp_path / 'images' / 'train' / '3.jpg'} (image id 3 in {ann})",
        f"annotation 12 in {ann}: bbox [15, 0, 10, 5] outside image 2.jpg",
        f"annotation 13 in {ann} points at absent image id 9",
        f"annotation 14 in {ann} has unknown category_id 7",
    ]


def test_voc_splits_and_missing_jpeg(tmp_path: Path) -> None:
    for i, (name, present) in enumerate([("dog", True), ("cat", True), ("dog", False)]):
        xml = f"<annotation><filename>{i}.jpg</filename><object><name>{name}</name></object></annotation>"
        (tmp_path / "Annotations").mkdir(exist_ok=True)
        (tmp_path / "Annotations" / f"{i}.xml").write_text(xml)
        if present:
            img(tmp_path / "JPEGImages" / f"{i}.jpg")
    (tmp_path / "ImageSets" / "Main").mkdir(parents=True)
    (tmp_path / "ImageSets" / "Main" / "train.txt").write_text("0\n1\n")
    (tmp_path / "ImageSets" / "Main" / "val.txt").write_text("2\n")
    status, data, problems = generate(tmp_path)
    assert data["format"] == "voc" and data["classes"] == ["cat", "dog"]
    assert data["splits"]["train"]["per_class"] == {"cat": 1, "dog": 1} and data["splits"]["val"]["samples"] == 1
    assert status == Status.WARNING and problems == [
        f"missing image: {tmp_path / 'JPEGImages' / '2.jpg'} (referenced by {tmp_path / 'Annotations' / '2.xml'})"
    ]


def test_yolo_labels_without_images_and_bad_rows(tmp_path: Path) -> None:
    (tmp_path / "data.yaml").write_text("names: [ball, bat]\ntrain: images/train\nval: images/val\n")
    for split in ("train", "val"):
        (tmp_path / "labels" / split).mkdir(parents=True)
    img(tmp_path / "images" / "train" / "a.jpg")
    (tmp_path / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n1 0.1 0.1 0.1 0.1\n")
    (tmp_path / "labels" / "train" / "b.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    img(tmp_path / "images" / "val" / "c.jpg")
    (tmp_path / "labels" / "val" / "c.txt").write_text("1 0.5 1.5 0.2 0.2\n")
    status, data, problems = generate(tmp_path)
    assert data["format"] == "yolo" and data["classes"] == ["ball", "bat"]
    assert data["splits"]["train"]["per_class"] == {"5": 1, "ball": 1, "bat": 1}
    assert status == Status.WARNING and problems == [
        f"label without image: {tmp_path / 'labels' / 'train' / 'b.txt'} (no {tmp_path / 'images' / 'train' / 'b'}.*)",
        f"{tmp_path / 'labels' / 'train' / 'b.txt'}:1: class 5 out of range (names has 2)",
        f"{tmp_path / 'labels' / 'val' / 'c.txt'}:1: box [0.5, 1.5, 0.2, 0.2] not normalised to [0, 1]",
    ]


def test_csv_table_label_column_and_empty_labels(tmp_path: Path) -> None:
    table = tmp_path / "train.csv"
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["x1", "x2", "label"])
        w.writerows([[1, 2, "a"], [3, 4, "b"], [5, 6, "a"], [7, 8, ""]])
    status, data, problems = generate(table)
    assert data["format"] == "csv" and data["label_column"] == "label" and data["feature_columns"] == ["x1", "x2"]
    assert data["splits"]["train"]["per_class"] == {"a": 2, "b": 1}
    assert status == Status.WARNING and problems == [f"{table}:5: empty 'label'"]


def test_parquet_tables_split_column_and_empty_labels(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = tmp_path / "tables"
    data_dir.mkdir()
    rows = {"x": [1.0, 2.0, 3.0, 4.0, 5.0], "split": ["train", "train", "train", "val", "val"]}
    pq.write_table(pa.table({**rows, "target": ["a", "b", "a", "b", None]}), data_dir / "part-0.parquet")
    status, data, problems = generate(data_dir)
    assert data["format"] == "parquet" and data["label_column"] == "target" and data["feature_columns"] == ["x"]
    assert data["classes"] == ["a", "b"]
    assert data["splits"]["train"]["per_class"] == {"a": 2, "b": 1} and data["splits"]["val"]["per_class"] == {"b": 1}
    assert status == Status.WARNING and problems == [f"{data_dir / 'part-0.parquet'}:6: empty 'target'"]


def test_empty_directory_is_critical(tmp_path: Path) -> None:
    res = DataConfigGenerator().run(path=tmp_path)
    assert res.status == Status.CRITICAL and "no samples found" in res.reasons
