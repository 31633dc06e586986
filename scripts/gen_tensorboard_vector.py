#!/usr/bin/env python3
"""Regenerates tests/data/tensorboard/: the event file our writer made (left in the build tree
by test_report's TensorBoard.WriterBytesEqualTheCommittedVector) and expected.json, what
Python's `tensorboard` package reads back from it.

    pip install tensorboard
    ctest --test-dir build -R TensorBoard        # writes build/tensorboard_vector/...
    python3 scripts/gen_tensorboard_vector.py build/tensorboard_vector/events.out.tfevents.vector
"""
import json
import shutil
import sys
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

out_dir = Path(__file__).resolve().parent.parent / "tests" / "data" / "tensorboard"
src = Path(sys.argv[1])
dst = out_dir / "events.out.tfevents.vector"
out_dir.mkdir(parents=True, exist_ok=True)
shutil.copyfile(src, dst)

# The raw loader: checks the framing CRCs and parses every Event.
events = list(EventFileLoader(str(dst)).Load())
file_version = events[0].file_version

# The accumulator is what TensorBoard's scalar dashboard reads.
acc = event_accumulator.EventAccumulator(str(dst), size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
scalars = {}
for tag in sorted(acc.Tags()["scalars"]):
    scalars[tag] = [{"wall_time": s.wall_time, "step": s.step, "value": s.value}
                    for s in acc.Scalars(tag)]

import tensorboard
expected = {"made_by": "tensorboard " + tensorboard.__version__ + " EventAccumulator",
            "file_version": file_version, "events": len(events), "scalars": scalars}
(out_dir / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
print(f"wrote {dst} and {out_dir / 'expected.json'}: {len(events)} events, {len(scalars)} tags")
