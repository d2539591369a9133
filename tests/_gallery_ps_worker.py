"""The gallery (tests/gallery.py) under parameter servers, in one local in-process cluster.

Usage: python tests/_gallery_ps_worker.py OUT_JSON
Writes {example: {"loss": [...]} or {"error": message, "type": class name}}.
"""

import json
import os
import sys
import tempfile


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gallery
    import kerastrain as kt

    ps = {"name": "ps", "num_workers": 1, "num_ps": 1, "network": "host"}
    report = {}
    for example in gallery.EXAMPLES:
        with tempfile.TemporaryDirectory() as directory:
            try:
                trainer = kt.Trainer(example.build, strategy=ps, verbose=0, seed=0,
                                     **example.trainer_kwargs)
                history = trainer.fit(epochs=example.epochs, **example.fit_args(directory))
                report[example.name] = {
                    "loss": [float(v) for v in history.history[example.ps_key]]}
            except Exception as e:  # noqa: BLE001 (reported, judged by the test)
                report[example.name] = {"error": str(e)[:2000], "type": type(e).__name__}
        print(example.name, report[example.name], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
