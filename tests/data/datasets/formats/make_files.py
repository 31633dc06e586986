# Writes tests/data/datasets/formats/alpaca.parquet and alpaca.csv: the records of alpaca.jsonl
# in the formats `--data` refuses (with a conversion hint), so that the tests see real files.
# Run: pip install pyarrow && python3 tests/data/datasets/formats/make_files.py
import csv, json, pathlib
import pyarrow as pa, pyarrow.parquet as pq

d = pathlib.Path(__file__).resolve().parent
rows = [json.loads(l) for l in (d / "alpaca.jsonl").read_text().splitlines() if l.strip()]
keys = ["instruction", "input", "output"]
table = pa.table({k: [r.get(k, "") for r in rows] for k in keys})
pq.write_table(table, d / "alpaca.parquet")
with open(d / "alpaca.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(keys)
    for r in rows:
        w.writerow([r.get(k, "") for k in keys])
