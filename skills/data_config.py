"""data_config_generator: a dataset directory (or annotation file) → a Hydra config.

Formats: ImageFolder class directories (with or without train/val/test split folders),
COCO JSON, Pascal VOC XML, YOLO txt, CSV (and Parquet when pyarrow is installed). It counts
classes and samples per split, takes the splits it finds or proposes one (a seeded
fraction), samples image sizes and per-channel mean/std, and flags problems with exact
paths: empty classes, missing images, annotations pointing at absent files, corrupt
images, labels out of range. The `data:` config it writes passes config_validator.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.skills._base import SkillResult, Status, TypedSkill

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
FORMATS = ("auto", "imagefolder", "coco", "voc", "yolo", "csv", "parquet")
LABEL_COLUMNS = ("label", "labels", "target", "class", "y", "category")


@dataclass
class Scan:
    format: str
    root: Path
    classes: list[str] = field(default_factory=list)
    splits: dict[str, Counter[str]] = field(default_factory=dict)  # split → class → samples
    images: list[Path] = field(default_factory=list)  # every image referenced and present
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    split_source: str = "found"


def _images_in(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def detect(path: Path) -> str:
    if path.is_file():
        if path.suffix == ".json":
            return "coco"
        if path.suffix in (".csv", ".tsv"):
            return "csv"
        if path.suffix == ".parquet":
            return "parquet"
        if path.suffix in (".yaml", ".yml"):
            return "yolo"
        raise ValueError(f"cannot tell the format of {path}; give --format ({', '.join(FORMATS[1:])})")
    if (path / "Annotations").is_dir():
        return "voc"
    if (path / "labels").is_dir() or (path / "data.yaml").exists():
        return "yolo"
    if list(path.glob("annotations/*.json")) or list(path.glob("*.json")):
        return "coco"
    if list(path.glob("*.csv")):
        return "csv"
    if list(path.glob("*.parquet")):
        return "parquet"
    return "imagefolder"


# -- per format ----------------------------------------------------------------------------------
def scan_imagefolder(root: Path) -> Scan:
    s = Scan("imagefolder", root)
    split_dirs = [root / n for n in SPLIT_NAMES if (root / n).is_dir()]
    if not split_dirs:
        split_dirs, s.split_source = [root], "proposed"
    classes: set[str] = set()
    for sd in split_dirs:
        split = "all" if sd == root else sd.name
        counts: Counter[str] = Counter()
        for cls in sorted(p for p in sd.iterdir() if p.is_dir()):
            imgs = _images_in(cls)
            classes.add(cls.name)
            counts[cls.name] = len(imgs)
            s.images += imgs
            if not imgs:
                s.problems.append(f"empty class: {cls} has no images")
        s.splits[split] = counts
    s.classes = sorted(classes)
    for split, counts in s.splits.items():
        for name in s.classes:
            if name not in counts:
                s.problems.append(f"class {name!r} has no folder in split {split} ({root / split / name})")
    return s


def scan_coco(path: Path) -> Scan:
    files = [path] if path.is_file() else sorted({*path.glob("annotations/*.json"), *path.glob("*.json")})
    root = (
        path.parent.parent
        if path.is_file() and path.parent.name == "annotations"
        else (path.parent if path.is_file() else path)
    )
    s = Scan("coco", root)
    classes: dict[int, str] = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
            images, anns, cats = doc["images"], doc["annotations"], doc["categories"]
        except (ValueError, KeyError, TypeError) as exc:
            s.problems.append(f"not a COCO annotation file: {f} ({type(exc).__name__}: {exc})")
            continue
        split = next((n for n in SPLIT_NAMES if n in f.stem.lower()), f.stem)
        classes.update({int(c["id"]): str(c["name"]) for c in cats})
        by_id = {int(im["id"]): im for im in images}
        img_dir = next((d for d in (root / "images" / split, root / split, root / "images", root) if d.is_dir()), root)
        for im in images:
            p = img_dir / im["file_name"]
            if p.is_file():
                s.images.append(p)
            else:
                s.problems.append(f"missing image: {p} (image id {im['id']} in {f})")
        counts: Counter[str] = Counter()
        for a in anns:
            cid, iid = int(a["category_id"]), int(a["image_id"])
            if cid not in classes:
                s.problems.append(f"annotation {a.get('id')} in {f} has unknown category_id {cid}")
                continue
            if iid not in by_id:
                s.problems.append(f"annotation {a.get('id')} in {f} points at absent image id {iid}")
                continue
            counts[classes[cid]] += 1
            x, y, w, h = a.get("bbox", [0, 0, 0, 0])
            im = by_id[iid]
            if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > im.get("width", 1e9) or y + h > im.get("height", 1e9):
                s.problems.append(
                    f"annotation {a.get('id')} in {f}: bbox {[x, y, w, h]} outside image {im['file_name']}"
                )
        s.splits[split] = counts
        s.extra.setdefault("annotation_files", []).append(str(f))
    s.classes = [classes[k] for k in sorted(classes)]
    return s


def scan_voc(root: Path) -> Scan:
    s = Scan("voc", root)
    sets = root / "ImageSets" / "Main"
    split_ids: dict[str, list[str]] = {}
    for n in SPLIT_NAMES:
        if (sets / f"{n}.txt").is_file():
            split_ids[n] = (sets / f"{n}.txt").read_text().split()
    if not split_ids:
        split_ids = {"all": sorted(p.stem for p in (root / "Annotations").glob("*.xml"))}
        s.split_source = "proposed"
    classes: set[str] = set()
    for split, ids in split_ids.items():
        counts: Counter[str] = Counter()
        for i in ids:
            xml = root / "Annotations" / f"{i}.xml"
            try:
                tree = ET.parse(xml).getroot()
            except (ET.ParseError, OSError) as exc:
                s.problems.append(f"unreadable annotation: {xml} ({exc})")
                continue
            img = root / "JPEGImages" / (tree.findtext("filename") or f"{i}.jpg")
            if img.is_file():
                s.images.append(img)
            else:
                s.problems.append(f"missing image: {img} (referenced by {xml})")
            for obj in tree.iter("object"):
                name = (obj.findtext("name") or "").strip()
                classes.add(name)
                counts[name] += 1
        s.splits[split] = counts
    s.classes = sorted(classes)
    return s


def scan_yolo(path: Path) -> Scan:
    root = path.parent if path.is_file() else path
    s = Scan("yolo", root)
    names: list[str] = []
    spec = path if path.is_file() else root / "data.yaml"
    if spec.is_file():
        from omegaconf import OmegaConf

        doc = OmegaConf.to_container(OmegaConf.load(spec))
        assert isinstance(doc, dict)
        raw = doc.get("names", [])
        names = [str(raw[k]) for k in sorted(raw)] if isinstance(raw, dict) else [str(n) for n in raw]
    splits = [d.name for d in sorted((root / "labels").iterdir()) if d.is_dir()] if (root / "labels").is_dir() else []
    if not splits:
        splits, s.split_source = [""], "proposed"
    max_id = -1
    for split in splits:
        lab_dir, img_dir = root / "labels" / split, root / "images" / split
        imgs = {p.stem: p for p in _images_in(img_dir)} if img_dir.is_dir() else {}
        counts: Counter[str] = Counter()
        for lab in sorted(lab_dir.glob("*.txt")):
            img = imgs.pop(lab.stem, None)
            if img is None:
                s.problems.append(f"label without image: {lab} (no {img_dir / lab.stem}.*)")
            else:
                s.images.append(img)
            for n, line in enumerate(lab.read_text().splitlines(), 1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    cid, coords = int(parts[0]), [float(v) for v in parts[1:5]]
                except ValueError:
                    s.problems.append(f"{lab}:{n}: not 'class cx cy w h': {line!r}")
                    continue
                max_id = max(max_id, cid)
                if names and cid >= len(names):
                    s.problems.append(f"{lab}:{n}: class {cid} out of range (names has {len(names)})")
                if len(coords) != 4 or any(not 0.0 <= v <= 1.0 for v in coords):
                    s.problems.append(f"{lab}:{n}: box {coords} not normalised to [0, 1]")
                counts[names[cid] if 0 <= cid < len(names) else str(cid)] += 1
        for stem, img in sorted(imgs.items()):
            s.images.append(img)  # a background image (no objects) is valid YOLO
            del stem
        s.splits[split or "all"] = counts
    s.classes = names or [str(i) for i in range(max_id + 1)]
    return s


def _table_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("reading Parquet needs pyarrow: pip install pyarrow") from None
        table = pq.read_table(path)
        return list(table.column_names), table.to_pylist()
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t" if path.suffix == ".tsv" else ",")
        return list(reader.fieldnames or []), list(reader)


def scan_table(path: Path, fmt: str) -> Scan:
    files = [path] if path.is_file() else sorted(path.glob(f"*.{'csv' if fmt == 'csv' else 'parquet'}"))
    root = path.parent if path.is_file() else path
    s = Scan(fmt, root)
    for f in files:
        cols, rows = _table_rows(f)
        label = next((c for c in cols if c.lower() in LABEL_COLUMNS), cols[-1] if cols else None)
        if label is None:
            s.problems.append(f"no columns in {f}")
            continue
        split_col = next((c for c in cols if c.lower() == "split"), None)
        file_split = next((n for n in SPLIT_NAMES if n in f.stem.lower()), None)
        path_col = next((c for c in cols if c.lower() in ("path", "image", "file", "filename", "image_path")), None)
        s.extra.update(label_column=label, feature_columns=[c for c in cols if c not in (label, split_col, path_col)])
        for n, row in enumerate(rows, 2):
            value = row.get(label)
            if value in (None, ""):
                s.problems.append(f"{f}:{n}: empty {label!r}")
                continue
            split = str(row[split_col]) if split_col and row.get(split_col) else file_split or "all"
            s.splits.setdefault(split, Counter())[str(value)] += 1
            if path_col and row.get(path_col):
                p = root / str(row[path_col])
                if p.is_file():
                    s.images.append(p)
                else:
                    s.problems.append(f"{f}:{n}: {path_col} points at absent file {p}")
        if not split_col and not file_split:
            s.split_source = "proposed"
    s.classes = sorted({c for counts in s.splits.values() for c in counts})
    return s


# -- images ----------------------------------------------------------------------------------------
def image_stats(images: list[Path], sample: int, seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """Every image is opened and verified (corrupt → a problem); `sample` of them are decoded
    for sizes and per-channel mean/std."""
    try:
        from PIL import Image
    except ImportError:
        return {"note": "image statistics need Pillow: pip install pillow"}, []
    import numpy as np

    problems: list[str] = []
    good: list[Path] = []
    for p in images:
        try:
            with Image.open(p) as im:
                im.verify()
            good.append(p)
        except Exception as exc:
            problems.append(f"corrupt image: {p} ({type(exc).__name__}: {exc})")
    picked = random.Random(seed).sample(good, min(sample, len(good)))
    sizes: list[tuple[int, int]] = []
    modes: Counter[str] = Counter()
    total = np.zeros(3)
    total_sq = np.zeros(3)
    pixels = 0
    for p in picked:
        with Image.open(p) as im:
            modes[im.mode] += 1
            sizes.append((im.height, im.width))
            arr = np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255.0
        total += arr.sum(0)
        total_sq += (arr**2).sum(0)
        pixels += len(arr)
    if not pixels:
        return {}, problems
    mean = total / pixels
    std = np.sqrt(np.maximum(total_sq / pixels - mean**2, 0.0))
    hs, ws = [h for h, _ in sizes], [w for _, w in sizes]
    stats = {
        "sampled": len(picked),
        "image_size": [int(statistics.median(hs)), int(statistics.median(ws))],
        "min_size": [min(hs), min(ws)],
        "max_size": [max(hs), max(ws)],
        "modes": dict(modes),
        "mean": [round(float(v), 4) for v in mean],
        "std": [round(float(v), 4) for v in std],
    }
    return stats, problems


# -- the config -----------------------------------------------------------------------------------
def build_config(s: Scan, stats: dict[str, Any], val_fraction: float, seed: int) -> dict[str, Any]:
    splits = {k: {"samples": sum(v.values()), "per_class": dict(sorted(v.items()))} for k, v in s.splits.items()}
    data: dict[str, Any] = {
        "format": s.format,
        "root": str(s.root),
        "num_classes": len(s.classes),
        "classes": s.classes,
        "splits": splits,
        "split_source": s.split_source,
        "num_workers": 4,
    }
    if s.split_source == "proposed":
        data["val_fraction"] = val_fraction
        data["split_seed"] = seed
    for key in ("image_size", "mean", "std"):
        if key in stats:
            data[key] = stats[key]
    data.update({k: v for k, v in s.extra.items()})
    return {"data": data}


def to_yaml(cfg: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    return "# @package _global_\n# written by `slurmagent skill data_config_generator`\n" + OmegaConf.to_yaml(cfg)


@dataclass(frozen=True)
class DataConfigInput:
    path: Path | None = field(default=None, metadata={"help": "dataset directory or annotation/table file"})
    format: str = field(default="auto", metadata={"help": f"one of {', '.join(FORMATS)}"})
    sample: int = field(default=64, metadata={"help": "images decoded for sizes and mean/std"})
    val_fraction: float = field(default=0.1, metadata={"help": "validation share when no split is found"})
    seed: int = field(default=0, metadata={"help": "seed of the proposed split and the image sample"})
    output: Path | None = field(default=None, metadata={"help": "write the Hydra config (YAML) here"})


class DataConfigGenerator(TypedSkill[DataConfigInput]):
    name = "data_config_generator"
    description = (
        "dataset (ImageFolder, COCO, VOC, YOLO, CSV/Parquet) → Hydra data config with counts, splits, stats, problems"
    )
    Input = DataConfigInput
    positional = ("path",)

    def check(self, inp: DataConfigInput) -> SkillResult:
        if inp.path is None:
            return self.unknown("no dataset path given")
        if not inp.path.exists():
            return self.unknown(f"dataset path {inp.path} does not exist")
        if inp.format not in FORMATS:
            return self.unknown(f"format {inp.format!r} is not one of {', '.join(FORMATS)}")
        if not 0.0 < inp.val_fraction < 1.0:
            return self.unknown(f"val_fraction={inp.val_fraction} must be between 0 and 1")
        try:
            fmt = detect(inp.path) if inp.format == "auto" else inp.format
            if fmt == "imagefolder":
                s = scan_imagefolder(inp.path)
            elif fmt == "coco":
                s = scan_coco(inp.path)
            elif fmt == "voc":
                s = scan_voc(inp.path)
            elif fmt == "yolo":
                s = scan_yolo(inp.path)
            else:
                s = scan_table(inp.path, fmt)
        except (ValueError, OSError, KeyError) as exc:
            return self.unknown(f"cannot read {inp.path}: {exc}")
        stats, corrupt = image_stats(s.images, inp.sample, inp.seed) if s.images else ({}, [])
        s.problems += corrupt
        cfg = build_config(s, stats, inp.val_fraction, inp.seed)
        from slurmagent.skills.config_validator import check_keys, validator_data

        invalid = [i.message for i in check_keys(cfg, validator_data()["keys"]) if i.status == Status.CRITICAL]
        total = sum(sp["samples"] for sp in cfg["data"]["splits"].values())
        findings = {"config": cfg, "image_stats": stats, "problems": s.problems, "samples": total}
        if inp.output is not None and not invalid and total:
            from slurmagent.files import atomic_write

            inp.output.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(inp.output, to_yaml(cfg).encode())
            findings["written"] = str(inp.output)
        if invalid or not total:
            return SkillResult(
                self.name,
                Status.CRITICAL,
                [*invalid, *(["no samples found"] if not total else []), *s.problems],
                findings,
            )
        return SkillResult(self.name, Status.WARNING if s.problems else Status.OK, s.problems, findings)
